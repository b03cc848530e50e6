package webdriver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// elementKey is the key of the web element reference object
// {"element-6066-11e4-a52e-4f735466cecf": id} in the protocol.
const elementKey = "element-6066-11e4-a52e-4f735466cecf"

// pollInterval is how often WaitFor and WaitUntil try again.
const pollInterval = 50 * time.Millisecond

// Keys to put in SendKeys's text (the protocol's code points for them).
const (
	KeyBackspace = "\ue003"
	KeyTab       = "\ue004"
	KeyEnter     = "\ue007"
	KeyEscape    = "\ue00c"
)

// Element is an element of the current page.
type Element struct {
	b  *Browser
	id string
}

// ID returns the element's WebDriver reference.
func (e *Element) ID() string { return e.id }

// MarshalJSON makes an Element an element reference, so that it can be
// passed to Exec as an argument (the script gets the DOM element).
func (e *Element) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{elementKey: e.id})
}

func (b *Browser) element(ref map[string]string) (*Element, error) {
	id, ok := ref[elementKey]
	if !ok || id == "" {
		return nil, fmt.Errorf("webdriver: not an element reference: %v", ref)
	}
	return &Element{b: b, id: id}, nil
}

// Find returns the first element matching the CSS selector; an Error with
// code CodeNoSuchElement when there is none.
func (b *Browser) Find(css string) (*Element, error) {
	return b.find(context.Background(), css)
}

func (b *Browser) find(ctx context.Context, css string) (*Element, error) {
	var ref map[string]string
	if err := b.commandCtx(ctx, http.MethodPost, "/element", locator(css), &ref); err != nil {
		return nil, fmt.Errorf("find %q: %w", css, err)
	}
	return b.element(ref)
}

// FindAll returns the elements matching the CSS selector, in document
// order; none is not an error.
func (b *Browser) FindAll(css string) ([]*Element, error) {
	var refs []map[string]string
	if err := b.command(http.MethodPost, "/elements", locator(css), &refs); err != nil {
		return nil, fmt.Errorf("find all %q: %w", css, err)
	}
	out := make([]*Element, 0, len(refs))
	for _, ref := range refs {
		e, err := b.element(ref)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func locator(css string) map[string]string {
	return map[string]string{"using": "css selector", "value": css}
}

// WaitFor polls until an element matches the CSS selector and returns it.
// It gives up when ctx is done, or after the command timeout when ctx has
// no deadline, and at once on errors other than no such element.
func (b *Browser) WaitFor(ctx context.Context, css string) (*Element, error) {
	ctx, cancel := b.bounded(ctx)
	defer cancel()
	for {
		e, err := b.find(ctx, css)
		if err == nil {
			return e, nil
		}
		if !IsCode(err, CodeNoSuchElement) {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("webdriver: waiting for %q: %w", css, ctx.Err())
			}
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("webdriver: waiting for %q: %w", css, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// bounded gives ctx the command timeout as deadline when it has none.
func (b *Browser) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, b.opts.CommandTimeout)
}

func (e *Element) path(rest string) string { return "/element/" + url.PathEscape(e.id) + rest }

// Click clicks the element's center, after scrolling it into view; an
// error when something else covers it there.
func (e *Element) Click() error {
	return e.b.command(http.MethodPost, e.path("/click"), nil, nil)
}

// Text returns the element's rendered text, as innerText gives it.
func (e *Element) Text() (string, error) {
	var s string
	err := e.b.command(http.MethodGet, e.path("/text"), nil, &s)
	return s, err
}

// Attribute returns an attribute of the element, "" when it has none.
// (chromedriver answers with the property for a few names, such as an
// input's "value"; Property asks for the property alone.)
func (e *Element) Attribute(name string) (string, error) {
	var s *string
	if err := e.b.command(http.MethodGet, e.path("/attribute/"+url.PathEscape(name)), nil, &s); err != nil {
		return "", err
	}
	if s == nil {
		return "", nil
	}
	return *s, nil
}

// Property returns a DOM property of the element: a string as it is, null
// and undefined as "", other values as JSON.
func (e *Element) Property(name string) (string, error) {
	var raw json.RawMessage
	if err := e.b.command(http.MethodGet, e.path("/property/"+url.PathEscape(name)), nil, &raw); err != nil {
		return "", err
	}
	var s *string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == nil {
			return "", nil
		}
		return *s, nil
	}
	return string(raw), nil
}

// SendKeys focuses the element and types text into it (Key* constants
// type special keys).
func (e *Element) SendKeys(text string) error {
	return e.b.command(http.MethodPost, e.path("/value"), map[string]string{"text": text}, nil)
}

// Clear empties an input or textarea.
func (e *Element) Clear() error {
	return e.b.command(http.MethodPost, e.path("/clear"), nil, nil)
}

// Rect returns the element's position and size in CSS pixels. The position
// is relative to the document: it is the viewport's when the page is not
// scrolled.
func (e *Element) Rect() (x, y, w, h float64, err error) {
	var r struct {
		X, Y          float64
		Width, Height float64
	}
	if err = e.b.command(http.MethodGet, e.path("/rect"), nil, &r); err != nil {
		return 0, 0, 0, 0, err
	}
	return r.X, r.Y, r.Width, r.Height, nil
}
