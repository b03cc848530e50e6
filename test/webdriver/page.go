package webdriver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// Navigate loads url and waits until the page has loaded (its load event),
// bounded by the command timeout.
func (b *Browser) Navigate(url string) error {
	return b.command(http.MethodPost, "/url", map[string]string{"url": url}, nil)
}

// CurrentURL returns the URL of the current page.
func (b *Browser) CurrentURL() (string, error) {
	var s string
	err := b.command(http.MethodGet, "/url", nil, &s)
	return s, err
}

// Title returns the title of the current page.
func (b *Browser) Title() (string, error) {
	var s string
	err := b.command(http.MethodGet, "/title", nil, &s)
	return s, err
}

// Exec runs script, the body of a function, in the page and returns what
// it returns, as JSON: `return document.title` gives "\"...\"". Its
// arguments are arguments[0], ...; an *Element argument arrives as its DOM
// element. A script that throws gives an Error with code
// CodeJavaScriptError.
func (b *Browser) Exec(script string, args ...any) (json.RawMessage, error) {
	return b.exec(context.Background(), script, args)
}

func (b *Browser) exec(ctx context.Context, script string, args []any) (json.RawMessage, error) {
	if args == nil {
		args = []any{}
	}
	var raw json.RawMessage
	err := b.commandCtx(ctx, http.MethodPost, "/execute/sync", map[string]any{"script": script, "args": args}, &raw)
	return raw, err
}

// ExecInto runs script like Exec and decodes its result into out.
func (b *Browser) ExecInto(out any, script string, args ...any) error {
	raw, err := b.Exec(script, args...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("webdriver: decoding the script's result %q: %w", clip(raw, 200), err)
	}
	return nil
}

// WaitUntil polls the JavaScript expression expr, about every 50 ms, until
// it is true (truthy). It gives up when ctx is done, or after the command
// timeout when ctx has no deadline, and then says what the expression
// threw last, if it threw. Errors other than the expression throwing end
// it at once.
func (b *Browser) WaitUntil(ctx context.Context, expr string) error {
	ctx, cancel := b.bounded(ctx)
	defer cancel()
	script := "return !!(" + expr + "\n);"
	var last error
	for {
		raw, err := b.exec(ctx, script, nil)
		switch {
		case err == nil:
			var ok bool
			if json.Unmarshal(raw, &ok) == nil && ok {
				return nil
			}
		case IsCode(err, CodeJavaScriptError):
			last = err
		case ctx.Err() == nil:
			return err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("webdriver: waiting until %s: %w (it threw: %v)", expr, ctx.Err(), last)
			}
			return fmt.Errorf("webdriver: waiting until %s: %w", expr, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// Pointer actions, in viewport CSS pixels. They are real input events: the
// page sees pointer and mouse events (and a click) at that point, whatever
// element, a <canvas> too, is there.

// ClickAt clicks with the left button at (x, y) of the viewport.
func (b *Browser) ClickAt(x, y float64) error {
	return b.pointer(move(x, y, 0), press("pointerDown"), press("pointerUp"))
}

// MoveTo moves the pointer to (x, y) of the viewport (hovers there).
func (b *Browser) MoveTo(x, y float64) error {
	return b.pointer(move(x, y, 0))
}

// dragSteps is how many pointer moves DragBetween makes between the press
// and the release, so that the page sees a drag and not a jump.
const dragSteps = 10

// DragBetween presses the left button at (x1, y1) of the viewport, moves
// to (x2, y2) in steps and releases it there.
func (b *Browser) DragBetween(x1, y1, x2, y2 float64) error {
	acts := []map[string]any{move(x1, y1, 0), press("pointerDown")}
	for i := 1; i <= dragSteps; i++ {
		f := float64(i) / dragSteps
		acts = append(acts, move(x1+(x2-x1)*f, y1+(y2-y1)*f, 10))
	}
	acts = append(acts, press("pointerUp"))
	return b.pointer(acts...)
}

// move is a pointerMove to (x, y) of the viewport. Coordinates are rounded
// to whole pixels: chromedriver takes fractions, other drivers want
// integers.
func move(x, y float64, ms int) map[string]any {
	return map[string]any{
		"type": "pointerMove", "origin": "viewport", "duration": ms,
		"x": int(math.Round(x)), "y": int(math.Round(y)),
	}
}

func press(kind string) map[string]any {
	return map[string]any{"type": kind, "button": 0}
}

// pointer performs actions of the mouse. When they fail it releases
// whatever they pressed.
func (b *Browser) pointer(acts ...map[string]any) error {
	body := map[string]any{"actions": []any{map[string]any{
		"type":       "pointer",
		"id":         "mouse",
		"parameters": map[string]string{"pointerType": "mouse"},
		"actions":    acts,
	}}}
	err := b.command(http.MethodPost, "/actions", body, nil)
	if err != nil {
		b.command(http.MethodDelete, "/actions", nil, nil)
	}
	return err
}

// Screenshot returns a PNG of the viewport.
func (b *Browser) Screenshot() ([]byte, error) {
	var s string
	if err := b.command(http.MethodGet, "/screenshot", nil, &s); err != nil {
		return nil, err
	}
	png, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("webdriver: screenshot: %w", err)
	}
	return png, nil
}

// SaveScreenshot writes a PNG of the viewport to path, making its
// directory.
func (b *Browser) SaveScreenshot(path string) error {
	png, err := b.Screenshot()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("webdriver: %w", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		return fmt.Errorf("webdriver: %w", err)
	}
	return nil
}

// LogEntry is an entry of the browser's console log.
type LogEntry struct {
	Level     string `json:"level"`     // SEVERE, WARNING, INFO, DEBUG
	Source    string `json:"source"`    // javascript, console-api, network, ...
	Message   string `json:"message"`   // with the script's URL and line first
	Timestamp int64  `json:"timestamp"` // milliseconds since the epoch
}

// BrowserLog returns the console log entries since the last call of
// BrowserLog or ConsoleErrors (chromedriver hands each out once):
// console.* calls, uncaught exceptions, failed loads.
func (b *Browser) BrowserLog() ([]LogEntry, error) {
	var entries []LogEntry
	err := b.command(http.MethodPost, "/se/log", map[string]string{"type": "browser"}, &entries)
	return entries, err
}

// ConsoleErrors returns the SEVERE entries of BrowserLog: console.error,
// uncaught exceptions and failed loads since the last call.
func (b *Browser) ConsoleErrors() ([]LogEntry, error) {
	entries, err := b.BrowserLog()
	if err != nil {
		return nil, err
	}
	var severe []LogEntry
	for _, e := range entries {
		if e.Level == "SEVERE" {
			severe = append(severe, e)
		}
	}
	return severe, nil
}
