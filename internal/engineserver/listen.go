package engineserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/ortrain/ortrain/internal/gateway"
)

// shutdownGrace bounds how long in-flight requests may finish after ctx ends.
const shutdownGrace = 10 * time.Second

// Run serves h on l until ctx ends, then shuts down: in-flight requests get
// shutdownGrace to finish before connections are closed. It returns nil
// after a shutdown, or the error that stopped serving.
func Run(ctx context.Context, l net.Listener, h http.Handler) error {
	return run(ctx, l, h, gateway.ConnLimits{})
}

func run(ctx context.Context, l net.Listener, h http.Handler, limits gateway.ConnLimits) error {
	hs := limits.Server(h)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(l) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		hs.Close()
	}
	return nil
}
