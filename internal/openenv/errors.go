package openenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ServerError is a {"type":"error"} frame. Code.EndsSession says whether the
// server closed the socket after it.
type ServerError struct {
	Code    ErrorCode
	Message string
	// Errors are the pydantic issues of a VALIDATION_ERROR.
	Errors []ValidationIssue
	// ActiveSessions and MaxSessions come with CAPACITY_REACHED.
	ActiveSessions, MaxSessions int
	// FactoryName comes with FACTORY_ERROR.
	FactoryName string
}

// Error reads like the reference client's RuntimeError.
func (e *ServerError) Error() string {
	msg := fmt.Sprintf("openenv server error: %s (code: %s)", e.Message, e.Code)
	for i, v := range e.Errors {
		if i == 3 {
			msg += fmt.Sprintf("; and %d more", len(e.Errors)-3)
			break
		}
		msg += "; " + v.String()
	}
	return msg
}

// RPCError is a JSON-RPC error object.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

func (e *RPCError) Error() string { return fmt.Sprintf("json-rpc error %d: %s", e.Code, e.Message) }

// ConnectionError is a socket or HTTP connection that failed: refused,
// dropped mid-episode, closed by the server with a code other than a reply.
type ConnectionError struct {
	Op string
	// CloseCode is the WebSocket close status the server sent, or -1 when
	// the connection died without one.
	CloseCode int
	Err       error
}

func (e *ConnectionError) Error() string {
	if e.CloseCode >= 0 {
		return fmt.Sprintf("openenv %s: connection closed (status %d): %v", e.Op, e.CloseCode, e.Err)
	}
	return fmt.Sprintf("openenv %s: %v", e.Op, e.Err)
}

func (e *ConnectionError) Unwrap() error { return e.Err }

// TimeoutError is a deadline that passed: no reply, no handshake or a
// write that did not finish in time. The session is closed after it
// because replies would no longer line up with requests.
type TimeoutError struct {
	Op    string
	After time.Duration
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("openenv %s: no answer within %s", e.Op, e.After)
}

func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// HTTPError is a non-200 HTTP reply.
type HTTPError struct {
	Method, URL string
	Status      int
	ContentType string
	Body        string
	// Detail holds FastAPI's 422 validation list, when the body has one.
	Detail []ValidationIssue
}

// Error shows a JSON body (clipped) but only the first line of anything
// else: a web server's HTML page says nothing useful past it.
func (e *HTTPError) Error() string {
	return fmt.Sprintf("openenv %s %s: HTTP %d: %s", e.Method, e.URL, e.Status, bodySummary(e.ContentType, []byte(e.Body)))
}

// AuthError is a 401 or 403: the server wants a token the client did not
// send, or refused the one it sent.
type AuthError struct {
	Method, URL string
	Status      int
	// TokenEnv is the variable the token is read from ("" when unknown);
	// TokenSent says whether a token went with the request.
	TokenEnv  string
	TokenSent bool
}

func (e *AuthError) Error() string {
	msg := fmt.Sprintf("openenv %s %s: HTTP %d: ", e.Method, e.URL, e.Status)
	switch {
	case e.TokenEnv == "" && !e.TokenSent:
		return msg + "the server wants a token: name the environment variable that holds it with the env's token_env (--token-env)"
	case e.TokenEnv == "":
		return msg + "the server refused the token"
	case !e.TokenSent:
		return msg + fmt.Sprintf("the server wants a token: set %s (it is not set)", e.TokenEnv)
	}
	return msg + fmt.Sprintf("the server refused the token in %s (it is set): check that it grants access to this server", e.TokenEnv)
}

// ProtocolError is a reply that breaks the wire format.
type ProtocolError struct {
	Detail string
	Frame  string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("openenv protocol error: %s (frame %q)", e.Detail, e.Frame)
}

// NotOpenEnvError says a URL does not speak OpenEnv, and why.
type NotOpenEnvError struct {
	URL    string
	Reason string
	Err    error
}

func (e *NotOpenEnvError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s is not an OpenEnv server: %s: %v", e.URL, e.Reason, e.Err)
	}
	return fmt.Sprintf("%s is not an OpenEnv server: %s", e.URL, e.Reason)
}

func (e *NotOpenEnvError) Unwrap() error { return e.Err }

// bodySummary is a reply body fit for a message: JSON clipped, other text
// reduced to its content type and first line.
func bodySummary(contentType string, body []byte) string {
	mt := strings.ToLower(strings.TrimSpace(strings.Split(contentType, ";")[0]))
	if mt == "" || mt == "application/json" || strings.HasSuffix(mt, "+json") {
		if json.Valid(body) {
			return clip(body)
		}
	}
	line := TextLine(contentType, body)
	if mt == "" {
		mt = "no content type"
	}
	return fmt.Sprintf("%s, first line %q", mt, line)
}

// ErrSessionClosed is returned by calls on a session after Close.
var ErrSessionClosed = errors.New("openenv session is closed")

// IsCapacity reports whether err is a capacity refusal (CAPACITY_REACHED
// or JSON-RPC -32000).
func IsCapacity(err error) bool {
	var se *ServerError
	if errors.As(err, &se) {
		return se.Code == CodeCapacityReached
	}
	var re *RPCError
	return errors.As(err, &re) && re.Code == RPCCapacity
}

// IsInfrastructure reports whether err is an infrastructure failure rather
// than the model's doing: capacity, a dead or silent server, a broken
// session, a protocol violation. Errors the model caused (validation,
// execution, JSON-RPC tool errors) are not.
func IsInfrastructure(err error) bool {
	if err == nil {
		return false
	}
	var se *ServerError
	if errors.As(err, &se) {
		return se.Code.EndsSession()
	}
	var ce *ConnectionError
	var te *TimeoutError
	var pe *ProtocolError
	var he *HTTPError
	switch {
	case errors.As(err, &ce), errors.As(err, &te), errors.As(err, &pe), errors.Is(err, ErrSessionClosed):
		return true
	case errors.As(err, &he):
		return he.Status >= 500 || he.Status == 429
	}
	return IsCapacity(err)
}

// TextLine is the first line of text of a reply body, cut to 80
// characters: enough to recognise a page without dumping it. An HTML page
// (a web server's error page where an env was expected) gives its title,
// else its text without tags.
func TextLine(contentType string, body []byte) string {
	text := string(body)
	mt := strings.ToLower(strings.TrimSpace(strings.Split(contentType, ";")[0]))
	if mt == "text/html" || strings.HasPrefix(strings.TrimSpace(text), "<") {
		text = htmlText(text)
	}
	for _, line := range strings.Split(text, "\n") {
		line = strings.Join(strings.Fields(line), " ")
		if line == "" {
			continue
		}
		if r := []rune(line); len(r) > 80 {
			line = string(r[:80]) + "…"
		}
		return line
	}
	return ""
}

// htmlText is an HTML page's <title>, else its text with the tags removed.
func htmlText(page string) string {
	lower := strings.ToLower(page)
	if i := strings.Index(lower, "<title>"); i >= 0 {
		if j := strings.Index(lower[i:], "</title>"); j > len("<title>") {
			return page[i+len("<title>") : i+j]
		}
	}
	var b strings.Builder
	inTag := false
	for _, r := range page {
		switch {
		case r == '<':
			inTag = true
			b.WriteRune(' ')
		case r == '>':
			inTag = false
		case !inTag:
			b.WriteRune(r)
		}
	}
	return b.String()
}
