package libpf

import (
	"maps"
	"testing"
)

func TestLabels(t *testing.T) {
	l := MakeLabels([]Label{{"tenant", "b"}, {"endpoint", "/x"}, {"tenant", "a"}, {"", ""}})
	want := map[string]string{"": "", "endpoint": "/x", "tenant": "a"}
	if got := maps.Collect(l.All()); !maps.Equal(got, want) {
		t.Errorf("All = %v, want %v", got, want)
	}
	if v, ok := l.Get("endpoint"); !ok || v != "/x" {
		t.Errorf("Get(endpoint) = %q, %v", v, ok)
	}
	if _, ok := l.Get("nope"); ok {
		t.Error("Get(nope) found a value")
	}
	if s := l.String(); s != "=,endpoint=/x,tenant=a" {
		t.Errorf("String = %q", s)
	}
	same := MakeLabels([]Label{{"endpoint", "/x"}, {"tenant", "a"}, {"", ""}})
	if l != same {
		t.Error("equal label sets in another order are not equal Labels")
	}
	if !MakeLabels(nil).IsZero() || l.IsZero() {
		t.Error("IsZero is wrong")
	}
}
