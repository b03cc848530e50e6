package unwindmaps

import (
	"bytes"
	"io"
	"math"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps/unwindmapstest"
	"github.com/hostprof/ebpf-profiler/support"
)

func TestPickExtraction(t *testing.T) {
	now := time.Unix(1000, 0)
	x := func(size int64, waited time.Duration) *extraction {
		return &extraction{size: size, queued: now.Add(-waited)}
	}
	tests := []struct {
		name    string
		waiting []*extraction
		maxSize int64
		want    int
	}{
		{"smallest first", []*extraction{x(100<<20, 0), x(16<<10, 0), x(2<<20, 0)}, math.MaxInt64, 1},
		{"first queued of equal sizes", []*extraction{x(5, 0), x(5, 0)}, math.MaxInt64, 0},
		{"one that waited long enough goes first", []*extraction{x(100<<20, maxExtractWait), x(16<<10, 0)}, math.MaxInt64, 0},
		{"not before", []*extraction{x(100<<20, maxExtractWait-time.Millisecond), x(16<<10, 0)}, math.MaxInt64, 1},
		{"the small lane passes a large file that waited", []*extraction{x(100<<20, 2*maxExtractWait), x(2<<20, 0)}, smallFileSize, 1},
		{"nothing for the small lane", []*extraction{x(100<<20, 0)}, smallFileSize, -1},
		{"nothing at all", nil, math.MaxInt64, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pickExtraction(tt.waiting, now, tt.maxSize); got != tt.want {
				t.Errorf("picked %d, want %d", got, tt.want)
			}
		})
	}
}

// memoryImage is a mapping's image held in memory.
type memoryImage struct{ *bytes.Reader }

func (memoryImage) Close() error { return nil }

// TestSmallFilePassesLargeOne: while a large file's deltas are extracted,
// a small file's mapping queued after it is attached; a mapping that waits
// for the large file and is forgotten meanwhile is never attached; a
// barrier waits for the large file.
func TestSmallFilePassesLargeOne(t *testing.T) {
	release := make(chan struct{})
	extract := func(r io.ReaderAt) (nativeunwind.Deltas, error) {
		var b [1]byte
		if _, err := r.ReadAt(b[:], 0); err != nil {
			return nil, err
		}
		if b[0] == 'L' {
			<-release
		}
		return nativeunwind.Deltas{{Address: 0, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8, RAOffset: -8}}}, nil
	}
	maps := unwindmapstest.NewMaps()
	log, _ := logtest.NewNullLogger()
	s := New(Unwinding{Maps: maps, Capacity: support.DeltaCapacity{Rules: 8, Deltas: 1024, PageBits: 16},
		Extract: extract}, log)
	defer s.Close()
	job := func(pid uint32, fileID uint64, content string, size int64) unwindJob {
		return unwindJob{
			pid: pid, m: attachedMapping{start: 0x10000, end: 0x20000, bias: 0x10000, fileID: fileID},
			open: func() (File, error) { return memoryImage{bytes.NewReader([]byte(content))}, nil },
			id:   libpf.FileID{byte(fileID)}, size: size, path: content,
		}
	}
	s.send(job(1, 1, "L", 100<<20))
	s.send(job(3, 1, "L", 100<<20))
	s.send(job(2, 2, "S", 16<<10))
	s.Forget(3)

	deadline := time.Now().Add(10 * time.Second)
	for r := s.resident.Load(); r == nil || r.Mappings != 1; r = s.resident.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("the small file was not attached while the large one was extracted: %+v", r)
		}
		time.Sleep(time.Millisecond)
	}
	if n := s.pending.Load(); n != 1 {
		t.Errorf("%d jobs pending, want 1 (the large file's mapping of pid 1)", n)
	}

	waited := make(chan struct{})
	go func() {
		s.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		t.Fatal("wait returned while a mapping waits for its file")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-waited
	trie := map[uint32]int{}
	for k := range maps.Mappings {
		trie[k.PID]++
	}
	if trie[1] == 0 || trie[2] == 0 || trie[3] != 0 {
		t.Errorf("trie entries per pid %v, want pids 1 and 2 only", trie)
	}
	if r := s.resident.Load(); r.Files != 2 || r.Mappings != 2 {
		t.Errorf("resident %+v, want 2 files and 2 mappings", r)
	}
	if n := s.pending.Load(); n != 0 {
		t.Errorf("%d jobs pending after the wait", n)
	}
}
