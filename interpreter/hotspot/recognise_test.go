package hotspot

import (
	"debug/elf"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/utils/jdkfetch"
)

// TestRecogniseBuilds: every tested JDK's libjvm.so, built for x86_64 and
// for arm64, is recognised by its tables; the build for the host's
// architecture is supported, the other refused with a reason.
func TestRecogniseBuilds(t *testing.T) {
	for _, v := range jdkfetch.Versions() {
		for _, arch := range []string{"amd64", "arm64"} {
			java, err := jdkfetch.For(v, arch)
			if err != nil {
				t.Fatal(err)
			}
			path := libjvmOf(java, arch)
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			b, err := recognise(&interpreter.File{Path: path, ELF: f})
			f.Close()
			if err != nil || b == nil {
				t.Errorf("JDK %s for %s: recognise = %v, %v, want the JVM", v, arch, b, err)
				continue
			}
			unsupported := b.Unsupported()
			if host := arch == runtime.GOARCH; host != (unsupported == nil) {
				t.Errorf("JDK %s for %s: Unsupported() = %v on %s", v, arch, unsupported, runtime.GOARCH)
			}
		}
	}
}

// libjvmOf is the libjvm.so of a JDK's java executable (JAVA_HOME/bin/java):
// in lib/server, or for JDK 8 in jre/lib/ARCH/server (ARCH as OpenJDK 8
// names it: amd64, aarch64).
func libjvmOf(java, arch string) string {
	home := filepath.Dir(filepath.Dir(java))
	path := filepath.Join(home, "lib", "server", "libjvm.so")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	dir := map[string]string{"amd64": "amd64", "arm64": "aarch64"}[arch]
	return filepath.Join(home, "jre", "lib", dir, "server", "libjvm.so")
}
