package main

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// release is one CPython release's headers, as one architecture's compiler
// sees them.
type release struct {
	Name                string // "3.11.7": pyenv's directory name, or PY_VERSION
	Major, Minor, Patch int
	// Origin says where the headers come from, for the table's header.
	Origin string
	// Includes are the -I directories, in order.
	Includes []string
}

// sources are where the releases' headers come from: the CPythons pyenv
// installed, and include trees such as those utils/pyfetch unpacks from
// Debian's packages. A tree overrides pyenv's release of its minor version.
type sources struct {
	Pyenv string // pyenv's versions directory; "" for none
	Trees []tree
}

// tree is the include directory of a Debian-style installation
// (/usr/include): pythonX.Y/ holding Python.h and, for multiarch
// installations, <triplet>/pythonX.Y/ holding the real pyconfig.h.
type tree struct {
	Dir     string // "{arch}" stands for the GOARCH
	Fetched string // the VERSION utils/pyfetch fetched it for; "" if given with -headers
}

func (t tree) String() string {
	if t.Fetched != "" {
		return fmt.Sprintf("utils/pyfetch's %s (-fetched %s)", t.Dir, t.Fetched)
	}
	return "-headers " + t.Dir
}

// fetchedTree is where utils/pyfetch/fetch-python.sh unpacks CPython
// version for a Debian architecture, which for amd64 and arm64 is the
// GOARCH.
func fetchedTree(cache, version string) tree {
	return tree{Dir: filepath.Join(cache, "python-"+version+"-{arch}", "root", "usr", "include"), Fetched: version}
}

// releases lists, for the compiler tc, the newest patch release of each
// minor version, oldest minor first.
func (s sources) releases(tc toolchain) ([]release, error) {
	var rs []release
	if s.Pyenv != "" {
		var err error
		if rs, err = pyenvReleases(s.Pyenv); err != nil {
			return nil, err
		}
	}
	fromTree := map[int]tree{}
	for _, t := range s.Trees {
		r, err := t.release(tc)
		if err != nil {
			return nil, err
		}
		if other, dup := fromTree[r.Minor]; dup {
			return nil, fmt.Errorf("CPython 3.%d twice, from %s and %s", r.Minor, other, t)
		}
		fromTree[r.Minor] = t
		rs = slices.DeleteFunc(rs, func(p release) bool { return p.Minor == r.Minor })
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b release) int { return a.Minor - b.Minor })
	return rs, nil
}

var pyenvName = regexp.MustCompile(`^3\.(\d+)\.(\d+)$`)

// pyenvReleases lists the newest patch release of each minor version under
// pyenv's versions directory. Free-threaded (3.13.0t) and other variants
// are skipped: the table describes the default build.
func pyenvReleases(dir string) ([]release, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing pyenv's CPythons: %w", err)
	}
	newest := map[int]release{}
	for _, de := range des {
		m := pyenvName.FindStringSubmatch(de.Name())
		if m == nil {
			continue
		}
		minor, _ := strconv.Atoi(m[1])
		patch, _ := strconv.Atoi(m[2])
		incs, _ := filepath.Glob(filepath.Join(dir, de.Name(), "include", "python3.*", "Python.h"))
		if len(incs) != 1 {
			return nil, fmt.Errorf("%s: want one include/python3.*/Python.h, found %d", de.Name(), len(incs))
		}
		r := release{Name: de.Name(), Major: 3, Minor: minor, Patch: patch,
			Origin: "headers installed by pyenv", Includes: []string{filepath.Dir(incs[0])}}
		if old, ok := newest[minor]; !ok || old.Patch < patch {
			newest[minor] = r
		}
	}
	var rs []release
	for _, r := range newest {
		rs = append(rs, r)
	}
	return rs, nil
}

// multiarch is Debian's name for each GOARCH's include subdirectory.
var multiarch = map[string]string{
	"amd64": "x86_64-linux-gnu",
	"arm64": "aarch64-linux-gnu",
}

// pyDir is the directory of Python.h in a tree: python3.X (python3.Xm up
// to 3.7); not the free-threaded python3.Xt or the debug python3.Xd.
var pyDir = regexp.MustCompile(`^python3\.\d+m?$`)

// release reads which CPython the tree holds (PY_VERSION) and how to
// compile against it for tc.
func (t tree) release(tc toolchain) (release, error) {
	root := strings.ReplaceAll(t.Dir, "{arch}", tc.Arch)
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) && t.Fetched != "" {
		return release{}, fmt.Errorf("no CPython %s headers for %s in %s: run utils/pyfetch/fetch-python.sh %s %s",
			t.Fetched, tc.Arch, root, t.Fetched, tc.Arch)
	}
	des, err := os.ReadDir(root)
	if err != nil {
		return release{}, fmt.Errorf("CPython headers: %w", err)
	}
	var py []string
	for _, de := range des {
		if pyDir.MatchString(de.Name()) && fileExists(filepath.Join(root, de.Name(), "Python.h")) {
			py = append(py, de.Name())
		}
	}
	if len(py) != 1 {
		return release{}, fmt.Errorf("%s: want one python3.X/Python.h, found %q", root, py)
	}
	r, err := readPatchlevel(filepath.Join(root, py[0], "patchlevel.h"))
	if err != nil {
		return release{}, err
	}
	if r.Includes, err = includeDirs(root, py[0], tc.Arch); err != nil {
		return release{}, err
	}
	r.Origin = debianOrigin(root, r)
	if r.Origin == "" {
		r.Origin = "headers in " + t.Dir
	}
	if t.Fetched != "" {
		r.Origin += ", fetched by utils/pyfetch"
	}
	return r, nil
}

// includeDirs are the -I directories for the headers in root/py. Debian's
// py/pyconfig.h includes <triplet/py/pyconfig.h> for the compiler's
// target, which root must resolve (not the host's /usr/include); headers in
// py/internal/ include "pyconfig.h", which must find the real one before
// the wrapper.
func includeDirs(root, py, arch string) ([]string, error) {
	arched, _ := filepath.Glob(filepath.Join(root, "*", py, "pyconfig.h"))
	if len(arched) == 0 {
		return []string{filepath.Join(root, py)}, nil
	}
	own := filepath.Join(root, multiarch[arch], py)
	if !fileExists(filepath.Join(own, "pyconfig.h")) {
		return nil, fmt.Errorf("%s has pyconfig.h for other architectures (%q) but none for %s", root, arched, arch)
	}
	return []string{own, filepath.Join(root, py), root}, nil
}

var pyVersion = regexp.MustCompile(`(?m)^#define\s+PY_VERSION\s+"(3\.(\d+)\.(\d+)\S*)"`)

// readPatchlevel reads the release from PY_VERSION in patchlevel.h.
func readPatchlevel(path string) (release, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return release{}, fmt.Errorf("CPython headers: %w", err)
	}
	m := pyVersion.FindSubmatch(b)
	if m == nil {
		return release{}, fmt.Errorf("%s: no PY_VERSION \"3.X.Y\"", path)
	}
	minor, _ := strconv.Atoi(string(m[2]))
	patch, _ := strconv.Atoi(string(m[3]))
	return release{Name: string(m[1]), Major: 3, Minor: minor, Patch: patch}, nil
}

// debianOrigin names the Debian package that installed the tree at root
// (its usr/include), from the first line of its changelog:
// "python3.14 (3.14.10-1) unstable; urgency=medium". "" if it has none.
func debianOrigin(root string, r release) string {
	pkg := fmt.Sprintf("libpython%d.%d-dev", r.Major, r.Minor)
	f, err := os.Open(filepath.Join(root, "..", "share", "doc", pkg, "changelog.Debian.gz"))
	if err != nil {
		return ""
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return ""
	}
	line, _ := bufio.NewReader(z).ReadString('\n')
	var src, version, dist string
	if n, _ := fmt.Sscanf(line, "%s (%s %s", &src, &version, &dist); n != 3 {
		return ""
	}
	return fmt.Sprintf("headers of Debian %s's %s %s", strings.TrimSuffix(dist, ";"), pkg,
		strings.TrimSuffix(version, ")"))
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
