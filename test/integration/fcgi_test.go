package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// FastCGI records (the FastCGI 1.0 specification; Go's net/http/fcgi is
// the server side only): an 8-byte header (version 1, type, request id,
// content length, padding length, reserved), the content, the padding.
const (
	fcgiBeginRequest = 1
	fcgiEndRequest   = 3
	fcgiParams       = 4
	fcgiStdin        = 5
	fcgiStdout       = 6
	fcgiStderr       = 7
	fcgiResponder    = 1
)

// fcgiRecord appends one record of type typ with content c to b.
func fcgiRecord(b *bytes.Buffer, typ uint8, c []byte) {
	b.Write([]byte{1, typ, 0, 1, byte(len(c) >> 8), byte(len(c)), 0, 0})
	b.Write(c)
}

// fcgiParam appends a name-value pair as FastCGI encodes them: each
// length in one byte below 128, else in four with the top bit set.
func fcgiParam(b *bytes.Buffer, name, value string) {
	for _, s := range []string{name, value} {
		if len(s) < 128 {
			b.WriteByte(byte(len(s)))
		} else {
			_ = binary.Write(b, binary.BigEndian, uint32(len(s))|1<<31)
		}
	}
	b.WriteString(name)
	b.WriteString(value)
}

// fcgiGet sends one GET request for script with query to the FastCGI
// server at the unix socket sock and returns the body of its answer (the
// CGI headers cut off).
func fcgiGet(sock, script, query string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("unix", sock, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	var req, params bytes.Buffer
	fcgiRecord(&req, fcgiBeginRequest, []byte{0, fcgiResponder, 0, 0, 0, 0, 0, 0})
	for _, kv := range [][2]string{{"SCRIPT_FILENAME", script}, {"REQUEST_METHOD", "GET"}, {"QUERY_STRING", query},
		{"SERVER_PROTOCOL", "HTTP/1.1"}, {"GATEWAY_INTERFACE", "CGI/1.1"}} {
		fcgiParam(&params, kv[0], kv[1])
	}
	fcgiRecord(&req, fcgiParams, params.Bytes())
	fcgiRecord(&req, fcgiParams, nil)
	fcgiRecord(&req, fcgiStdin, nil)
	if _, err := c.Write(req.Bytes()); err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	for {
		var h [8]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return "", fmt.Errorf("reading a record header: %w", err)
		}
		n, pad := int(binary.BigEndian.Uint16(h[4:])), int(h[6])
		body := make([]byte, n+pad)
		if _, err := io.ReadFull(c, body); err != nil {
			return "", fmt.Errorf("reading a record: %w", err)
		}
		switch h[1] {
		case fcgiStdout:
			stdout.Write(body[:n])
		case fcgiStderr:
			stderr.Write(body[:n])
		case fcgiEndRequest:
			if stderr.Len() > 0 {
				return "", fmt.Errorf("stderr: %s", stderr.String())
			}
			_, out, found := bytes.Cut(stdout.Bytes(), []byte("\r\n\r\n"))
			if !found {
				return "", fmt.Errorf("no CGI headers in %q", stdout.String())
			}
			return string(out), nil
		}
	}
}
