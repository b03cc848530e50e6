package interpreter_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	_ "github.com/hostprof/ebpf-profiler/interpreter/all"
)

// TestNoRuntimeNamedOutsideItsPackage keeps runtimes plug-ins: no Go file of
// the daemon outside interpreter/<runtime> and the registry
// (interpreter/all) names a registered runtime, by its name, display name
// or package, and no file of the BPF core does outside the runtime's own
// unwinder and the BPF registry (runtimes.h, tracer.ebpf.c). Tests, test
// suites (test/) and developer tools (utils/) may.
func TestNoRuntimeNamedOutsideItsPackage(t *testing.T) {
	root := moduleRoot(t)
	runtimes := interpreter.All()
	if len(runtimes) == 0 {
		t.Fatal("no runtime registered")
	}
	for _, rt := range runtimes {
		words := []string{rt.Name, rt.DisplayName}
		var pkg string
		for _, dir := range runtimePackages(t, root) {
			if packageRegisters(t, filepath.Join(root, "interpreter", dir), rt.Name) {
				pkg = dir
				words = append(words, dir)
			}
		}
		if pkg == "" {
			t.Fatalf("no package under interpreter/ registers %s", rt.Name)
		}
		re := regexp.MustCompile(`(?i)\b\w*(` + strings.Join(quoteAll(words), "|") + `)\w*\b`)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			if d.IsDir() {
				switch rel {
				case ".git", "test", "utils", filepath.Join("interpreter", pkg), filepath.Join("interpreter", "all"):
					return filepath.SkipDir
				}
				return nil
			}
			if !namesAllowed(rel, rt.Name) {
				data, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				if m := re.Find(data); m != nil {
					t.Errorf("%s names runtime %s (%q): it belongs in interpreter/%s", rel, rt.Name, m, pkg)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// namesAllowed says whether a file is no daemon source or may name
// runtimes: tests, the BPF registry and the runtime's own unwinder.
func namesAllowed(rel, runtime string) bool {
	base := filepath.Base(rel)
	switch {
	case rel == filepath.Join("tracecorr", "library.go"):
		// The APM correlation spec's pattern of the agent's library name
		// (elastic-jvmti-linux-*.so) names the JVM's tool interface: a
		// fact of the spec, not code of a runtime.
		return true
	case strings.HasSuffix(base, "_test.go"):
		return true
	case strings.HasSuffix(base, ".go"):
		return false
	case filepath.Dir(rel) == filepath.Join("support", "ebpf"):
		return base == "runtimes.h" || base == "tracer.ebpf.c" || base == runtime+".ebpf.c" ||
			!(strings.HasSuffix(base, ".c") || strings.HasSuffix(base, ".h"))
	}
	return true
}

func quoteAll(words []string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = regexp.QuoteMeta(w)
	}
	return out
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod in %s", dir)
	}
	return dir
}

// runtimePackages lists the directories under interpreter/ that may hold
// a runtime.
func runtimePackages(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "interpreter"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "all" {
			dirs = append(dirs, e.Name())
		}
	}
	return dirs
}

// packageRegisters says whether the package in dir registers a runtime
// named name.
func packageRegisters(t *testing.T, dir, name string) bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	named := regexp.MustCompile(`\bName:\s*"` + regexp.QuoteMeta(name) + `"`)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "interpreter.Register(") && named.Match(data) {
			return true
		}
	}
	return false
}
