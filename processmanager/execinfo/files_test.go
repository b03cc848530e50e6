package execinfo

import (
	"bytes"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/processmanager/internal/filetest"
	"github.com/sirupsen/logrus"
)

// gatedReader blocks its first read until open is closed, and counts reads.
type gatedReader struct {
	*bytes.Reader
	open  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	reads int
}

func (g *gatedReader) ReadAt(p []byte, off int64) (int, error) {
	g.once.Do(func() { <-g.open })
	g.mu.Lock()
	g.reads++
	g.mu.Unlock()
	return g.Reader.ReadAt(p, off)
}

func (g *gatedReader) Read(p []byte) (int, error) {
	g.once.Do(func() { <-g.open })
	return g.Reader.Read(p)
}

// Set-up reads processes side by side, and they share libraries: a file
// being read is read once, the second reader waits for the first's result.
func TestCacheReadsAFileOnce(t *testing.T) {
	image := filetest.OwnVDSO(t)
	log := logrus.New()
	log.SetOutput(io.Discard)
	c := NewCache(8, nil, nil, log)
	key := fileKey{dev: 1, ino: 2, size: int64(len(image))}
	first := &gatedReader{Reader: bytes.NewReader(image), open: make(chan struct{})}
	second := &gatedReader{Reader: bytes.NewReader(image), open: make(chan struct{})}
	close(second.open)

	got := make(chan *File, 2)
	go func() {
		f, err := c.get(key, first, "first")
		if err != nil {
			t.Error(err)
		}
		got <- f
	}()
	// The second reader comes while the first is held in its read.
	for {
		c.mu.Lock()
		_, busy := c.reading[key]
		c.mu.Unlock()
		if busy {
			break
		}
		runtime.Gosched()
	}
	go func() {
		f, err := c.get(key, second, "second")
		if err != nil {
			t.Error(err)
		}
		got <- f
	}()
	// Without the wait, the second would have read the file by now.
	time.Sleep(50 * time.Millisecond)
	close(first.open)
	a, b := <-got, <-got
	if a == nil || a != b {
		t.Fatalf("two readers got %p and %p, want one File", a, b)
	}
	if second.reads != 0 {
		t.Errorf("the second reader read the file %d times", second.reads)
	}
	if s := c.Stats(); s.Hits != 1 || s.Misses != 1 {
		t.Errorf("stats %+v: want 1 hit and 1 miss", s)
	}
}
