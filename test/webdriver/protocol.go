package webdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// WebDriver error codes (the "error" field of an error response) that tests
// may want to tell apart.
const (
	CodeNoSuchElement    = "no such element"
	CodeStaleElement     = "stale element reference"
	CodeInvalidSelector  = "invalid selector"
	CodeJavaScriptError  = "javascript error"
	CodeTimeout          = "timeout"
	CodeInvalidArgument  = "invalid argument"
	CodeUnknownCommand   = "unknown command"
	CodeNoSuchWindow     = "no such window"
	CodeInvalidSessionID = "invalid session id"
)

// Error is an error response of the WebDriver protocol.
type Error struct {
	Command string // the request, e.g. "POST /element"
	Status  int    // HTTP status
	Code    string // WebDriver error code, e.g. "no such element"
	Message string // chromedriver's message
}

func (e *Error) Error() string {
	return fmt.Sprintf("webdriver: %s: %s: %s", e.Command, e.Code, e.Message)
}

// IsCode tells whether err is, or wraps, a WebDriver error with this code.
func IsCode(err error, code string) bool {
	var we *Error
	return errors.As(err, &we) && we.Code == code
}

func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil, // chromedriver is on loopback
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// maxResponse bounds one response (screenshots are the largest).
const maxResponse = 256 << 20

// command sends one command of the session: path is relative to
// /session/{id}.
func (b *Browser) command(method, path string, body, out any) error {
	return b.commandCtx(context.Background(), method, path, body, out)
}

// requestTimeout bounds one request: the browser's page-load and script
// timeout plus some slack, so that the browser's own timeout error comes
// back first.
func (b *Browser) requestTimeout() time.Duration {
	return b.opts.CommandTimeout + min(requestSlack, b.opts.CommandTimeout)
}

// commandCtx is command bounded by ctx too.
func (b *Browser) commandCtx(ctx context.Context, method, path string, body, out any) error {
	select {
	case <-b.closed:
		return fmt.Errorf("webdriver: %s %s: the browser is closed", method, path)
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, b.requestTimeout())
	defer cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.do(ctx, method, "/session/"+b.session+path, body, out)
	var we *Error
	if errors.As(err, &we) {
		we.Command = method + " " + path
	} else if err != nil && !b.driverRunning() {
		err = fmt.Errorf("%w (chromedriver exited: %v)%s", err, b.exitErr, b.output.quote())
	}
	return err
}

// do sends one request to chromedriver and decodes the "value" of its
// answer into out (unless out is nil), or the error it reports.
func (b *Browser) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("webdriver: %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(data)
	} else if method == http.MethodPost {
		rd = strings.NewReader("{}") // chromedriver wants a JSON body on every POST
	}
	req, err := http.NewRequestWithContext(ctx, method, b.base+path, rd)
	if err != nil {
		return fmt.Errorf("webdriver: %w", err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return fmt.Errorf("webdriver: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("webdriver: %s %s: reading the answer: %w", method, path, err)
	}
	return decodeAnswer(method+" "+path, resp.StatusCode, data, out)
}

// decodeAnswer decodes a WebDriver answer {"value": ...}: an error when the
// value has an "error" field or the status is not 200, else the value into
// out.
func decodeAnswer(cmd string, status int, data []byte, out any) error {
	var env struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(data, &env); err != nil {
		return fmt.Errorf("webdriver: %s: HTTP %d, not a WebDriver answer: %q", cmd, status, clip(data, 200))
	}
	var werr struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	// A value that is not an object cannot be an error.
	_ = json.Unmarshal(env.Value, &werr)
	if werr.Error != "" || status != http.StatusOK {
		if werr.Error == "" {
			werr.Error = "unknown error"
			werr.Message = fmt.Sprintf("HTTP %d: %q", status, clip(data, 200))
		}
		return &Error{Command: cmd, Status: status, Code: werr.Error, Message: strings.TrimSpace(werr.Message)}
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = append((*raw)[:0], env.Value...)
		return nil
	}
	if err := json.Unmarshal(env.Value, out); err != nil {
		return fmt.Errorf("webdriver: %s: decoding %q: %w", cmd, clip(env.Value, 200), err)
	}
	return nil
}

func clip(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
