package main

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
)

// result is what one VM did.
type result struct {
	series, arch, pkg, log string
	fetch, wall            time.Duration
	// kernel is the release the guest reported; exit the test binary's
	// exit code (-2 when the VM never said).
	kernel string
	exit   int
	// From TestProgramsLoad's line: programs loaded of those in the
	// object, the largest by verifier instructions, how they attached.
	programs, largest, perfAttach, mapWatch string
	passed, missing, failed                 []string
	out                                     []byte
	err                                     error
}

var (
	initRe      = regexp.MustCompile(`kernel-matrix init: kernel=(\S+)`)
	exitRe      = regexp.MustCompile(`kernel-matrix init: exit=(-?\d+)`)
	programsRe  = regexp.MustCompile(`kernel matrix: kernel=\S+ programs=(\S+) largest=(\S+) perf_attach="([^"]*)" map_watch="([^"]*)"`)
	verifierRes = []*regexp.Regexp{
		regexp.MustCompile(`(?i)verifier`),
		regexp.MustCompile(`processed \d+ insns`),
	}
)

// parse reads the serial console: the init's lines, the program line and
// go test's results for the expected tests.
func (r *result) parse(out []byte, expected []string) {
	r.out, r.exit = out, -2
	s := string(out)
	if i := strings.Index(s, "Initramfs unpacking failed"); i >= 0 {
		line, _, _ := strings.Cut(s[i:], "\n")
		r.err = fmt.Errorf("%s: the VM's memory (qemu -m) is too small for its initramfs (its rootfs is a tmpfs of half the memory)",
			strings.TrimSpace(line))
	}
	if m := initRe.FindStringSubmatch(s); m != nil {
		r.kernel = m[1]
	}
	if m := exitRe.FindStringSubmatch(s); m != nil {
		fmt.Sscan(m[1], &r.exit)
	}
	if m := programsRe.FindStringSubmatch(s); m != nil {
		r.programs, r.largest, r.perfAttach, r.mapWatch = m[1], m[2], m[3], m[4]
	}
	res := testResults(out)
	r.failed = res["FAIL"]
	for _, name := range expected {
		if slices.Contains(res["PASS"], name) {
			r.passed = append(r.passed, name)
		} else {
			r.missing = append(r.missing, name)
		}
	}
}

// ok: the test binary ran to the end, every expected test passed and none
// failed.
func (r *result) ok() bool {
	return r.err == nil && r.exit == 0 && len(r.missing) == 0 && len(r.failed) == 0 && len(r.passed) > 0
}

func (r *result) summary() string {
	status := "PASS"
	if !r.ok() {
		status = "FAIL"
	}
	return fmt.Sprintf("%s (kernel %s, %d/%d tests passed, VM %.1fs)", status, r.kernel,
		len(r.passed), len(r.passed)+len(r.missing), r.wall.Seconds())
}

// printTable prints the results as a markdown table.
func printTable(w io.Writer, results []result) {
	fmt.Fprintln(w, "\n| kernel | arch | package | programs loaded | largest program (insns processed) | perf attach | mapping watch | tests passed | VM wall | result |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		status := "PASS"
		if !r.ok() {
			status = "**FAIL**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %d/%d | %.1f s | %s |\n",
			orDash(r.kernel), r.arch, orDash(r.pkg), orDash(r.programs), orDash(strings.Replace(r.largest, "=", " (", 1)+")"),
			orDash(r.perfAttach), orDash(r.mapWatch), len(r.passed), len(r.passed)+len(r.missing), r.wall.Seconds(), status)
	}
}

func orDash(s string) string {
	if s == "" || s == ")" {
		return "—"
	}
	return s
}

// printFailure says why a kernel failed: the error, the tests that did
// not pass, each failed test's output and any verifier lines.
func (r *result) printFailure(w io.Writer) {
	fmt.Fprintf(w, "\n== %s %s failed (serial log %s)\n", r.series, r.arch, r.log)
	if r.err != nil {
		fmt.Fprintf(w, "error: %v\n", r.err)
	}
	if r.exit != 0 {
		fmt.Fprintf(w, "test binary exit code: %d (-2: it never finished)\n", r.exit)
	}
	if len(r.missing) > 0 {
		fmt.Fprintf(w, "expected tests that did not pass: %s\n", strings.Join(r.missing, ", "))
	}
	lines := strings.Split(string(r.out), "\n")
	failing := failedOutput(lines, r.failed)
	if len(failing) == 0 {
		failing = lines[max(0, len(lines)-40):]
	}
	for _, l := range failing[max(0, len(failing)-200):] {
		fmt.Fprintln(w, "  "+l)
	}
}

// testMarkerRe is go test -v's line saying whose output follows.
var testMarkerRe = regexp.MustCompile(`^=== (RUN|NAME|CONT|PAUSE)\s+(\S+)`)

// failedOutput returns, for each failed test, the lines go test -v printed
// for it (a subtest's log lines come where it ran, far above its parent's
// FAIL line), then its FAIL line; and the verifier's lines.
func failedOutput(lines, failed []string) []string {
	var out []string
	current := ""
	own := map[string][]string{}
	for _, l := range lines {
		if m := testMarkerRe.FindStringSubmatch(l); m != nil {
			current = m[2]
			continue
		}
		if m := testLineRe.FindStringSubmatch(l); m != nil {
			if m[1] == "FAIL" {
				out = append(out, own[m[2]]...)
				out = append(out, l)
			}
			continue
		}
		if matchesAny(l, verifierRes) {
			out = append(out, l)
		} else if slices.Contains(failed, current) {
			own[current] = append(own[current], l)
		}
	}
	return out
}

func matchesAny(s string, res []*regexp.Regexp) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}
