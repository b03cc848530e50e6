package v8

import "testing"

// fakeCode is code at address 0 for atReturn.
type fakeCode []byte

func (c fakeCode) U8(a uint64) (uint8, error) { return c[a], nil }
func (c fakeCode) U32(a uint64) (uint32, error) {
	return uint32(c[a]) | uint32(c[a+1])<<8 | uint32(c[a+2])<<16 | uint32(c[a+3])<<24, nil
}

// TestAtReturn: return instructions of both architectures, as V8's code
// holds them, and others.
func TestAtReturn(t *testing.T) {
	for _, c := range []struct {
		arch string
		code fakeCode
		want bool
	}{
		{"amd64", fakeCode{0xc3}, true},
		{"amd64", fakeCode{0xc2, 0x08, 0x00}, true},
		{"amd64", fakeCode{0x55}, false},                   // push rbp
		{"arm64", fakeCode{0xc0, 0x03, 0x5f, 0xd6}, true},  // ret
		{"arm64", fakeCode{0xff, 0x0f, 0x5f, 0xd6}, true},  // retab
		{"arm64", fakeCode{0xfd, 0x7b, 0xbf, 0xa9}, false}, // stp x29, x30, [sp, #-16]!
		{"riscv64", fakeCode{0x67, 0x80, 0x00, 0x00}, false},
	} {
		if got := atReturn(c.arch, c.code, 0); got != c.want {
			t.Errorf("%s % x: %v, want %v", c.arch, []byte(c.code), got, c.want)
		}
	}
}
