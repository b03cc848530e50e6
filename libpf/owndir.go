package libpf

import (
	"fmt"
	"os"
	"syscall"
)

// OwnDirectory makes dir (0700) if missing and checks that it is a
// directory of the daemon's own: one another user owns, or others may
// write to, could hold anyone's files, which the daemon would then take
// for its own (cached deltas, spooled profiles).
func OwnDirectory(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case !ok || int(sys.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to another user", dir)
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("others may write to %s (mode %v)", dir, st.Mode().Perm())
	}
	return nil
}
