package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/hostprof/ebpf-profiler/test/webdriver"
	"github.com/hostprof/ebpf-profiler/utils/gofetch"
	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// page drives the web view in a browser and keeps its screenshots.
type page struct {
	t   *testing.T
	b   *webdriver.Browser
	url string
	dir string
}

func (p *page) shot(name string) {
	p.t.Helper()
	path := filepath.Join(p.dir, name+".png")
	if err := p.b.SaveScreenshot(path); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot %s", path)
}

func (p *page) wait(expr string, d time.Duration) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := p.b.WaitUntil(ctx, expr); err != nil {
		p.shot("failed")
		p.t.Fatal(err)
	}
}

func (p *page) click(testID string) {
	p.t.Helper()
	el, err := p.b.Find(`[data-testid="` + testID + `"]`)
	if err == nil {
		err = el.Click()
	}
	if err != nil {
		p.t.Fatalf("clicking %s: %v", testID, err)
	}
}

func (p *page) text(css string) string {
	p.t.Helper()
	el, err := p.b.Find(css)
	var s string
	if err == nil {
		s, err = el.Text()
	}
	if err != nil {
		p.t.Fatalf("text of %s: %v", css, err)
	}
	return s
}

// choose picks the option of a select by its text.
func (p *page) choose(testID, option string) {
	p.t.Helper()
	opts, err := p.b.FindAll(`[data-testid="` + testID + `"] option`)
	if err != nil {
		p.t.Fatal(err)
	}
	var texts []string
	for _, o := range opts {
		txt, err := o.Text()
		if err != nil {
			p.t.Fatal(err)
		}
		if txt == option {
			if err := o.Click(); err != nil {
				p.t.Fatal(err)
			}
			return
		}
		texts = append(texts, txt)
	}
	p.t.Fatalf("no option %q in %s: %q", option, testID, texts)
}

// frameRect is where the page drew the widest frame of a function.
type frameRect struct{ X, Y, W, H float64 }

func (p *page) frame(name string) frameRect {
	p.t.Helper()
	var r *frameRect
	if err := p.b.ExecInto(&r, "return window.__profiler.frameRect(arguments[0])", name); err != nil {
		p.t.Fatal(err)
	}
	if r == nil {
		p.shot("failed")
		p.t.Fatalf("no frame %s drawn", name)
	}
	return *r
}

// consoleClean fails the test on errors in the page's console.
func (p *page) consoleClean() {
	p.t.Helper()
	errs, err := p.b.ConsoleErrors()
	if err != nil {
		p.t.Logf("console log unavailable: %v", err)
		return
	}
	for _, e := range errs {
		p.t.Errorf("console error: %s", e.Message)
	}
}

// TestWebView profiles a C and a Python workload with the daemon's web
// view on, and uses the page in headless Chromium as a person would: the
// top functions table lists both workloads' hot functions, clicking a
// frame of the flame graph zooms into it, and the differential view
// against the C process alone shows the Python frames grown and the C
// leaf shrunk. The screenshots stay in out/artifacts/webview.
func TestWebView(t *testing.T) {
	requireRoot(t)
	daemon := buildDaemon(t)
	cbin := buildWorkload(t, "fpchain", framePointers...)
	script, _ := pythonWorkload(t)
	gobin := buildGoLabels(t, goLabelBuild{version: gofetch.System})
	spansBin := buildOtelSpans(t, otelSpansBuild{name: "executable"})
	offBin := buildWorkload(t, "offcpu", append([]string{"-pthread"}, framePointers...)...)
	heapBin := buildGoHeap(t)
	skipIfPreparing(t)
	webdriver.RequireBrowserTests(t)

	addr := freeLoopbackAddr(t)
	d := testenv.StartDaemon(t, nil, daemon, "-http="+addr, "-output-dir=", "-reporter-interval=1s",
		"-samples-per-second="+strconv.Itoa(testHz), "-off-cpu-threshold=1", "-go-heap-interval=1s")
	d.WaitForLog(t, "Sampling ", time.Minute)
	d.WaitForLog(t, "Web view at http://"+addr+"/", time.Second)

	// The C workload alone, then with Python and Go (goroutines under
	// two tenants' labels).
	cpid, _ := runWorkload(t, cbin, 2*time.Second)
	both := exec.Command(cbin, "4")
	golabels := exec.Command(gobin, "4")
	// Two threads in and out of OpenTelemetry spans.
	spans := exec.Command(spansBin, "3")
	var spansOut strings.Builder
	spans.Stdout = &spansOut
	// Threads that sleep, read a pipe and wait for a mutex: off-CPU time.
	offcpu := exec.Command(offBin, "3")
	// A Go program that keeps 64 MiB in main.retainLeaf: its heap
	// profiles.
	goheap := exec.Command(heapBin, "127.0.0.1:0", "4")
	for _, c := range []*exec.Cmd{both, golabels, spans, offcpu, goheap} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	py := runScript(t, exec.Command("/usr/bin/python3", script, "recursion", "4"))
	for _, c := range []*exec.Cmd{both, golabels, spans, offcpu, goheap} {
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://" + addr + "/"
	waitForData(t, base, py.pid)
	waitForData(t, base, golabels.Process.Pid)
	waitForData(t, base, spans.Process.Pid)

	p := &page{t: t, b: webdriver.StartTest(t, webdriver.Options{Width: 1400, Height: 1000}), url: base,
		dir: webdriver.ArtifactDir(t, "webview")}
	if err := p.b.Navigate(base); err != nil {
		t.Fatal(err)
	}
	p.wait("window.__profiler && window.__profiler.ready", 30*time.Second)
	p.shot("1-flame")

	// The top functions table lists the hot leaves of both workloads.
	p.click("view-top")
	p.wait(`document.querySelectorAll('[data-testid="top-table"] tbody tr').length > 5`, 10*time.Second)
	table := p.text(`[data-testid="top-table"]`)
	for _, fn := range []string{"cf_leaf", "rec_leaf"} {
		if !strings.Contains(table, fn) {
			t.Errorf("the top functions table lacks %s:\n%s", fn, table)
		}
	}
	p.shot("2-top")

	// A click on cf_top zooms into it: the graph's root is cf_top, the
	// breadcrumb goes all > fpchain > ... > cf_top.
	p.click("view-flame")
	p.wait("window.__profiler.frameRect('cf_top') !== null", 10*time.Second)
	r := p.frame("cf_top")
	if err := p.b.ClickAt(r.X, r.Y); err != nil {
		t.Fatal(err)
	}
	p.wait("window.__profiler.rootName === 'cf_top'", 10*time.Second)
	crumbs := p.text(`[data-testid="breadcrumb"]`)
	if !strings.Contains(crumbs, "all") || !strings.Contains(crumbs, "fpchain") || !strings.Contains(crumbs, "cf_top") {
		t.Errorf("breadcrumb after zooming into cf_top: %q", crumbs)
	}
	if p.frame("cf_leaf").W < 0.5*r.W {
		t.Errorf("zoomed in, cf_leaf is %.0f px wide, cf_top was %.0f", p.frame("cf_leaf").W, r.W)
	}
	p.shot("3-zoomed")
	// The breadcrumb's first element zooms out again.
	all, err := p.b.Find(`[data-testid="breadcrumb"] > :first-child`)
	if err == nil {
		err = all.Click()
	}
	if err != nil {
		t.Fatal(err)
	}
	p.wait("window.__profiler.rootName === 'all'", 10*time.Second)

	// The search box marks rec_leaf's frames and gives its samples' share.
	search, err := p.b.Find(`[data-testid="search-input"]`)
	if err == nil {
		err = search.SendKeys("rec_leaf")
	}
	if err != nil {
		t.Fatal(err)
	}
	p.wait(`document.querySelector('[data-testid="match-info"]').textContent.includes('%')`, 10*time.Second)
	t.Logf("search rec_leaf: %s", p.text(`[data-testid="match-info"]`))
	p.click("mode-icicle")
	p.wait("window.__profiler.frameRect('rec_leaf') !== null", 10*time.Second)
	p.shot("4-search-icicle")
	if err := search.Clear(); err != nil {
		t.Fatal(err)
	}
	p.click("mode-icicle")

	// Both fpchain processes together, chosen by name.
	p.choose("process-select", "fpchain (all 2 processes)")
	p.wait(`window.__profiler.rootName === 'all' && window.__profiler.frameRect('rec_leaf') === null &&
		window.__profiler.frameRect('cf_leaf') !== null`, 10*time.Second)
	p.choose("process-select", "All processes")

	// Grouped by the goroutines' tenant label, then only tenant alpha.
	p.choose("group-select", "label tenant")
	p.wait(`window.__profiler.frameRect('tenant=alpha') !== null && window.__profiler.frameRect('tenant=beta') !== null &&
		window.__profiler.frameRect('tenant unset') !== null`, 10*time.Second)
	p.shot("5-group-by-tenant")
	p.choose("label-select", "tenant=alpha")
	p.wait(`window.__profiler.frameRect('main.alphaLoop') !== null && window.__profiler.frameRect('main.betaLoop') === null &&
		window.__profiler.frameRect('tenant=beta') === null`, 10*time.Second)
	p.shot("6-tenant-alpha")
	p.choose("label-select", "All labels")
	p.choose("group-select", "executable")

	// One span's trace id: only that span's samples, in in_span.
	windows := parseSpans(t, []byte(spansOut.String()))
	traceID := fmt.Sprintf("%x", windows[len(windows)/2].traceID)
	search, err = p.b.Find(`[data-testid="trace-input"]`)
	if err != nil {
		t.Fatal(err)
	}
	if err := search.SendKeys(traceID); err != nil {
		t.Fatal(err)
	}
	p.wait(`window.__profiler.frameRect('in_span') !== null && window.__profiler.frameRect('cf_leaf') === null &&
		window.__profiler.frameRect('no_span') === null`, 10*time.Second)
	p.shot("7-trace")
	if err := search.Clear(); err != nil {
		t.Fatal(err)
	}
	p.wait(`window.__profiler.frameRect('cf_leaf') !== null`, 10*time.Second)

	// The whole host against the C process alone.
	p.click("view-diff")
	p.choose("diff-baseline-process", fmt.Sprintf("fpchain (%d)", cpid))
	p.wait("window.__profiler.diffColors().some(n => n.name === 'rec_leaf')", 10*time.Second)
	var diff []struct {
		Name             string
		Share, BaseShare float64
		Delta            float64
	}
	if err := p.b.ExecInto(&diff, "return window.__profiler.diffColors()"); err != nil {
		t.Fatal(err)
	}
	// A function's widest node (its main call path) speaks for it.
	deltas, width := map[string]float64{}, map[string]float64{}
	for _, n := range diff {
		if w := n.Share + n.BaseShare; w > width[n.Name] {
			deltas[n.Name], width[n.Name] = n.Delta, w
		}
	}
	t.Logf("change of share against the C process alone: rec_leaf %+.3f, cf_leaf %+.3f", deltas["rec_leaf"], deltas["cf_leaf"])
	if deltas["rec_leaf"] <= 0 || deltas["cf_leaf"] >= 0 {
		t.Errorf("differential view: rec_leaf %+.3f (want grown), cf_leaf %+.3f (want shrunk)", deltas["rec_leaf"], deltas["cf_leaf"])
	}
	p.shot("8-diff")

	// The download link gives the page's selection as a pprof profile.
	var href string
	if err := p.b.ExecInto(&href, "return document.querySelector('[data-testid=\"download-pprof\"]').href"); err != nil {
		t.Fatal(err)
	}
	checkPprofDownload(t, href, "cf_leaf", "rec_leaf")

	// Off-CPU time: the waiting threads' chains under the kernel functions
	// where they waited, and none of the spinning ones; wall time has both.
	p.click("view-flame")
	p.choose("measure-select", "Off-CPU")
	p.wait(`['cf_sleep_leaf', 'cf_pipe_leaf', 'cf_lock_leaf', 'do_nanosleep'].every(n => window.__profiler.frameRect(n) !== null) &&
		window.__profiler.frameRect('cf_leaf') === null`, 10*time.Second)
	if info := p.text(`#flame-info`); !strings.Contains(info, "off the CPU") {
		t.Errorf("off-CPU flame graph's total reads %q, want a time off the CPU", info)
	}
	p.shot("9-offcpu")
	p.choose("measure-select", "Wall (CPU + off-CPU)")
	p.wait(`window.__profiler.frameRect('cf_sleep_leaf') !== null && window.__profiler.frameRect('cf_leaf') !== null`,
		10*time.Second)
	p.shot("10-wall")
	// Memory: the Go program's heap profiles, its retained 64 MiB.
	p.choose("measure-select", "Memory in use (Go heap)")
	p.wait(`window.__profiler.frameRect('main.retainLeaf') !== null && window.__profiler.frameRect('cf_leaf') === null`,
		10*time.Second)
	if info := p.text(`#flame-info`); !strings.Contains(info, "in use") {
		t.Errorf("memory flame graph's total reads %q, want bytes in use", info)
	}
	p.shot("11-memory")
	p.consoleClean()
}

// buildGoHeap builds utils/workloads/goheap with the machine's Go.
func buildGoHeap(t *testing.T) string {
	t.Helper()
	tc := targetToolchain(t)
	bin, build := workloadPath(t, "goheap", "go", gofetch.System, tc.goarch)
	if build {
		run(t, workloadDir("goheap"), []string{"GOTOOLCHAIN=local", "GOARCH=" + tc.goarch, "CGO_ENABLED=0"}, "go", "build", "-o", bin, ".")
	}
	return bin
}

// waitForData waits until the web view has samples of pid.
func waitForData(t *testing.T, base string, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var top struct{ Total uint64 }
		resp, err := http.Get(fmt.Sprintf("%sapi/top?pid=%d&limit=1", base, pid))
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&top)
			resp.Body.Close()
		}
		if err == nil && top.Total > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the web view has no samples of pid %d after 30 s (%v)", pid, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func checkPprofDownload(t *testing.T, url string, functions ...string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, body)
	}
	prof, err := profile.ParseData(body)
	if err != nil {
		t.Fatalf("the pprof download does not parse: %v", err)
	}
	seen := map[string]bool{}
	for _, f := range prof.Function {
		seen[f.Name] = true
	}
	for _, fn := range functions {
		if !seen[fn] {
			t.Errorf("the pprof download (%d bytes) lacks %s", len(body), fn)
		}
	}
}
