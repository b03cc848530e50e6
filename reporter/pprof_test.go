package reporter

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

func TestPprofRoundTrip(t *testing.T) {
	f := newFixture()
	dir := t.TempDir()
	const period = 50_000_000
	path, err := writePprof(dir, buildPprof(f.interval(), period), f.start, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "profile-20261122T103000Z.pb.gz"); path != want {
		t.Errorf("path = %s, want %s", path, want)
	}
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	p, err := profile.Parse(fh)
	if err != nil {
		t.Fatalf("parsing written profile: %v", err)
	}
	if err := p.CheckValid(); err != nil {
		t.Fatalf("CheckValid: %v", err)
	}

	if p.Period != period || p.PeriodType.Type != "cpu" || len(p.SampleType) != 2 {
		t.Errorf("period %d %v, sample types %v", p.Period, p.PeriodType, p.SampleType)
	}
	var count, cpu int64
	for _, s := range p.Sample {
		count += s.Value[0]
		cpu += s.Value[1]
	}
	if count != fixtureSamples || cpu != fixtureSamples*period {
		t.Errorf("sample totals = %d samples, %d ns; want %d, %d", count, cpu, fixtureSamples, fixtureSamples*period)
	}

	var fns []string
	for _, fn := range p.Function {
		fns = append(fns, fn.Name)
	}
	slices.Sort(fns)
	wantFns := []string{"[unwinding aborted: error 3]", "copy_user", "do_syscall_64", "main", "main.main", "write"}
	if !slices.Equal(fns, wantFns) {
		t.Errorf("functions = %v, want %v", fns, wantFns)
	}

	// The first sample is app-a's t1 on thread 100: labels and absolute
	// addresses (libc in app-a is mapped at 0x7f0000000000).
	s := p.Sample[0]
	if s.NumLabel["pid"][0] != 100 || s.NumLabel["tid"][0] != 100 || s.NumLabel["cpu"][0] != 0 ||
		s.Label["thread_name"][0] != "app-a" || s.Label["process"][0] != "app-a" {
		t.Errorf("labels = %v %v", s.Label, s.NumLabel)
	}
	var addrs []uint64
	for _, l := range s.Location {
		addrs = append(addrs, l.Address)
	}
	wantAddrs := []uint64{0xffffffff81001000, 0xffffffff81002000, 0x7f0000000100, 0x500}
	if !slices.Equal(addrs, wantAddrs) {
		t.Errorf("leaf-first addresses = %#x, want %#x", addrs, wantAddrs)
	}
	if fn := s.Location[2].Line[0]; fn.Function.Name != "write" || fn.Function.Filename != "write.c" || fn.Line != 10 {
		t.Errorf("libc frame line = %+v", fn)
	}
}

func TestUniqueProfilePath(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600))
	var got []string
	for range 3 {
		p, err := uniqueProfilePath(dir, at, "")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, filepath.Base(p))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The name is in UTC whatever the time's zone.
	want := []string{"profile-20260102T020405Z.pb.gz", "profile-20260102T020405Z-1.pb.gz", "profile-20260102T020405Z-2.pb.gz"}
	if !slices.Equal(got, want) {
		t.Errorf("names = %v, want %v", got, want)
	}
}

func TestPruneProfiles(t *testing.T) {
	tests := []struct {
		name        string
		files, keep int
		wantRemoved int
	}{
		{"under the bound", 3, 5, 0},
		{"at the bound", 3, 3, 0},
		{"over the bound", 5, 2, 3},
		{"unbounded", 5, -1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			base := time.Now().Add(-time.Hour)
			var names []string
			for i := range tt.files {
				name := filepath.Join(dir, "profile-"+string(rune('a'+tt.files-i))+".pb.gz")
				if err := os.WriteFile(name, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				// Names sort opposite to age: pruning must go by mtime.
				mt := base.Add(time.Duration(i) * time.Minute)
				if err := os.Chtimes(name, mt, mt); err != nil {
					t.Fatal(err)
				}
				names = append(names, name)
			}
			other := filepath.Join(dir, "notes.txt")
			if err := os.WriteFile(other, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			removed, err := pruneProfiles(dir, tt.keep)
			if err != nil || removed != tt.wantRemoved {
				t.Fatalf("pruneProfiles = %d, %v; want %d", removed, err, tt.wantRemoved)
			}
			for i, n := range names {
				_, err := os.Stat(n)
				if gone := os.IsNotExist(err); gone != (i < tt.wantRemoved) {
					t.Errorf("file %d (age rank) gone = %v", i, gone)
				}
			}
			if _, err := os.Stat(other); err != nil {
				t.Errorf("unrelated file touched: %v", err)
			}
		})
	}
}

func TestOutputDirChecks(t *testing.T) {
	tmp := t.TempDir()
	notADir := filepath.Join(tmp, "file")
	if err := os.WriteFile(notADir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		dir     string
		wantErr string
	}{
		{"created when missing", filepath.Join(tmp, "a", "b"), ""},
		{"path under a file", filepath.Join(notADir, "sub"), "creating output directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{OutputDir: tt.dir, Interval: time.Second, SamplesPerSecond: 20})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New = %v", err)
				}
				if fi, err := os.Stat(tt.dir); err != nil || fi.Mode().Perm() != 0o755 {
					t.Errorf("dir not created 0755: %v %v", fi, err)
				}
				return
			}
			if err == nil || !regexp.MustCompile(tt.wantErr).MatchString(err.Error()) {
				t.Errorf("New = %v, want error matching %q", err, tt.wantErr)
			}
		})
	}
}

func TestReporterKeepsBoundedFiles(t *testing.T) {
	dir := t.TempDir()
	r, _ := newTestReporter(t, Config{OutputDir: dir, MaxOutputFiles: 2})
	for i := 1; i <= 3; i++ {
		reportN(t, r, i)
	}
	files, _ := filepath.Glob(filepath.Join(dir, pprofPattern))
	if len(files) != 2 {
		t.Errorf("files = %v, want 2", files)
	}
	if st := r.Stats(); st.PprofFilesWritten != 3 || st.PprofFilesRemoved != 1 || st.PprofErrors != 0 {
		t.Errorf("Stats = %+v", st)
	}
	// No temporary files are left behind.
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".*")); len(tmp) != 0 {
		t.Errorf("leftover files: %v", tmp)
	}
}

// TestPprofDiskFull: on a full file system, pprof files fail, counted,
// leaving no partial file, and are written again once there is room.
func TestPprofDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts a small tmpfs); CI runs it so")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mounting a 64 KiB tmpfs: %v", err)
	}
	defer syscall.Unmount(dir, 0)
	// Fill it: the write stops at ENOSPC, keeping what fit.
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 128<<10), 0o644); err == nil {
		t.Fatal("128 KiB fit into a 64 KiB tmpfs")
	}
	r, _ := newTestReporter(t, Config{OutputDir: dir, MaxOutputFiles: -1})
	for range 3 {
		newFixture().report(r.ReportSample)
		r.noteLocal(r.reportInterval(time.Now()))
	}
	if st := r.Stats(); st.PprofErrors != 3 || st.PprofFilesWritten != 0 {
		t.Fatalf("on a full disk: %+v, want 3 errors", st)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".profile-*")); len(left) > 0 {
		t.Errorf("partial files left: %v", left)
	}
	os.Remove(filler)
	newFixture().report(r.ReportSample)
	r.noteLocal(r.reportInterval(time.Now()))
	if st := r.Stats(); st.PprofFilesWritten != 1 {
		t.Errorf("with room again: %+v, want a file written", st)
	}
}
