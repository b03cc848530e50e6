package tracecorr

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeProc is a procfs with one process, fakePID, whose root is a
// directory of the test's and whose effective uid is uid.
type fakeProc struct {
	procFS, root string
}

const fakePID = 4242

func newFakeProc(t *testing.T, uid int) *fakeProc {
	t.Helper()
	base := t.TempDir()
	f := &fakeProc{procFS: filepath.Join(base, "proc"), root: filepath.Join(base, "root")}
	dir := filepath.Join(f.procFS, fmt.Sprint(fakePID))
	for _, d := range []string{dir, f.root, filepath.Join(f.root, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(f.root, filepath.Join(dir, "root")); err != nil {
		t.Fatal(err)
	}
	status := fmt.Sprintf("Name:\tapp\nUid:\t%d\t%d\t%d\t%d\n", uid+1, uid, uid, uid)
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// listen binds a datagram socket at path (a host path) and returns it.
func listen(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// received returns the datagrams waiting on l.
func received(t *testing.T, l *net.UnixConn) [][]byte {
	t.Helper()
	var out [][]byte
	buf := make([]byte, 4096)
	for {
		if err := l.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		n, err := l.Read(buf)
		if err != nil {
			return out
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
}

func TestOpenAgentSocket(t *testing.T) {
	uid := os.Getuid()
	f := newFakeProc(t, uid)
	outside := filepath.Join(filepath.Dir(f.root), "outside.sock")
	outsideConn := listen(t, outside)
	listen(t, filepath.Join(f.root, "tmp", "agent.sock"))
	mustSymlink := func(target, link string) {
		if err := os.Symlink(target, filepath.Join(f.root, link)); err != nil {
			t.Fatal(err)
		}
	}
	// As in Debian images: /var/run is an absolute symlink, to be resolved
	// inside the process's root.
	if err := os.MkdirAll(filepath.Join(f.root, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustSymlink("/tmp", "var/run")
	mustSymlink("../../outside.sock", "tmp/escape.sock")
	mustSymlink("/../outside.sock", "tmp/rootdotdot.sock")
	mustSymlink(outside, "tmp/hostpath.sock") // absolute: names a path inside the root
	mustSymlink("loop2", "tmp/loop1")
	mustSymlink("loop1", "tmp/loop2")
	mustSymlink("agent.sock", "tmp/relative.sock")
	if err := os.WriteFile(filepath.Join(f.root, "tmp", "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(f.root, "tmp", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(f.root, "tmp", "other.sock")
	listen(t, other)
	if err := os.Lchown(other, uid+1, -1); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		path    string
		refusal Refusal // -1: accepted; -2: a plain error
	}{
		{"/tmp/agent.sock", -1},
		{"//tmp/./agent.sock", -1},
		{"/var/run/agent.sock", -1},
		{"/tmp/relative.sock", -1},
		{"tmp/agent.sock", RefusedPath},
		{"", RefusedPath},
		{"/tmp/agent.sock\x00", RefusedPath},
		{"/tmp/../tmp/agent.sock", RefusedDotDot},
		{"/../outside.sock", RefusedDotDot},
		{"/tmp/escape.sock", RefusedEscape},
		{"/tmp/rootdotdot.sock", RefusedEscape},
		{"/tmp/hostpath.sock", -2},
		{"/tmp/loop1", RefusedSymlinks},
		{"/tmp/file", RefusedNotSocket},
		{"/tmp/fifo", RefusedNotSocket},
		{"/tmp", RefusedNotSocket},
		{"/", RefusedNotSocket},
		{"/tmp/file/agent.sock", RefusedNotSocket},
		{"/tmp/other.sock", RefusedOwner},
		{"/tmp/missing.sock", -2},
	} {
		s, err := openAgentSocket(f.procFS, fakePID, tc.path)
		var refused *RefusedError
		switch {
		case tc.refusal == -1:
			if err != nil {
				t.Errorf("%q: %v, want a socket", tc.path, err)
				continue
			}
			if err := unix.Send(s.fd, []byte("x"), unix.MSG_DONTWAIT); err != nil {
				t.Errorf("%q: send: %v", tc.path, err)
			}
			s.close()
		case tc.refusal == -2:
			if err == nil || errors.As(err, &refused) {
				t.Errorf("%q: %v, want a plain error", tc.path, err)
			}
		case !errors.As(err, &refused) || refused.Reason != tc.refusal:
			t.Errorf("%q: %v, want refusal %q", tc.path, err, tc.refusal)
		}
		if s != nil && tc.refusal != -1 {
			s.close()
		}
	}
	if got := received(t, outsideConn); len(got) != 0 {
		t.Errorf("the socket outside the root received %d datagrams", len(got))
	}
}

func TestSameSocket(t *testing.T) {
	f := newFakeProc(t, os.Getuid())
	path := filepath.Join(f.root, "tmp", "agent.sock")
	l := listen(t, path)
	s, err := openAgentSocket(f.procFS, fakePID, "/tmp/agent.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if !sameSocket(f.procFS, fakePID, "/tmp/agent.sock", s) {
		t.Fatal("the socket just opened is not the same")
	}
	l.Close()
	os.Remove(path)
	listen(t, path)
	if sameSocket(f.procFS, fakePID, "/tmp/agent.sock", s) {
		t.Error("a socket bound anew at the path is the same")
	}
}
