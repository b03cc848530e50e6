package libctest

import (
	"bufio"
	"os/exec"
	"testing"
	"time"
)

// StartSpinning starts cmd, a program that prints a line once it is
// ready and then spins, and returns its pid and that line once it spins;
// the process is killed at the test's end.
func StartSpinning(t testing.TB, cmd *exec.Cmd) (int, string) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%s: %v", cmd.Path, err)
	}
	time.Sleep(100 * time.Millisecond) // into the loop
	return cmd.Process.Pid, line
}
