package envcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// maxBody bounds what a check reads of one answer.
const maxBody = 8 << 20

// exchange is one request and its whole answer.
type exchange struct {
	Status int
	Header http.Header
	Body   []byte
}

// do sends one request with its own deadline (timeout) and reads the
// whole answer; the error is a transport failure (no answer).
func do(ctx context.Context, o Options, method, url string, body []byte, header http.Header, timeout time.Duration) (*exchange, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	for k, vs := range o.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	for k, vs := range header {
		req.Header.Del(k)
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := o.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read the answer: %w", method, url, err)
	}
	return &exchange{Status: res.StatusCode, Header: res.Header, Body: b}, nil
}

// getJSON GETs url and, on HTTP 200, decodes the body into v.
func getJSON(ctx context.Context, o Options, url string, v any) (*exchange, error) {
	ex, err := do(ctx, o, http.MethodGet, url, nil, nil, o.RequestTimeout)
	if err != nil {
		return nil, err
	}
	if ex.Status == http.StatusOK {
		if err := json.Unmarshal(ex.Body, v); err != nil {
			return ex, fmt.Errorf("GET %s: HTTP 200 with a body that is not the JSON expected: %w", url, err)
		}
	}
	return ex, nil
}

// brief is b shortened for a verdict line.
func brief(b []byte) string {
	const n = 200
	s := string(bytes.TrimSpace(b))
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
