package dwarftest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// layoutSource has what Member walks through: a typedef'd and qualified
// struct, an anonymous union and a nested struct.
const layoutSource = `
struct inner { char pad[3]; int x; };
typedef const struct inner inner_t;
struct outer {
	long head;
	union { int a; inner_t in; };
	struct { short s; inner_t nested; } named;
};
struct outer v;
`

func TestOffset(t *testing.T) {
	dir := t.TempDir()
	src, obj := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout.o")
	if err := os.WriteFile(src, []byte(layoutSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-g", "-c", "-o", obj, src).CombinedOutput(); err != nil {
		t.Skipf("gcc: %v: %s", err, out)
	}
	structs, err := Load(obj)
	if err != nil {
		t.Fatal(err)
	}
	if !structs.Has("inner") || structs.Has("inner_t") {
		t.Error("Has: want the struct, not its typedef")
	}
	for _, tt := range []struct {
		name, path string
		want       uint64
		wantErr    bool
	}{
		{"outer", "sizeof", 32, false},
		{"outer", "head", 0, false},
		{"outer", "a", 8, false},
		{"outer", "in.x", 12, false},
		{"outer", "named.nested.x", 24, false},
		{"outer", "named.missing", 0, true},
		{"outer", "head.x", 0, true},
		{"missing", "x", 0, true},
	} {
		got, err := structs.Offset(tt.name, tt.path)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("Offset(%s, %s) = %d, %v; want %d, error %v", tt.name, tt.path, got, err, tt.want, tt.wantErr)
		}
	}
}
