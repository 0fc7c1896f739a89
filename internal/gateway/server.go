package gateway

import (
	"net/http"
	"time"

	"github.com/ortrain/ortrain/internal/peercred"
)

// ConnLimits bound every connection of a server that serves the gateway
// (the agent gateway, serve-engine), so idle keep-alive connections and
// clients that send their body a byte at a time cannot hold sockets open.
// A zero field takes its default.
type ConnLimits struct {
	// Header bounds reading a request's headers (default 30 s).
	Header time.Duration
	// Request bounds reading a whole request, body included (default
	// 30 s): a 16 MiB body over any working link arrives well within it.
	// Writing the reply (a long generation, a stream) is not bounded by it.
	Request time.Duration
	// Idle closes a keep-alive connection with no request for this long
	// (default 60 s, as the env kit).
	Idle time.Duration
}

// Server returns an http.Server for h with the limits applied.
func (c ConnLimits) Server(h http.Handler) *http.Server {
	def := func(d, v time.Duration) time.Duration {
		if d > 0 {
			return d
		}
		return v
	}
	// ConnContext: a tenant bound to its agent's process tree
	// (Tenant.RequireOwner) resolves each connection's peer once.
	return &http.Server{Handler: h, ConnContext: peercred.ConnContext,
		ReadHeaderTimeout: def(c.Header, 30*time.Second),
		ReadTimeout:       def(c.Request, 30*time.Second),
		IdleTimeout:       def(c.Idle, 60*time.Second),
	}
}
