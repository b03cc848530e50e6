package pyfetch

import (
	"fmt"
	"os"
	"path/filepath"
)

// PyenvVersions is where pyenv keeps the CPythons the machine comes with
// (3.6-3.13): $PYENV_ROOT, ~/.pyenv or root's (tests often run under
// sudo), the first that has a versions directory; "" when none has.
func PyenvVersions() string {
	roots := []string{os.Getenv("PYENV_ROOT")}
	if home, err := os.UserHomeDir(); err == nil {
		roots = append(roots, filepath.Join(home, ".pyenv"))
	}
	for _, root := range append(roots, "/root/.pyenv") {
		if root == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, "versions")); err == nil {
			return filepath.Join(root, "versions")
		}
	}
	return ""
}

// PyenvPython returns pyenv's python3 of a minor release ("3.9"), or an
// error when pyenv has none.
func PyenvPython(minor string) (string, error) {
	pythons, _ := filepath.Glob(filepath.Join(PyenvVersions(), minor+".*", "bin", "python3"))
	if len(pythons) == 0 {
		return "", fmt.Errorf("no pyenv CPython %s in %q", minor, PyenvVersions())
	}
	return pythons[0], nil
}
