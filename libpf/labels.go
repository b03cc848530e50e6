package libpf

import (
	"encoding/binary"
	"iter"
	"slices"
	"strings"
)

// Label is one key/value label of a sample: a goroutine's pprof label.
type Label struct{ Key, Value string }

// Labels are a sample's labels, sorted by key, each key once. The zero
// value has none. Labels are comparable: samples with equal labels count
// together.
type Labels struct {
	// enc holds each label as uvarint(len(key)) key uvarint(len(value))
	// value, in key order.
	enc string
}

// MakeLabels makes Labels of ls (reordered in place); of two labels with
// one key, the later one is kept, as runtime/pprof's WithLabels does.
func MakeLabels(ls []Label) Labels {
	if len(ls) == 0 {
		return Labels{}
	}
	slices.SortStableFunc(ls, func(a, b Label) int { return strings.Compare(a.Key, b.Key) })
	var b []byte
	for i, l := range ls {
		if i+1 < len(ls) && ls[i+1].Key == l.Key {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(l.Key)))
		b = append(b, l.Key...)
		b = binary.AppendUvarint(b, uint64(len(l.Value)))
		b = append(b, l.Value...)
	}
	return Labels{enc: string(b)}
}

// IsZero says whether there are no labels.
func (l Labels) IsZero() bool { return l.enc == "" }

// All yields the labels in key order.
func (l Labels) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for s := l.enc; s != ""; {
			var key, value string
			key, s = nextString(s)
			value, s = nextString(s)
			if !yield(key, value) {
				return
			}
		}
	}
}

// Get is the value of key, false when there is none.
func (l Labels) Get(key string) (string, bool) {
	for k, v := range l.All() {
		if k == key {
			return v, true
		}
	}
	return "", false
}

// Size is the bytes the labels take, for memory estimates.
func (l Labels) Size() int { return len(l.enc) }

// Compare orders Labels (for sorting; not by meaning).
func (l Labels) Compare(o Labels) int { return strings.Compare(l.enc, o.enc) }

// String is "k=v,k=v" in key order.
func (l Labels) String() string {
	var sb strings.Builder
	for k, v := range l.All() {
		if sb.Len() > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(k)
		sb.WriteByte('=')
		sb.WriteString(v)
	}
	return sb.String()
}

// nextString splits a length-prefixed string off s (written by
// MakeLabels: never malformed).
func nextString(s string) (string, string) {
	n, w := binary.Uvarint([]byte(s[:min(len(s), binary.MaxVarintLen64)]))
	s = s[w:]
	return s[:n], s[n:]
}
