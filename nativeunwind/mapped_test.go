package nativeunwind

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWithMappedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	want := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 16 pages
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	t.Run("in place", func(t *testing.T) {
		err := WithMappedFile(f, func(mapped []byte) error {
			if !bytes.Equal(mapped, want) {
				t.Errorf("mapped %d bytes, not the file's %d", len(mapped), len(want))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("not a file", func(t *testing.T) {
		err := WithMappedFile(bytes.NewReader(want), func(mapped []byte) error {
			if mapped != nil {
				t.Error("a bytes.Reader was mapped")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("truncated while mapped", func(t *testing.T) {
		err := WithMappedFile(f, func(mapped []byte) error {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			var sum byte
			for _, b := range mapped[len(mapped)-4096:] {
				sum += b
			}
			t.Errorf("read %d bytes past the end of a truncated file (sum %d)", 4096, sum)
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "changed while it was read") {
			t.Fatalf("got %v, want the fault as an error", err)
		}
	})
}
