package beam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

// TestSymbolizeImage names addresses of a built image of each release's
// layout: names (Erlang quoting, Elixir spelling), files and lines of
// both location sizes, a function without lines, and addresses in no
// function.
func TestSymbolizeImage(t *testing.T) {
	type want struct {
		name string
		file string
		line uint32
		err  error
	}
	cases := []struct {
		fn   string
		off  uint64
		ret  bool
		want want
	}{
		{"lists:map", 0, false, want{name: "lists:map/2"}}, // before its first line item
		{"lists:map", 0x40, false, want{name: "lists:map/2", file: "inc/é.hrl", line: 7}},
		{"lists:map", 0x40, true, want{name: "lists:map/2"}}, // the call ends before 0x40
		{"lists:map", 0x41, true, want{name: "lists:map/2", file: "inc/é.hrl", line: 7}},
		{"lists:map", 0xff, false, want{name: "lists:map/2", file: "lists.erl", line: 42}},
		{"lists:-map/2-fun-0-", 0x30, false, want{name: "lists:'-map/2-fun-0-'/1", file: "lists.erl", line: 43}},
		{"lists:-map/2-fun-0-", 0, true, want{name: "lists:map/2", file: "lists.erl", line: 42}},
		{"Elixir.Foo.Bar:baz?", 0x3f, false, want{name: "Foo.Bar.baz?/0", file: "lib/foo/bar.ex", line: 10}},
		{"Elixir.Foo.Bar:baz?", 0x40, false, want{name: "Foo.Bar.baz?/0"}}, // location 0: no line
		{"nolines:f", 0x3f, false, want{name: "nolines:f/3"}},
		{"nolines:f", 0x40, false, want{err: errNoFunction}}, // the module's footer
		{"lists:map", 0, true, want{err: errNoFunction}},     // the code header
	}
	for _, otp := range []int{27, 29} {
		p := buildImage(otp, sampleModules)
		s := newSymbolizer(p.mem, p.tables, otp)
		for _, c := range cases {
			for round := range 2 { // uncached, then cached
				f, err := s.frame(p.addr(c.fn, c.off), c.ret)
				if c.want.err != nil {
					if !errors.Is(err, c.want.err) {
						t.Errorf("OTP %d %s+%#x (return address %v): %v, want %v", otp, c.fn, c.off, c.ret, err, c.want.err)
					}
					continue
				}
				got := want{f.FunctionName, f.SourceFile, f.SourceLine, err}
				if got != c.want {
					t.Errorf("OTP %d %s+%#x (return address %v, round %d): %+v, want %+v", otp, c.fn, c.off, c.ret, round, got, c.want)
				}
			}
		}
		if st := s.Stats(); st.Hits == 0 || st.Stale != 0 {
			t.Errorf("OTP %d: cache %+v, want hits and nothing stale", otp, st)
		}
	}
}

// TestSymbolizeReload checks that a cached frame is dropped when its
// function's memory holds another function (a module purged, its memory
// reused), and the address named anew.
func TestSymbolizeReload(t *testing.T) {
	p := buildImage(29, sampleModules)
	s := newSymbolizer(p.mem, p.tables, 29)
	pc := p.addr("lists:map", 0x80)
	if f, err := s.frame(pc, false); err != nil || f.FunctionName != "lists:map/2" {
		t.Fatalf("%+v, %v", f, err)
	}
	// The function's ErtsCodeInfo now holds nolines:f/3's MFA.
	copy(p.mem.b[p.mfa["lists:map"]-p.mem.base:], p.mem.b[p.mfa["nolines:f"]-p.mem.base:][:mfaSize])
	if f, err := s.frame(pc, false); err != nil || f.FunctionName != "nolines:f/3" {
		t.Fatalf("after the reload: %+v, %v", f, err)
	}
	if st := s.Stats(); st.Stale != 1 {
		t.Errorf("cache %+v, want one stale entry", st)
	}
	// A module whose header changed (here: its line table gone) is read
	// anew, not named from its cached line table.
	pc = p.addr("lists:-map/2-fun-0-", 0x30)
	if f, err := s.frame(pc, false); err != nil || f.SourceFile != "lists.erl" || f.SourceLine != 43 {
		t.Fatalf("%+v, %v", f, err)
	}
	p.mem.put64(p.headers["lists"]+headerLineTable, 0)
	if f, err := s.frame(pc+1, false); err != nil || f.FunctionName != "lists:'-map/2-fun-0-'/1" || f.SourceFile != "" || f.SourceLine != 0 {
		t.Fatalf("after the line table's removal: %+v, %v", f, err)
	}
	if st := s.modules.Stats(); st.Stale != 1 {
		t.Errorf("module cache %+v, want one stale entry", st)
	}
}

// countingReader counts reads and fails them after a budget, so that a
// parser looping on hostile memory fails the fuzz test instead of
// hanging it.
type countingReader struct {
	m     *image
	reads int
}

const fuzzReadBudget = 1 << 20

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads++
	if len(p) > 1<<20 {
		panic("unbounded read")
	}
	return c.m.ReadAt(p, off)
}

// FuzzSymbolize symbolizes addresses in a mutated process image: whatever
// memory holds, frame returns a frame or an error, with a bounded number
// of reads of bounded size.
func FuzzSymbolize(f *testing.F) {
	for _, otp := range []int{27, 29} {
		p := buildImage(otp, sampleModules)
		hdr := make([]byte, 24)
		binary.LittleEndian.PutUint64(hdr, p.tables.Ranges)
		binary.LittleEndian.PutUint64(hdr[8:], p.tables.ActiveCodeIndex)
		for _, fn := range []string{"lists:map", "Elixir.Foo.Bar:baz?", "nolines:f"} {
			binary.LittleEndian.PutUint64(hdr[16:], p.addr(fn, 0x3f))
			f.Add(otp == 27, append(append([]byte(nil), hdr...), p.mem.b...))
		}
	}
	f.Fuzz(func(t *testing.T, otp27 bool, data []byte) {
		if len(data) < 24 {
			return
		}
		tables := Tables{Ranges: binary.LittleEndian.Uint64(data), ActiveCodeIndex: binary.LittleEndian.Uint64(data[8:])}
		pc := binary.LittleEndian.Uint64(data[16:])
		otp := 29
		if otp27 {
			otp = 27
		}
		r := &countingReader{m: &image{base: imageBase, b: data[24:]}}
		s := newSymbolizer(r, tables, otp)
		for _, ret := range []bool{false, true, false} {
			if fr, err := s.frame(pc, ret); err == nil && fr.FunctionName == "" {
				t.Fatalf("no name and no error at %#x", pc)
			}
		}
		if r.reads > fuzzReadBudget {
			t.Fatalf("%d reads", r.reads)
		}
	})
}

// TestSymbolizeConcurrent symbolizes from several goroutines at once, the
// first lookups racing to find the atom table (go test -race).
func TestSymbolizeConcurrent(t *testing.T) {
	p := buildImage(27, sampleModules)
	s := newSymbolizer(p.mem, p.tables, 27)
	pcs := []uint64{p.addr("lists:map", 0x80), p.addr("Elixir.Foo.Bar:baz?", 0x30), p.addr("nolines:f", 0)}
	want := []string{"lists:map/2", "Foo.Bar.baz?/0", "nolines:f/3"}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 300 {
				k := (g + i) % len(pcs)
				f, err := s.frame(pcs[k], false)
				if err == nil && f.FunctionName != want[k] {
					err = fmt.Errorf("%#x named %q, want %q", pcs[k], f.FunctionName, want[k])
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
