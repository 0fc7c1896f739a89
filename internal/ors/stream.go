package ors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
)

// sseState carries what a resumable SSE exchange learned across attempts.
type sseState struct {
	taskID   string          // from the task_id event; sent back on retry
	buf      strings.Builder // chunk + end data of the current attempt
	ended    bool
	jsonBody []byte // a JSON (non-SSE) 2xx answer
	okStatus bool   // some attempt got a 2xx
}

// errorEvent is an SSE "error" event: a terminal failure, never retried.
type errorEvent struct{ msg string }

func (e *errorEvent) Error() string { return e.msg }

var errStreamEnded = errors.New("stream ended before its end event")

// sseLoop runs attempts of an SSE POST until an end event, a fatal error or
// more than retries retries. body builds each attempt's request body from
// the task id seen so far.
func (c *Client) sseLoop(ctx context.Context, path, sid, secrets string, retries int, body func(taskID string) any) (*sseState, error) {
	st := &sseState{}
	bo := c.newBackoff(500 * time.Millisecond)
	for retry := 0; ; retry++ {
		err := c.sseOnce(ctx, path, sid, secrets, body(st.taskID), st)
		if err == nil {
			return st, nil
		}
		if st.okStatus {
			bo.Reset() // the server answered: back off from the start again
		}
		if !retryable(err) || ctx.Err() != nil {
			return st, err
		}
		if retry >= retries {
			return st, fmt.Errorf("%s: giving up after %d retries: %w", path, retries, err)
		}
		c.noteCapacity(err)
		c.log.Debug().Err(err).Int("retry", retry+1).Str("path", path).Str("task_id", st.taskID).Msg("retrying ORS stream")
		if werr := bo.Wait(ctx); werr != nil {
			return st, err
		}
	}
}

// sseOnce is one attempt; a silence longer than ReadTimeout (headers
// included) aborts it as a retryable network error.
func (c *Client) sseOnce(ctx context.Context, path, sid, secrets string, body any, st *sseState) error {
	st.buf.Reset()
	u := c.sessions + path
	payload, err := MarshalJSON(body)
	if err != nil {
		return fmt.Errorf("encode %s body: %w", path, err)
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	silence := &networkError{err: fmt.Errorf("POST %s: no data for %s", u, c.opts.ReadTimeout)}
	timer := time.AfterFunc(c.opts.ReadTimeout, func() { cancel(silence) })
	defer timer.Stop()

	hr, err := http.NewRequestWithContext(actx, http.MethodPost, u, bytes.NewReader(payload))
	if err != nil {
		return fmt.Errorf("build POST %s: %w", path, err)
	}
	c.setHeaders(hr, sid, secrets, true)
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	resp, err := c.http.Do(hr)
	if err != nil {
		return c.transportError(actx, http.MethodPost, u, err)
	}
	defer resp.Body.Close()
	timer.Reset(c.opts.ReadTimeout)
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return statusError(http.MethodPost, u, resp.StatusCode, b, sid)
	}
	st.okStatus = true
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return c.transportError(actx, http.MethodPost, u, err)
		}
		st.jsonBody, st.ended = b, true
		return nil
	}
	r := NewSSEReader(&touchReader{r: resp.Body, timer: timer, d: c.opts.ReadTimeout})
	for {
		ev, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return &networkError{err: fmt.Errorf("POST %s: %w", u, errStreamEnded)}
			}
			return c.transportError(actx, http.MethodPost, u, err)
		}
		switch ev.Name {
		case "task_id":
			st.taskID = ev.Data
		case "chunk":
			st.buf.WriteString(ev.Data)
		case "end":
			st.buf.WriteString(ev.Data)
			st.ended = true
			return nil
		case "error":
			return &errorEvent{msg: ev.Data}
		}
	}
}

// touchReader pushes the silence deadline back on every read.
type touchReader struct {
	r     io.Reader
	timer *time.Timer
	d     time.Duration
}

func (t *touchReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.timer.Reset(t.d)
	}
	return n, err
}

// createSession obtains a sid: SSE task_id (or {"sid"} in end), or a JSON
// {"sid"} body from spec-guide servers.
func (c *Client) createSession(ctx context.Context, secrets string) (string, error) {
	st, err := c.sseLoop(ctx, "/create_session", "", secrets, c.opts.CreateRetries, func(taskID string) any {
		if taskID != "" {
			return map[string]string{"task_id": taskID}
		}
		return map[string]string{}
	})
	if err != nil {
		var ev *errorEvent
		if errors.As(err, &ev) {
			return "", &ProtocolError{URL: c.sessions + "/create_session", Detail: "session creation failed: " + ev.msg}
		}
		return "", err // sseLoop's error already names /create_session
	}
	var withSID struct {
		SID string `json:"sid"`
	}
	if st.jsonBody != nil {
		if json.Unmarshal(st.jsonBody, &withSID) == nil && withSID.SID != "" {
			return withSID.SID, nil
		}
		return "", &ProtocolError{URL: c.sessions + "/create_session", Detail: "JSON answer has no sid"}
	}
	if end := st.buf.String(); end != "" && json.Unmarshal([]byte(end), &withSID) == nil && withSID.SID != "" {
		return withSID.SID, nil
	}
	if st.taskID == "" {
		return "", &ProtocolError{URL: c.sessions + "/create_session", Detail: "stream ended without a task_id event"}
	}
	return st.taskID, nil
}

// deleteSession releases a sid (errors ignored, as the Python clients do).
func (c *Client) deleteSession(ctx context.Context, sid string) {
	_ = c.do(ctx, request{method: http.MethodPost, path: "/delete_session", sid: sid, noDeployment: true, attempts: 1}, nil)
}
