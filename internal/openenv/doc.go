// Package openenv is ortrain's OpenEnv client: the HTTP endpoints (/health,
// /schema, /metadata, /mcp), one WebSocket /ws session per episode with
// reset/step/state/close and MCP JSON-RPC inside {"type":"mcp"} frames, the
// bare JSON-RPC /mcp WebSocket, and a probe that tells whether a URL speaks
// OpenEnv. The wire is the one the real openenv-core server speaks
// (openenv-protocol.md §2); the wire types are shared with the server kit in
// openenvserver.
//
// Every error the server can send has a typed form: *ServerError for
// {"type":"error"} frames (its Code says whether the socket survives),
// *RPCError for JSON-RPC errors, *ConnectionError for a socket that failed,
// *TimeoutError for a reply that never came, *HTTPError for HTTP statuses,
// *AuthError for a 401/403 (Options.Token is the bearer token sent on every
// request and upgrade) and *NotOpenEnvError from Probe.
//
// Frames that answer no request (frame types this client does not know,
// JSON-RPC notifications) are dropped and counted (IgnoredFrames), not
// fatal; capacity refusals that Start waits out are counted too
// (CapacityWaits).
package openenv
