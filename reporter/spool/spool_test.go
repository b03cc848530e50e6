package spool

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func payload(i, size int) []byte {
	b := bytes.Repeat([]byte{byte(i)}, size)
	copy(b, fmt.Sprintf("record %d;", i))
	return b
}

func mustOpen(t *testing.T, dir string, bound int64) *Spool {
	t.Helper()
	s, err := Open(dir, bound)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// readAll peeks and acknowledges every record, returning the payloads'
// prefixes ("record N").
func readAll(t *testing.T, s *Spool) []int {
	t.Helper()
	var got []int
	for {
		r, ok, err := s.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return got
		}
		var i int
		if _, err := fmt.Sscanf(string(r.Payload), "record %d;", &i); err != nil {
			t.Fatalf("payload %.20q: %v", r.Payload, err)
		}
		if r.Samples != uint32(i) || r.Items != 1 || r.Time.Unix() != int64(1e9+i) {
			t.Errorf("record %d came back as %+v", i, Record{Time: r.Time, Samples: r.Samples, Items: r.Items})
		}
		got = append(got, i)
		if err := s.Ack(r); err != nil {
			t.Fatal(err)
		}
	}
}

func appendN(t *testing.T, s *Spool, from, to, size int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := s.Append(Record{Time: time.Unix(int64(1e9+i), 0), Samples: uint32(i), Items: 1, Payload: payload(i, size)}); err != nil {
			t.Fatal(err)
		}
	}
}

func wantRange(t *testing.T, got []int, from, to int) {
	t.Helper()
	if len(got) != to-from {
		t.Fatalf("read records %v, want %d-%d", got, from, to-1)
	}
	for k, i := range got {
		if i != from+k {
			t.Fatalf("read records %v, want %d-%d", got, from, to-1)
		}
	}
}

// Records come back in order, also from a daemon started later, which
// reads only what the earlier one did not acknowledge.
func TestOrderAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, 1<<20)
	appendN(t, s, 0, 50, 3000) // several segments (128 KiB each)
	for range 20 {
		r, ok, _ := s.Peek()
		if !ok {
			t.Fatal("empty")
		}
		if err := s.Ack(r); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	s = mustOpen(t, dir, 1<<20)
	if st := s.Stats(); st.Records != 30 {
		t.Fatalf("reopened spool holds %d records, want 30", st.Records)
	}
	appendN(t, s, 50, 60, 3000)
	wantRange(t, readAll(t, s), 20, 60)
	s.Close()

	s = mustOpen(t, dir, 1<<20)
	if got := readAll(t, s); len(got) != 0 {
		t.Fatalf("everything was acknowledged, yet read %v", got)
	}
	if n, _ := filepath.Glob(filepath.Join(dir, "*.seg")); len(n) > 2 {
		t.Errorf("%d segment files left after everything was read: %v", len(n), n)
	}
}

// Beyond the bound the oldest records go, counted; the bound holds on
// disk.
func TestBound(t *testing.T) {
	dir := t.TempDir()
	const bound = 1 << 20
	s := mustOpen(t, dir, bound)
	appendN(t, s, 0, 400, 10000) // 4 MB into 1 MB
	st := s.Stats()
	if st.Bytes > bound || st.Dropped == 0 || st.Records+int(st.Dropped) != 400 {
		t.Fatalf("stats %+v: want at most %d bytes, and held + dropped = 400", st, bound)
	}
	// Record i holds i samples: 0..dropped-1 went.
	if want := st.Dropped * (st.Dropped - 1) / 2; st.DroppedSamples != want {
		t.Errorf("dropped samples %d, want %d", st.DroppedSamples, want)
	}
	var onDisk int64
	files, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	for _, f := range files {
		fi, _ := os.Stat(f)
		onDisk += fi.Size()
	}
	if onDisk > bound {
		t.Errorf("segments take %d bytes, bound %d", onDisk, bound)
	}
	wantRange(t, readAll(t, s), 400-st.Records, 400)

	if err := s.Append(Record{Payload: make([]byte, bound)}); err == nil {
		t.Error("a record larger than the bound was taken")
	}
}

// A torn tail (a crash mid-write) and a damaged record are skipped,
// counted; the records before them are read, and writing goes on.
func TestDamage(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, 1<<20)
	appendN(t, s, 0, 10, 1000)
	s.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(files) != 1 {
		t.Fatalf("segments %v", files)
	}
	// A torn tail: half a record.
	f, err := os.OpenFile(files[0], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, headerSize+500)
	rec[0] = 0xe8
	rec[1] = 0x03 // 1000 bytes said, 500 there
	f.Write(rec)
	f.Close()

	s = mustOpen(t, dir, 1<<20)
	if st := s.Stats(); st.Torn != 1 || st.Records != 10 {
		t.Fatalf("after a torn tail: %+v, want 10 records and 1 torn", st)
	}
	appendN(t, s, 10, 12, 1000)
	wantRange(t, readAll(t, s), 0, 12)
	appendN(t, s, 12, 20, 1000)
	s.Close()

	// A flipped byte in record 14's payload: 14 and what follows in its
	// segment are lost, counted.
	files, _ = filepath.Glob(filepath.Join(dir, "*.seg"))
	last := files[len(files)-1]
	b, _ := os.ReadFile(last)
	at := bytes.Index(b, []byte("record 14;"))
	b[at+100] ^= 0xff
	os.WriteFile(last, b, 0o600)

	s = mustOpen(t, dir, 1<<20)
	got := readAll(t, s)
	wantRange(t, got, 12, 14)
	if st := s.Stats(); st.Torn != 1 || st.Dropped != 5 {
		t.Errorf("after a damaged record: %+v, want 1 torn, 5 dropped (15-19)", st)
	}
	appendN(t, s, 20, 22, 1000)
	wantRange(t, readAll(t, s), 20, 22)
}

// A power cut can leave a segment cut anywhere: whatever the length, the
// whole records before the cut are read.
func TestTruncatedAnywhere(t *testing.T) {
	src := t.TempDir()
	s := mustOpen(t, src, 1<<20)
	appendN(t, s, 0, 5, 300)
	s.Close()
	files, _ := filepath.Glob(filepath.Join(src, "*.seg"))
	full, _ := os.ReadFile(files[0])
	rec := headerSize + 300
	for cut := 0; cut <= len(full); cut += 7 {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, filepath.Base(files[0])), full[:cut], 0o600)
		s := mustOpen(t, dir, 1<<20)
		wantRange(t, readAll(t, s), 0, cut/rec)
		s.Close()
	}
}

// TestKilledWhileWriting kills a process appending 1 MiB records with
// SIGKILL, at several moments: the queue it leaves opens, and every
// record in it reads back whole.
func TestKilledWhileWriting(t *testing.T) {
	if dir := os.Getenv("SPOOL_TEST_WRITER"); dir != "" {
		s, err := Open(dir, 64<<20)
		if err != nil {
			os.Exit(2)
		}
		for i := 0; ; i++ {
			s.Append(Record{Time: time.Unix(int64(1e9+i), 0), Samples: uint32(i), Items: 1, Payload: payload(i, 1<<20)})
		}
	}
	for k := range 5 {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWhileWriting$")
		cmd.Env = append(os.Environ(), "SPOOL_TEST_WRITER="+dir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(100+37*k) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		s := mustOpen(t, dir, 64<<20)
		n := s.Stats().Records
		got := readAll(t, s)
		if n == 0 || len(got) != n {
			t.Fatalf("kill %d: %d records held, %d read", k, n, len(got))
		}
		// The writer starts at record 0, but its oldest records may have
		// been pushed out by the bound.
		wantRange(t, got, got[0], got[0]+n)
		t.Logf("kill %d: %d whole records, torn %d, dropped %d", k, n, s.Stats().Torn, s.Stats().Dropped)
	}
}

// A damaged or missing cursor reads everything again, rather than nothing.
func TestDamagedCursor(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, 1<<20)
	appendN(t, s, 0, 4, 100)
	r, _, _ := s.Peek()
	s.Ack(r)
	s.Close()
	os.WriteFile(filepath.Join(dir, "cursor"), []byte(strconv.Itoa(12345)), 0o600)
	s = mustOpen(t, dir, 1<<20)
	wantRange(t, readAll(t, s), 0, 4)
}

// Two processes never share a spool.
func TestLocked(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, dir, 1<<20)
	if s, err := Open(dir, 1<<20); err == nil {
		s.Close()
		t.Fatal("a spool in use was opened again")
	}
}

// TestDiskFull: appends that do not fit on the disk fail, counted, and
// leave the queue readable; appends work again once there is room.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts a small tmpfs); CI runs it so")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatalf("mounting a 256 KiB tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) }) // after the spool's Close
	s := mustOpen(t, filepath.Join(dir, "spool"), 1<<20)
	var failed int
	for i := range 40 {
		if err := s.Append(Record{Time: time.Unix(int64(1e9+i), 0), Samples: uint32(i), Items: 1, Payload: payload(i, 10000)}); err != nil {
			failed++
		}
	}
	st := s.Stats()
	if failed == 0 || st.WriteErrors != uint64(failed) || st.Records+failed != 40 {
		t.Fatalf("40 appends of 10 KB into 256 KiB: %d failed, %+v", failed, st)
	}
	got := readAll(t, s)
	wantRange(t, got, 0, len(got))
	appendN(t, s, 100, 102, 10000)
	wantRange(t, readAll(t, s), 100, 102)
}

// A record the bound drops while it is being sent is counted as replayed
// when acknowledged, and the next record is not skipped.
func TestTrimmedWhileSent(t *testing.T) {
	s := mustOpen(t, t.TempDir(), 256<<10) // 64 KiB segments
	appendN(t, s, 0, 10, 10000)
	r, _, _ := s.Peek() // record 0, in the oldest segment
	appendN(t, s, 10, 30, 10000)
	if err := s.Ack(r); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	got := readAll(t, s)
	wantRange(t, got, got[0], 30)
	if int(st.Replayed) != 1 || int(st.Dropped)+1+len(got) != 30 {
		t.Errorf("%+v and %d read: want record 0 replayed, the others read or dropped", st, len(got))
	}
}

// A spool emptied by hand (its segments deleted, its cursor left) takes
// new records after the cursor, and a restart reads them.
func TestSegmentsDeletedByHand(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, 1<<20)
	appendN(t, s, 0, 100, 3000)
	for range 60 {
		r, _, _ := s.Peek()
		s.Ack(r)
	}
	s.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	for _, f := range segs {
		os.Remove(f)
	}
	s = mustOpen(t, dir, 1<<20)
	appendN(t, s, 100, 103, 3000)
	s.Close()
	s = mustOpen(t, dir, 1<<20)
	wantRange(t, readAll(t, s), 100, 103)
}

// A directory others may write to is not used: its records would be sent
// as the daemon's.
func TestRefusesSharedDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(dir, 1<<20); err == nil {
		s.Close()
		t.Fatal("a directory others may write to was used")
	}
}
