// Command pyoffsets builds the CPython struct-offset table of
// interpreter/python (offsets_table.go) from CPython headers: those of the
// releases pyenv installed (3.6-3.13 here), and include trees of Debian's
// libpython3.X-dev for releases pyenv lacks (3.14, which
// utils/pyfetch/fetch-python.sh unpacks for each architecture). For the
// newest patch release of each minor version it compiles c/pyoffsets.c
// against that release's headers, once per architecture, and reads the
// offsets back from the object file. Nothing is run, so arm64 layouts come
// from a cross compiler on any host.
//
// Usage (from interpreter/python, as go generate runs it):
//
//	go run ../../utils/pyoffsets -out offsets_table.go
//	  (also writes offsets_table_sources_test.go: the C member behind
//	  each value, for the tests that read DWARF)
//	go run ../../utils/pyoffsets -json   # the compiled values, for tests
//	go run ../../utils/pyoffsets -json -headers '/srv/py/{arch}/usr/include'
//	  (a Debian-style include tree per GOARCH, replacing pyenv's release
//	  of the same minor version)
//
// By default it takes 3.14 from utils/pyfetch's cache and fails, naming the
// command to run, where that is missing: a table regenerated without it
// would silently lose 3.14.
//
// It needs gcc, and for arm64 aarch64-linux-gnu-gcc with the arm64 libc
// headers (Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hostprof/ebpf-profiler/utils/pyfetch"
)

func main() {
	home, _ := os.UserHomeDir()
	pyenv := flag.String("pyenv", filepath.Join(envOr("PYENV_ROOT", filepath.Join(home, ".pyenv")), "versions"),
		"directory holding one CPython installation per release (3.X.Y); \"\" for none")
	cache := flag.String("cache", filepath.Join(envOr("XDG_CACHE_HOME", filepath.Join(home, ".cache")), "ebpf-profiler"),
		"utils/pyfetch's cache directory")
	fetched := flag.String("fetched", strings.Join(pyfetch.Fetched, ","),
		"comma-separated CPython versions to take from utils/pyfetch's cache (python-VERSION-ARCH)")
	var trees []tree
	flag.Func("headers", "a Debian-style include directory (/usr/include) of one CPython release, "+
		"\"{arch}\" standing for the GOARCH (repeatable)", func(dir string) error {
		trees = append(trees, tree{Dir: dir})
		return nil
	})
	out := flag.String("out", "", "write the Go table to this file")
	pkg := flag.String("pkg", ".", "directory of the Go package that declares Offsets")
	asJSON := flag.Bool("json", false, "print the compiled values as JSON instead")
	arches := flag.String("arch", "amd64,arm64", "comma-separated GOARCHes to compile for")
	flag.Parse()
	if (*out == "") == !*asJSON {
		fatalf("give exactly one of -out FILE and -json")
	}

	for _, v := range strings.Split(*fetched, ",") {
		if v != "" {
			trees = append(trees, fetchedTree(*cache, v))
		}
	}
	src := sources{Pyenv: *pyenv, Trees: trees}
	groups, err := readGroups(*pkg, *out)
	if err != nil {
		fatalf("%v", err)
	}
	var layouts []layout
	for _, arch := range strings.Split(*arches, ",") {
		tc, err := toolchainFor(arch)
		if err != nil {
			fatalf("%v", err)
		}
		releases, err := src.releases(tc)
		if err != nil {
			fatalf("%v", err)
		}
		if len(releases) == 0 {
			fatalf("no CPython 3 release under %s or in -headers", *pyenv)
		}
		for _, r := range releases {
			l, err := compileLayout(tc, r)
			if err != nil {
				fatalf("%v", err)
			}
			if err := groups.complete(&l); err != nil {
				fatalf("CPython %s on %s: %v", r.Name, arch, err)
			}
			layouts = append(layouts, l)
		}
	}

	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(layouts); err != nil {
			fatalf("%v", err)
		}
		return
	}
	table, err := emitTable(groups, layouts)
	if err != nil {
		fatalf("%v", err)
	}
	sources, err := emitSources(layouts)
	if err != nil {
		fatalf("%v", err)
	}
	if err := os.WriteFile(*out, table, 0o644); err != nil {
		fatalf("%v", err)
	}
	if err := os.WriteFile(sourcesFile(*out), sources, 0o644); err != nil {
		fatalf("%v", err)
	}
}

// sourcesFile is where the C member behind each table value goes: a test
// file, as only the tests that check the table against DWARF need it.
func sourcesFile(table string) string {
	return strings.TrimSuffix(table, ".go") + "_sources_test.go"
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pyoffsets: "+format+"\n", args...)
	os.Exit(1)
}
