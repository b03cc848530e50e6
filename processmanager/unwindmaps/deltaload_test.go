package unwindmaps

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/nativeunwind"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps/unwindmapstest"
	"github.com/hostprof/ebpf-profiler/support"
)

// acquireWith takes a reference on a file as Sync does: loading it
// with extract if it is not loaded and did not fail lately.
func acquireWith(l *deltaLoader, fileID uint64, extract func() (nativeunwind.Deltas, error)) error {
	if l.acquire(fileID) {
		return nil
	}
	if err := l.failure(fileID); err != nil {
		return err
	}
	d, err := extract()
	if err := l.load(fileID, seqOf(d), err); err != nil {
		return err
	}
	l.acquire(fileID)
	return nil
}

func TestDeltaLoaderRefcounts(t *testing.T) {
	maps := unwindmapstest.NewMaps()
	l := newDeltaLoader(maps, support.DeltaCapacity{Rules: 16, Deltas: 64, PageBits: 12})
	sp8 := nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8, RAOffset: -8}
	sp32 := nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 32, RAOffset: -8, FPOffset: -16}
	deltas := nativeunwind.Deltas{{Address: 0x1000, Rule: sp8}, {Address: 0x1004, Rule: sp32},
		{Address: 0x2100, Rule: sp8}, {Address: 0x2200, Rule: nativeunwind.Rule{}}}
	extractions := 0
	extract := func() (nativeunwind.Deltas, error) { extractions++; return deltas, nil }

	for range 2 {
		if err := acquireWith(l, 7, extract); err != nil {
			t.Fatal(err)
		}
	}
	if extractions != 1 {
		t.Errorf("%d extractions for one file, want 1", extractions)
	}
	for addr, want := range map[uint64]nativeunwind.Rule{0x1000: sp8, 0x1008: sp32, 0x1fff: sp32, 0x2050: sp32, 0x2100: sp8} {
		got, ok := maps.BPFLookup(7, addr, 12)
		if !ok || got.CFAOffset != want.CFAOffset || got.FPOffset != want.FPOffset || got.CFABase != uint8(want.CFA) {
			t.Errorf("address %#x: rule %+v (found %v), want %v", addr, got, ok, want)
		}
	}
	if got, ok := maps.BPFLookup(7, 0x2200, 12); !ok || got.CFABase != 0 {
		t.Errorf("address in a gap: %+v (found %v), want the unknown rule", got, ok)
	}

	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	l.release(7)
	if len(maps.Pages) == 0 {
		t.Fatal("deltas unloaded while a reference remains")
	}
	l.release(7)
	if len(maps.Pages) == 0 || l.idleFiles != 1 {
		t.Fatalf("idle file unloaded at once (%d idle)", l.idleFiles)
	}
	// A new user of an idle file takes it back without extracting.
	if err := acquireWith(l, 7, extract); err != nil || extractions != 1 || l.idleFiles != 0 {
		t.Fatalf("reacquiring an idle file: %v, %d extractions, %d idle", err, extractions, l.idleFiles)
	}
	l.release(7)
	now = now.Add(idleFileKeep)
	l.expireIdle(now)
	if len(maps.Pages) != 0 || l.loaded(7) || l.idleFiles != 0 {
		t.Errorf("pages left after the idle time: %v", maps.Pages)
	}
	if len(l.pool.holes) != 1 || l.pool.holes[0] != (span{0, 64}) {
		t.Errorf("pool not whole again: %+v", l.pool.holes)
	}
}

// TestDeltaLoaderEvictsIdleForRoom: a full pool unloads idle files,
// oldest first, before it refuses a file.
func TestDeltaLoaderEvictsIdleForRoom(t *testing.T) {
	l := newDeltaLoader(unwindmapstest.NewMaps(), support.DeltaCapacity{Rules: 16, Deltas: 4, PageBits: 12})
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	sp8 := nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8}
	two := func() (nativeunwind.Deltas, error) {
		return nativeunwind.Deltas{{Address: 0x1000, Rule: sp8}, {Address: 0x1010, Rule: nativeunwind.Rule{}}}, nil
	}
	for id := uint64(1); id <= 2; id++ {
		if err := acquireWith(l, id, two); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
	}
	l.release(1)
	l.release(2)
	if err := acquireWith(l, 3, two); err != nil {
		t.Fatal(err)
	}
	if l.loaded(1) || !l.loaded(2) || !l.loaded(3) {
		t.Errorf("loaded 1/2/3: %v %v %v, want the oldest idle file evicted", l.loaded(1), l.loaded(2), l.loaded(3))
	}
}

func TestDeltaLoaderPoolFull(t *testing.T) {
	l := newDeltaLoader(unwindmapstest.NewMaps(), support.DeltaCapacity{Rules: 16, Deltas: 2, PageBits: 12})
	deltas := nativeunwind.Deltas{{Address: 0x1000, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8}},
		{Address: 0x1004, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 16}},
		{Address: 0x1008, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8}}}
	err := acquireWith(l, 1, func() (nativeunwind.Deltas, error) { return deltas, nil })
	if !errors.Is(err, ErrDeltaPoolFull) || l.loaded(1) {
		t.Errorf("error %v (loaded %v), want ErrDeltaPoolFull", err, l.loaded(1))
	}
}

// TestDeltaLoaderRemembersFailures checks that a file whose deltas failed
// is extracted once per backoff period, however many processes map it,
// while a failure to open it is retried at once.
func TestDeltaLoaderRemembersFailures(t *testing.T) {
	l := newDeltaLoader(unwindmapstest.NewMaps(), support.DeltaCapacity{Rules: 16, Deltas: 64, PageBits: 12})
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	bad := errors.New("truncated .eh_frame")
	extractions := 0
	failing := func() (nativeunwind.Deltas, error) { extractions++; return nil, bad }
	for range 3 {
		if err := acquireWith(l, 1, failing); !errors.Is(err, bad) {
			t.Fatalf("error %v, want %v", err, bad)
		}
	}
	if extractions != 1 {
		t.Errorf("%d extractions of a failing file within the backoff, want 1", extractions)
	}
	now = now.Add(failedFileBackoff)
	if err := acquireWith(l, 1, failing); !errors.Is(err, bad) || extractions != 2 {
		t.Errorf("after the backoff: error %v, %d extractions, want a retry", err, extractions)
	}

	gone := transientError{proc.ErrExited}
	opens := 0
	for range 2 {
		err := acquireWith(l, 2, func() (nativeunwind.Deltas, error) { opens++; return nil, gone })
		if !errors.Is(err, proc.ErrExited) {
			t.Fatalf("error %v, want process.ErrExited", err)
		}
	}
	if opens != 2 {
		t.Errorf("%d attempts after transient failures, want 2", opens)
	}
}

func TestSpanAllocator(t *testing.T) {
	a := newSpanAllocator(10)
	x, _ := a.alloc(3)
	y, _ := a.alloc(3)
	z, _ := a.alloc(4)
	if _, ok := a.alloc(1); ok {
		t.Fatal("allocated from a full pool")
	}
	a.free(y)
	if s, ok := a.alloc(4); ok {
		t.Fatalf("allocated %+v across a used span", s)
	}
	a.free(x)
	a.free(z)
	if !slices.Equal(a.holes, []span{{0, 10}}) {
		t.Errorf("holes %+v, want the whole pool", a.holes)
	}
}

func TestRangePrefixes(t *testing.T) {
	tests := []struct {
		start, end uint64
		want       [][2]uint64
	}{
		{0x400000, 0x401000, [][2]uint64{{0x400000, 52}}},
		{0x1000, 0x4000, [][2]uint64{{0x1000, 52}, {0x2000, 51}}},
		{0x7f0000001000, 0x7f0000003800, [][2]uint64{{0x7f0000001000, 52}, {0x7f0000002000, 52}, {0x7f0000003000, 53}}},
	}
	for _, tt := range tests {
		got := rangePrefixes(tt.start, tt.end)
		if !slices.Equal(got, tt.want) {
			t.Errorf("rangePrefixes(%#x, %#x) = %x, want %x", tt.start, tt.end, got, tt.want)
		}
	}
	// Exhaustively: the prefixes cover exactly the range.
	start, end := uint64(0x12345), uint64(0x9876f)
	covered := uint64(0)
	for _, p := range rangePrefixes(start, end) {
		size := uint64(1) << (64 - p[1])
		if p[0]%size != 0 {
			t.Fatalf("prefix %x not aligned", p)
		}
		covered += size
	}
	if covered != end-start {
		t.Errorf("prefixes cover %#x bytes, want %#x", covered, end-start)
	}
}

func TestDeltaLoaderSignedReturnAddress(t *testing.T) {
	maps := unwindmapstest.NewMaps()
	l := newDeltaLoader(maps, support.DeltaCapacity{Rules: 4, Deltas: 4, PageBits: 12, FlagRASigned: 1})
	id, err := l.intern(nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 16, RAOffset: -8, RASigned: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := maps.Rules[id]; got.Flags != 1 || got.CFAOffset != 16 {
		t.Errorf("BPF rule %+v, want the signed-RA flag", got)
	}
}

// TestDeltaLoaderKnownFiles: BPF learns a loaded file's kernel names and
// forgets them when the file unloads, except a name that moved on to
// another file (an inode number reused).
func TestDeltaLoaderKnownFiles(t *testing.T) {
	maps := unwindmapstest.NewMaps()
	l := newDeltaLoader(maps, support.DeltaCapacity{Rules: 16, Deltas: 64, PageBits: 12})
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	one := func() (nativeunwind.Deltas, error) {
		return nativeunwind.Deltas{{Address: 0x1000, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8}}}, nil
	}
	a, b := support.FileKey{Dev: 1, Ino: 10}, support.FileKey{Dev: 1, Ino: 11}
	for _, id := range []uint64{1, 2} {
		if err := acquireWith(l, id, one); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.knownAs(a, support.KnownFile{FileID: 1, VaddrAdjust: 0x400000}); err != nil {
		t.Fatal(err)
	}
	if err := l.knownAs(b, support.KnownFile{FileID: 1, VaddrAdjust: 0}); err != nil {
		t.Fatal(err)
	}
	if got := maps.Known[a]; got != (support.KnownFile{FileID: 1, VaddrAdjust: 0x400000}) {
		t.Errorf("known file %+v", got)
	}
	if err := l.knownAs(b, support.KnownFile{FileID: 2, VaddrAdjust: 0}); err != nil { // b's inode now holds file 2
		t.Fatal(err)
	}
	l.release(1)
	now = now.Add(idleFileKeep)
	l.expireIdle(now)
	if _, ok := maps.Known[a]; ok {
		t.Error("key of an unloaded file left in BPF")
	}
	if got := maps.Known[b]; got.FileID != 2 {
		t.Errorf("key moved to file 2 was %+v after file 1 unloaded", got)
	}
	if err := l.knownAs(a, support.KnownFile{FileID: 3, VaddrAdjust: 0}); err != nil || len(maps.Known) != 1 {
		t.Errorf("a key for a file not loaded was written: %v, %v", err, maps.Known)
	}
}
