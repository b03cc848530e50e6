package reporter

import (
	"slices"
	"strings"
)

// What a flame graph's first level can split the samples by
// (FlameQuery.GroupBy); without one it is the executable.
const (
	GroupByContainer = "container"
	GroupByPod       = "pod"
	GroupByNamespace = "namespace"
	GroupByService   = "service"
	GroupByThread    = "thread"
	// GroupByLabelPrefix + a label's key groups by that label's value.
	GroupByLabelPrefix = "label:"
)

// ValidGroupBy says whether FlameQuery.GroupBy can take g.
func ValidGroupBy(g string) bool {
	switch {
	case g == "", g == GroupByContainer, g == GroupByPod, g == GroupByNamespace, g == GroupByService,
		g == GroupByThread:
		return true
	case strings.HasPrefix(g, GroupByLabelPrefix):
		return len(g) > len(GroupByLabelPrefix)
	}
	return false
}

// groupName is the name of the group of a sample with meta m.
func groupName(by string, m *histMeta) string {
	switch by {
	case GroupByContainer:
		switch {
		case m.container == "":
			return "no container"
		case m.containerName != "":
			return "container " + m.containerName + " (" + m.container[:min(len(m.container), 12)] + ")"
		}
		return "container " + m.container
	case GroupByPod:
		if m.pod == "" {
			return "no pod"
		}
		return "pod " + m.pod
	case GroupByService:
		if m.service == "" {
			return "no service"
		}
		return "service " + m.service
	case GroupByNamespace:
		if m.namespace == "" {
			return "no namespace"
		}
		return "namespace " + m.namespace
	case GroupByThread:
		return "thread " + m.thread
	}
	key := strings.TrimPrefix(by, GroupByLabelPrefix)
	if v, ok := m.labels.Get(key); ok {
		return key + "=" + v
	}
	return key + " unset"
}

// grouped is a view of the tables whose call tree has a node per group
// under the root, each over the original tree's paths of its samples
// (executable first), with the self counts per node of each of counts
// (per series, as seriesCounts gives them; nil ones stay nil). Only the
// paths of series with samples are copied, so a query costs what it
// selects, not the whole tree.
func (t *histTables) grouped(by string, counts ...[]uint64) (*histTables, [][]uint64) {
	g := &histTables{tree: []treeNode{{fn: noFunc}}, funcs: slices.Clip(t.funcs), funcID: slices.Clip(t.funcID)}
	groups := map[string]uint32{}
	derived := map[[2]uint32]uint32{} // (group node, original node) -> node
	var derive func(group, orig uint32) uint32
	derive = func(group, orig uint32) uint32 {
		if orig == 0 {
			return group
		}
		key := [2]uint32{group, orig}
		if n, ok := derived[key]; ok {
			return n
		}
		o := &t.tree[orig]
		n := g.addChild(derive(group, o.parent), o.fn, o.line)
		derived[key] = n
		return n
	}
	selfs := make([][]uint64, len(counts))
	nodeOf := make([]uint32, len(t.series))
	for i := range t.series {
		used := false
		for _, c := range counts {
			used = used || (c != nil && c[i] > 0)
		}
		if !used {
			continue
		}
		sr := &t.series[i]
		name := groupName(by, &t.metas[sr.meta])
		group, ok := groups[name]
		if !ok {
			f := histFunc{kind: KindGroup, name: name}
			g.funcs = append(g.funcs, f)
			g.funcID = append(g.funcID, f.id())
			group = g.addChild(0, uint32(len(g.funcs)-1), 0)
			groups[name] = group
		}
		nodeOf[i] = derive(group, sr.node)
	}
	for k, c := range counts {
		if c == nil {
			continue
		}
		selfs[k] = make([]uint64, len(g.tree))
		for i, n := range c {
			if n > 0 {
				selfs[k][nodeOf[i]] += n
			}
		}
	}
	return g, selfs
}

// addChild appends a node under parent (a derived tree's: no two
// children share a function, as derive adds each once).
func (t *histTables) addChild(parent, fn, line uint32) uint32 {
	n := uint32(len(t.tree))
	t.tree = append(t.tree, treeNode{parent: parent, fn: fn, line: line, next: t.tree[parent].child})
	t.tree[parent].child = n
	return n
}
