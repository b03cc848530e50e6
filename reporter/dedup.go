package reporter

// orderedSet assigns dense int32 indices to distinct keys in insertion order,
// which is what every OTLP dictionary table needs: the index is the reference,
// and index 0 is pre-seeded with the table's zero element so that a reference
// of 0 means "unset" and no real entry can ever collide with it.
type orderedSet[K comparable, V any] struct {
	index  map[K]int32
	values []V
}

func newOrderedSet[K comparable, V any](zeroKey K, zero V) *orderedSet[K, V] {
	return &orderedSet[K, V]{
		index:  map[K]int32{zeroKey: 0},
		values: []V{zero},
	}
}

// add returns the index of key, calling mk to build the entry only when the
// key is new, so lookups of existing entries allocate nothing.
func (s *orderedSet[K, V]) add(key K, mk func() V) int32 {
	if i, ok := s.index[key]; ok {
		return i
	}
	i := int32(len(s.values))
	s.index[key] = i
	s.values = append(s.values, mk())
	return i
}

func (s *orderedSet[K, V]) len() int { return len(s.values) }
