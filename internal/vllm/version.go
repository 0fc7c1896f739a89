package vllm

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
)

// VersionResponse is the body of GET /version.
type VersionResponse struct {
	Version string `json:"version"`
}

// Version reads the server's version from GET /version (unguarded in every
// vLLM that has it). A server without the route answers "" and no error:
// the version only sharpens messages, it never gates a run.
func (c *Client) Version(ctx context.Context) (string, error) {
	var out VersionResponse
	err := c.do(ctx, http.MethodGet, "/version", nil, &out)
	var se *StatusError
	if errors.As(err, &se) && se.Code == http.StatusNotFound {
		return "", nil
	}
	return out.Version, err
}

// MinorVersion parses "0.14.0" (or "0.14.0rc1", "0.15.1.dev3+g…") into
// major and minor; ok is false for anything else ("" included).
func MinorVersion(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(parts[1])
	}
	minor, err2 := strconv.Atoi(parts[1][:digits])
	return major, minor, err1 == nil && err2 == nil && digits > 0
}

// PauseIgnoresMode reports whether a vLLM of this version is known to
// lack POST /pause?mode= (0.14 and older take wait_for_inflight_requests
// instead): there mode=wait is ignored, the pause aborts every in-flight
// request (other clients' too) and clears the prefix cache. Unknown
// versions report false.
func PauseIgnoresMode(version string) bool {
	major, minor, ok := MinorVersion(version)
	return ok && major == 0 && minor <= 14
}
