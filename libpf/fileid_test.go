package libpf

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileIDFromExecutable checks the file id against sha256sum over the
// same bytes assembled by the shell: head, tail and the big-endian length
// written by printf with octal escapes.
func TestFileIDFromExecutable(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("sha256sum not installed")
	}
	for _, size := range []int{0, 1, 100, 4095, 4096, 4097, 6000, 8191, 8192, 8193, 20000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i*7 + i/251)
			}
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			var length strings.Builder
			for i := 7; i >= 0; i-- {
				fmt.Fprintf(&length, `\%03o`, byte(uint64(size)>>(8*i)))
			}
			script := fmt.Sprintf(`(head -c 4096 "$1"; tail -c 4096 "$1"; printf '%s') | sha256sum`, length.String())
			out, err := exec.Command("sh", "-c", script, "sh", path).Output()
			if err != nil {
				t.Fatal(err)
			}
			want := string(out[:32])

			got, err := FileIDFromExecutable(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != want {
				t.Errorf("FileIDFromExecutable = %s, sha256sum says %s", got, want)
			}
		})
	}
}

// TestFileIDFromKernelBuildID checks against FNV-1a 128 computed by a
// python3 one-liner (offset 0x6c62272e07bb014262b821756295c58d, prime
// 0x0000000001000000000000000000013B, h = ((h ^ byte) * prime) mod 2^128
// over the ASCII hex build id).
func TestFileIDFromKernelBuildID(t *testing.T) {
	tests := []struct{ buildID, want string }{
		{"", "6c62272e07bb014262b821756295c58d"},
		{"abf9ec0ec5946600c90641cf5db998472fac410b", "d61506025552944fe1c42d7e12407d7c"},
		{"0123456789abcdef0123456789abcdef01234567", "f6cf2d06749cb9374148c3a96ca80ac5"},
	}
	for _, tt := range tests {
		if got := FileIDFromKernelBuildID(tt.buildID).String(); got != tt.want {
			t.Errorf("FileIDFromKernelBuildID(%q) = %s, want %s", tt.buildID, got, tt.want)
		}
	}
}
