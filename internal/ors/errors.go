package ors

import (
	"fmt"
	"strings"
)

// AuthError is a 401 from an ORS server or the platform, or a catalog
// target used without an API key. It is never retried.
type AuthError struct {
	URL    string
	Detail string
	// MissingKey: no API key was given at all (a usage error, not a rejection).
	MissingKey bool
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("authentication failed at %s: %s", e.URL, e.Detail)
}

// UnreachableError means no connection could be made to the server.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach ORS server at %s: %v", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// StatusError is a non-2xx HTTP answer with the server's detail text.
type StatusError struct {
	Method     string
	URL        string
	StatusCode int
	Detail     string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.URL, e.StatusCode, e.Detail)
}

// NotFoundError is a 404: unknown env, session, route or deployment.
type NotFoundError struct {
	What   string // "session", "environment", "route"
	Detail string
	URL    string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("%s not found at %s: %s", e.What, e.URL, e.Detail)
}

// EnvNotFoundError is a self-hosted server that does not serve the target's
// env; Served lists the envs it does serve (the first is its default).
type EnvNotFoundError struct {
	Target  string
	BaseURL string
	Served  []string
	Err     error
}

func (e *EnvNotFoundError) Error() string {
	return fmt.Sprintf("environment %s not found (this server serves: %s; use %s/NAME): %v",
		e.Target, strings.Join(e.Served, ", "), e.BaseURL, e.Err)
}

func (e *EnvNotFoundError) Unwrap() error { return e.Err }

// InvalidRequestError is a 400/422 the server gave for a bad split, index,
// body or header; Detail is the server's text.
type InvalidRequestError struct {
	URL        string
	StatusCode int
	Detail     string
}

func (e *InvalidRequestError) Error() string {
	return fmt.Sprintf("rejected by %s (HTTP %d): %s", e.URL, e.StatusCode, e.Detail)
}

// ToolCallError is a tool-level failure: the call completed with ok:false.
// Reason is one of "not_found", "input_validation", "name_collision",
// "bad_input_shape" (inferred from the message when the server sent none).
type ToolCallError struct {
	Tool    string
	Reason  string
	Message string
}

func (e *ToolCallError) Error() string {
	return fmt.Sprintf("tool %q failed (%s): %s", e.Tool, e.Reason, e.Message)
}

// ToolFailedError is an SSE error event: the tool invocation itself raised
// (or a resumed call's task id was unknown).
type ToolFailedError struct {
	Tool    string
	Message string
}

func (e *ToolFailedError) Error() string {
	return fmt.Sprintf("tool %q raised: %s", e.Tool, e.Message)
}

// SessionTerminatedError means the session is gone: pings failed, the
// server reaped or deleted it (404/410), or it was closed.
type SessionTerminatedError struct {
	SID    string
	Reason string
	Err    error
}

func (e *SessionTerminatedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("session %s terminated: %s: %v", e.SID, e.Reason, e.Err)
	}
	return fmt.Sprintf("session %s terminated: %s", e.SID, e.Reason)
}

func (e *SessionTerminatedError) Unwrap() error { return e.Err }

// ProtocolError is a response that breaks the ORS wire format.
type ProtocolError struct {
	URL    string
	Detail string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("bad ORS response from %s: %s", e.URL, e.Detail)
}

// inferReason classifies an ok:false message the way newer Python clients
// do when the server sends no reason (§9.5).
func inferReason(msg string) string {
	switch {
	case strings.HasPrefix(msg, "Tool name collision"):
		return "name_collision"
	case strings.HasPrefix(msg, "Tool input validation error"):
		return "input_validation"
	}
	return "not_found"
}
