package webdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testPage has what the browser tests of the web view drive: a button, an
// input, a table, and a canvas whose pointer events are recorded in
// globals. The canvas is at (100, 200) of the viewport, 400x300, painted
// red; the page does not scroll.
const testPage = `<!doctype html>
<html><head><title>webdriver test</title>
<style>
  body { margin: 0; font: 14px sans-serif; overflow: hidden }
  #c { position: absolute; left: 100px; top: 200px; width: 400px; height: 300px }
</style></head>
<body>
<button id="btn" onclick="this.textContent = 'clicked'; window.btnClicks = (window.btnClicks || 0) + 1">press me</button>
<input id="name" value="initial">
<table id="tbl">
  <thead><tr><th>function</th><th>samples</th></tr></thead>
  <tbody><tr><td>main</td><td>10</td></tr><tr><td>work</td><td>32</td></tr></tbody>
</table>
<canvas id="c" width="400" height="300"></canvas>
<script>
  const c = document.getElementById('c');
  const g = c.getContext('2d');
  g.fillStyle = '#ff0000';
  g.fillRect(0, 0, 400, 300);
  window.clicks = [];
  window.hover = null;
  window.drag = null;
  let down = null, moves = 0;
  const at = e => { const r = c.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
  c.addEventListener('click', e => clicks.push(at(e)));
  c.addEventListener('mousemove', e => { hover = at(e); if (down) moves++; });
  c.addEventListener('mousedown', e => { down = at(e); moves = 0; });
  window.addEventListener('mouseup', e => { if (down) { drag = {from: down, to: at(e), moves}; down = null; } });
  setTimeout(() => {
    const d = document.createElement('div');
    d.id = 'late';
    d.textContent = 'arrived';
    document.body.appendChild(d);
    window.ready = true;
  }, 300);
  console.error('deliberate error from the test page');
</script>
</body></html>`

func testServer(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, testPage)
	})
	mux.HandleFunc("/other", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<!doctype html><title>other</title><p id="p">the other page</p>`)
	})
	srv := httptest.NewServer(mux) // on 127.0.0.1
	t.Cleanup(srv.Close)
	return srv
}

// TestBrowser drives the test page through every command. Without
// chromedriver or Chromium it fails (StartTest), naming the package.
func TestBrowser(t *testing.T) {
	RequireBrowserTests(t)
	srv := testServer(t)
	start := time.Now()
	b := StartTest(t, Options{})
	t.Logf("Start took %v", time.Since(start))

	start = time.Now()
	if err := b.Navigate(srv.URL + "/"); err != nil {
		t.Fatal(err)
	}
	t.Logf("first Navigate took %v", time.Since(start))
	if u, err := b.CurrentURL(); err != nil || u != srv.URL+"/" {
		t.Fatalf("CurrentURL = %q, %v; want %q", u, err, srv.URL+"/")
	}
	if title, err := b.Title(); err != nil || title != "webdriver test" {
		t.Fatalf("Title = %q, %v", title, err)
	}

	t.Run("button", func(t *testing.T) {
		btn, err := b.Find("#btn")
		if err != nil {
			t.Fatal(err)
		}
		if s, err := btn.Text(); err != nil || s != "press me" {
			t.Fatalf("text before the click = %q, %v", s, err)
		}
		if err := btn.Click(); err != nil {
			t.Fatal(err)
		}
		if s, err := btn.Text(); err != nil || s != "clicked" {
			t.Fatalf("text after the click = %q, %v", s, err)
		}
		if id, err := btn.Attribute("id"); err != nil || id != "btn" {
			t.Fatalf("attribute id = %q, %v", id, err)
		}
		if s, err := btn.Attribute("data-none"); err != nil || s != "" {
			t.Fatalf("missing attribute = %q, %v; want \"\", nil", s, err)
		}
	})

	t.Run("input", func(t *testing.T) {
		in, err := b.Find("input#name")
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Clear(); err != nil {
			t.Fatal(err)
		}
		if err := in.SendKeys("flame graph"); err != nil {
			t.Fatal(err)
		}
		if v, err := in.Property("value"); err != nil || v != "flame graph" {
			t.Fatalf("value after typing = %q, %v", v, err)
		}
		if err := in.SendKeys(KeyBackspace + KeyBackspace + "ph!"); err != nil {
			t.Fatal(err)
		}
		if v, err := in.Property("value"); err != nil || v != "flame graph!" {
			t.Fatalf("value after backspaces = %q, %v", v, err)
		}
	})

	t.Run("table", func(t *testing.T) {
		cells, err := b.FindAll("#tbl tbody td")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range cells {
			s, err := c.Text()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, s)
		}
		if strings.Join(got, ",") != "main,10,work,32" {
			t.Fatalf("cells = %q", got)
		}
		none, err := b.FindAll(".nothing")
		if err != nil || len(none) != 0 {
			t.Fatalf("FindAll(.nothing) = %d elements, %v", len(none), err)
		}
	})

	t.Run("errors", func(t *testing.T) {
		_, err := b.Find("#missing")
		if !IsCode(err, CodeNoSuchElement) {
			t.Fatalf("Find(#missing) = %v; want a %q error", err, CodeNoSuchElement)
		}
		var we *Error
		if !errors.As(err, &we) || we.Status != http.StatusNotFound || we.Command != "POST /element" || we.Message == "" {
			t.Fatalf("error = %#v", we)
		}
		if _, err := b.Find("[[["); !IsCode(err, CodeInvalidSelector) {
			t.Fatalf("Find([[[) = %v; want a %q error", err, CodeInvalidSelector)
		}
		if _, err := b.Exec("throw new Error('boom')"); !IsCode(err, CodeJavaScriptError) || !strings.Contains(err.Error(), "boom") {
			t.Fatalf("Exec(throw) = %v", err)
		}
	})

	t.Run("exec", func(t *testing.T) {
		var n int
		if err := b.ExecInto(&n, "return arguments[0] + arguments[1]", 40, 2); err != nil || n != 42 {
			t.Fatalf("ExecInto = %d, %v", n, err)
		}
		raw, err := b.Exec("return document.title")
		if err != nil || string(raw) != `"webdriver test"` {
			t.Fatalf("Exec = %s, %v", raw, err)
		}
		btn, err := b.Find("#btn")
		if err != nil {
			t.Fatal(err)
		}
		var id string
		if err := b.ExecInto(&id, "return arguments[0].id", btn); err != nil || id != "btn" {
			t.Fatalf("element argument: %q, %v", id, err)
		}
	})

	t.Run("wait", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e, err := b.WaitFor(ctx, "#late")
		if err != nil {
			t.Fatal(err)
		}
		if s, err := e.Text(); err != nil || s != "arrived" {
			t.Fatalf("late text = %q, %v", s, err)
		}
		if err := b.WaitUntil(ctx, "window.ready === true"); err != nil {
			t.Fatal(err)
		}

		short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel2()
		if _, err := b.WaitFor(short, "#never"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitFor(#never) = %v; want a deadline error", err)
		}
		short, cancel3 := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel3()
		err = b.WaitUntil(short, "window.undefinedThing.x")
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "threw") {
			t.Fatalf("WaitUntil(throwing) = %v; want a deadline error saying what it threw", err)
		}
	})

	t.Run("canvas", func(t *testing.T) {
		c, err := b.Find("#c")
		if err != nil {
			t.Fatal(err)
		}
		x, y, w, h, err := c.Rect()
		if err != nil {
			t.Fatal(err)
		}
		if x != 100 || y != 200 || w != 400 || h != 300 {
			t.Fatalf("canvas rect = %v,%v %vx%v; want 100,200 400x300", x, y, w, h)
		}

		if err := b.ClickAt(x+30, y+40); err != nil {
			t.Fatal(err)
		}
		if err := b.ClickAt(x+250, y+120); err != nil {
			t.Fatal(err)
		}
		var clicks [][2]float64
		if err := b.ExecInto(&clicks, "return window.clicks"); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(clicks) != "[[30 40] [250 120]]" {
			t.Fatalf("clicks on the canvas = %v; want [[30 40] [250 120]]", clicks)
		}

		if err := b.MoveTo(x+10, y+20); err != nil {
			t.Fatal(err)
		}
		var hover [2]float64
		if err := b.ExecInto(&hover, "return window.hover"); err != nil || hover != [2]float64{10, 20} {
			t.Fatalf("hover = %v, %v; want [10 20]", hover, err)
		}

		if err := b.DragBetween(x+50, y+60, x+300, y+60); err != nil {
			t.Fatal(err)
		}
		var drag struct {
			From, To [2]float64
			Moves    int
		}
		if err := b.ExecInto(&drag, "return window.drag"); err != nil {
			t.Fatal(err)
		}
		if drag.From != [2]float64{50, 60} || drag.To != [2]float64{300, 60} || drag.Moves < dragSteps {
			t.Fatalf("drag = %+v; want from [50 60] to [300 60] in %d moves or more", drag, dragSteps)
		}
	})

	t.Run("screenshot", func(t *testing.T) {
		data, err := b.Screenshot()
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("screenshot is not a PNG: %v", err)
		}
		if sz := img.Bounds().Size(); sz.X != DefaultWidth || sz.Y != DefaultHeight {
			t.Fatalf("screenshot is %v; want %dx%d", sz, DefaultWidth, DefaultHeight)
		}
		// The canvas is red where the page put it.
		r, g, bl, _ := img.At(100+200, 200+150).RGBA()
		if r>>8 < 240 || g>>8 > 20 || bl>>8 > 20 {
			t.Fatalf("pixel in the canvas = %d,%d,%d; want red", r>>8, g>>8, bl>>8)
		}
		r, g, bl, _ = img.At(100+200, 200+310).RGBA()
		if r>>8 < 240 || g>>8 < 240 || bl>>8 < 240 {
			t.Fatalf("pixel below the canvas = %d,%d,%d; want white", r>>8, g>>8, bl>>8)
		}
		path := filepath.Join(t.TempDir(), "shots", "page.png")
		if err := b.SaveScreenshot(path); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(path); err != nil || st.Size() == 0 {
			t.Fatalf("saved screenshot: %v", err)
		}
	})

	t.Run("console", func(t *testing.T) {
		errs, err := b.ConsoleErrors()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range errs {
			found = found || strings.Contains(e.Message, "deliberate error from the test page")
		}
		if !found {
			t.Fatalf("console errors = %+v; want the page's console.error", errs)
		}
		// chromedriver hands each entry out once.
		if errs, err := b.ConsoleErrors(); err != nil || len(errs) != 0 {
			t.Fatalf("console errors the second time = %+v, %v; want none", errs, err)
		}
	})

	t.Run("navigate", func(t *testing.T) {
		if err := b.Navigate(srv.URL + "/other"); err != nil {
			t.Fatal(err)
		}
		if u, err := b.CurrentURL(); err != nil || u != srv.URL+"/other" {
			t.Fatalf("CurrentURL = %q, %v", u, err)
		}
		p, err := b.Find("#p")
		if err != nil {
			t.Fatal(err)
		}
		if s, err := p.Text(); err != nil || s != "the other page" {
			t.Fatalf("text = %q, %v", s, err)
		}
	})

	t.Run("close", func(t *testing.T) {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := b.Navigate(srv.URL); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("Navigate after Close = %v; want an error", err)
		}
		// Nothing is left running of chromedriver's process group: neither
		// it nor any of Chromium's processes.
		select {
		case <-b.exited:
		default:
			t.Fatal("chromedriver still runs after Close")
		}
		if left := liveInGroup(b.driver.Process.Pid); len(left) != 0 {
			t.Fatalf("left running after Close: %v", left)
		}
		if _, err := os.Stat(b.profile); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Chromium's profile %s is still there after Close (%v)", b.profile, err)
		}
	})
}

// TestWindowSize checks that Options' size is the viewport's and the
// screenshots'.
func TestWindowSize(t *testing.T) {
	b := StartTest(t, Options{Width: 640, Height: 480})
	srv := testServer(t)
	if err := b.Navigate(srv.URL + "/other"); err != nil {
		t.Fatal(err)
	}
	var size [2]int
	if err := b.ExecInto(&size, "return [innerWidth, innerHeight]"); err != nil || size != [2]int{640, 480} {
		t.Fatalf("viewport = %v, %v; want 640x480", size, err)
	}
	data, err := b.Screenshot()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil || cfg.Width != 640 || cfg.Height != 480 {
		t.Fatalf("screenshot = %dx%d, %v; want 640x480", cfg.Width, cfg.Height, err)
	}
}

// TestStartMissing checks the errors that name the Debian package to
// install; it needs no browser.
func TestStartMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := Start(context.Background(), Options{DriverPath: filepath.Join(dir, "chromedriver")})
	if err == nil || !strings.Contains(err.Error(), "chromedriver not found at "+dir) || !strings.Contains(err.Error(), "chromium-driver (make test-deps)") {
		t.Fatalf("Start without chromedriver = %v", err)
	}
	driver := filepath.Join(dir, "fake-driver")
	if err := os.WriteFile(driver, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = Start(context.Background(), Options{DriverPath: driver, BrowserPath: filepath.Join(dir, "chromium")})
	if err == nil || !strings.Contains(err.Error(), "chromium not found at") || !strings.Contains(err.Error(), "package chromium (make test-deps)") {
		t.Fatalf("Start without chromium = %v", err)
	}
}

// fakeDriver is a Browser talking to handler instead of chromedriver.
func fakeDriver(t *testing.T, handler http.HandlerFunc, timeout time.Duration) *Browser {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return &Browser{
		opts:    Options{CommandTimeout: timeout}.withDefaults(),
		base:    srv.URL,
		session: "s1",
		client:  newHTTPClient(),
		closed:  make(chan struct{}),
		output:  &tail{},
	}
}

// TestProtocolErrors checks the decoding of error answers and that a
// driver that does not answer cannot hang a command; it needs no browser.
func TestProtocolErrors(t *testing.T) {
	b := fakeDriver(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/session/s1/element":
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]any{"value": map[string]any{
				"error": "no such element", "message": "no such element: Unable to locate element\n", "stacktrace": "#0 0x55",
			}})
		case "/session/s1/url":
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, "<html>not json</html>")
		case "/session/s1/title":
			<-r.Context().Done() // never answers
		default:
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"value":null}`)
		}
	}, 100*time.Millisecond)

	_, err := b.Find("#x")
	var we *Error
	if !errors.As(err, &we) {
		t.Fatalf("Find = %v; want an *Error", err)
	}
	want := Error{Command: "POST /element", Status: 404, Code: "no such element", Message: "no such element: Unable to locate element"}
	if *we != want {
		t.Fatalf("error = %#v; want %#v", *we, want)
	}
	if !strings.Contains(err.Error(), `find "#x": webdriver: POST /element: no such element: no such element: Unable`) {
		t.Fatalf("message = %q", err)
	}

	if _, err := b.CurrentURL(); err == nil || !strings.Contains(err.Error(), "HTTP 500, not a WebDriver answer") {
		t.Fatalf("CurrentURL on a non-JSON answer = %v", err)
	}
	if _, err := b.Screenshot(); !IsCode(err, "unknown error") {
		t.Fatalf("404 without an error code = %v", err)
	}

	start := time.Now()
	_, err = b.Title()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Title on a driver that does not answer = %v; want a deadline error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the command took %v", d)
	}
}
