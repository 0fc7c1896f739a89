package envmcp

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// MCP protocol revisions, as read in the specification repository
// (modelcontextprotocol/modelcontextprotocol, 2026-08) and the official
// SDKs (typescript-sdk, python-sdk, go-sdk, 2026-08):
//
//   - Legacy revisions open a session with initialize (2024-11-05,
//     2025-03-26, 2025-06-18, 2025-11-25). Streamable HTTP came with
//     2025-03-26; the MCP-Protocol-Version header with 2025-06-18. The
//     TypeScript SDK 1.x offers 2025-11-25 and accepts back to 2024-10-07.
//   - 2026-07-28 is stateless: no initialize, no Mcp-Session-Id. Every
//     request carries io.modelcontextprotocol/protocolVersion (and
//     clientCapabilities) in params._meta, and on HTTP the headers
//     MCP-Protocol-Version, Mcp-Method and (tools/call) Mcp-Name, which must
//     match the body (else 400, -32020 HeaderMismatch). Servers must answer
//     server/discover with {resultType, supportedVersions, capabilities,
//     _meta serverInfo, ttlMs, cacheScope}; every result carries resultType;
//     an unsupported version is 400 with -32022 {supported, requested}; an
//     unknown method is 404 with -32601.
//   - The 2026 SDK clients (TypeScript 2.x, Python 2.x, Go) first probe
//     server/discover at 2026-07-28 and fall back to initialize (offering
//     2025-11-25) on any answer that is not a recognised modern one.
//
// This server speaks both eras: a rollout's URL and key already name its
// state, so the stateless revision needs no session, and legacy clients get
// the initialize handshake they expect.
const (
	// firstModernVersion starts the stateless era; later revisions are
	// compared as ISO dates, as the SDKs do.
	firstModernVersion = "2026-07-28"
	// latestLegacyVersion is what initialize answers a client whose version
	// this server does not speak.
	latestLegacyVersion = "2025-11-25"
)

// modernVersions are the stateless revisions served, newest first.
func modernVersions() []string { return []string{"2026-07-28"} }

// legacyVersions are the initialize revisions served, newest first.
func legacyVersions() []string {
	return []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}
}

// supportedVersions lists every revision served, newest first: what
// server/discover and -32022 errors advertise.
func supportedVersions() []string { return append(modernVersions(), legacyVersions()...) }

func isModernVersion(v string) bool { return v >= firstModernVersion }

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// negotiateVersion answers initialize: the client's revision when it is a
// legacy one served here, else the latest legacy one (initialize never
// counter-offers a stateless revision; the client then decides whether to
// go on).
func negotiateVersion(client string) string {
	if contains(legacyVersions(), client) {
		return client
	}
	return latestLegacyVersion
}

// Keys of the per-request _meta envelope (2026-07-28) and of results.
const (
	metaProtocolVersion    = "io.modelcontextprotocol/protocolVersion"
	metaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
	metaServerInfo         = "io.modelcontextprotocol/serverInfo"
)

// Methods and headers of the 2026-07-28 revision.
const (
	methodDiscover = "server/discover"
	headerMethod   = "Mcp-Method"
	headerName     = "Mcp-Name"
)

// MCP error codes (2026-07-28 reserves -32020..-32099 for these).
const (
	codeHeaderMismatch     = -32020
	codeUnsupportedVersion = -32022
)

// unsupportedVersion is the -32022 error naming what this server speaks.
func unsupportedVersion(requested string) *rpcError {
	return &rpcError{
		Code:    codeUnsupportedVersion,
		Message: fmt.Sprintf("Unsupported protocol version %q (supported: %s)", requested, strings.Join(supportedVersions(), ", ")),
		Data:    map[string]any{"supported": supportedVersions(), "requested": requested},
	}
}

// envelopeClaim is the protocol version a request claims in its _meta:
// present says the client speaks a stateless revision.
func (m *rpcMessage) envelopeClaim() (version string, present bool, rerr *rpcError) {
	raw, ok := m.meta[metaProtocolVersion]
	if !ok {
		return "", false, nil
	}
	if json.Unmarshal(raw, &version) != nil || version == "" {
		return "", true, &rpcError{Code: codeInvalidParams, Message: "Invalid params: _meta." + metaProtocolVersion + " must be a non-empty string"}
	}
	return version, true, nil
}

// checkEnvelope applies the 2026-07-28 rule that a request's _meta carries
// clientCapabilities (an object) beside the version.
func (m *rpcMessage) checkEnvelope() *rpcError {
	raw, ok := m.meta[metaClientCapabilities]
	if !ok || len(raw) == 0 || raw[0] != '{' {
		return &rpcError{Code: codeInvalidParams, Message: "Invalid params: _meta." + metaClientCapabilities + " (an object) is required on every " + firstModernVersion + " request"}
	}
	return nil
}

// checkModernHeaders applies the 2026-07-28 Streamable HTTP rule that the
// standard headers are present and match the body (a gateway may have
// routed on them).
func checkModernHeaders(h http.Header, m *rpcMessage, version string) *rpcError {
	mismatch := func(format string, a ...any) *rpcError {
		return &rpcError{Code: codeHeaderMismatch, Message: "Header mismatch: " + fmt.Sprintf(format, a...)}
	}
	if got := h.Values(headerProtocolVersion); len(got) != 1 || got[0] != version {
		return mismatch("MCP-Protocol-Version header %q does not match _meta.%s %q", strings.Join(got, ", "), metaProtocolVersion, version)
	}
	if got := h.Values(headerMethod); len(got) != 1 || got[0] != m.method {
		return mismatch("Mcp-Method header %q does not match method %q", strings.Join(got, ", "), m.method)
	}
	if !m.hasTarget {
		return nil
	}
	got := h.Values(headerName)
	if len(got) != 1 {
		return mismatch("Mcp-Name header is required once on %s (got %d)", m.method, len(got))
	}
	name, ok := decodeHeaderValue(got[0])
	if !ok || name != m.target {
		return mismatch("Mcp-Name header %q does not match %q", got[0], m.target)
	}
	return nil
}

// decodeHeaderValue undoes the =?base64?...?= sentinel the spec uses for
// header values that are not plain ASCII.
func decodeHeaderValue(v string) (string, bool) {
	inner, ok := strings.CutPrefix(v, "=?base64?")
	if !ok {
		return v, true
	}
	inner, ok = strings.CutSuffix(inner, "?=")
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(inner)
	if err != nil {
		return "", false
	}
	return string(b), true
}
