package vllm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/vllmguard"
)

// replicaGuard is the vllmguard proxy in front of one start of a replica
// bound beyond loopback: vLLM's --api-key leaves its control routes open,
// so vLLM listens on 127.0.0.1 and the guard takes the requested address,
// requiring the key on every route. It lives and dies with that start.
type replicaGuard struct {
	g      *vllmguard.Guard
	port   int
	url    string // what other machines use
	cancel context.CancelFunc
	done   chan struct{}
	err    error // why Serve returned; read after done
}

// startGuard listens on host:port and serves a guard for upstream there.
// fixed: the port is the user's (BasePort+i) and must be free; otherwise
// port is the previous start's, tried first so a restart keeps its URL,
// and any free port is the fallback.
func startGuard(ctx context.Context, host string, port int, fixed bool, upstream, key string, log zerolog.Logger) (*replicaGuard, error) {
	g, err := vllmguard.New(vllmguard.Options{Upstream: upstream, APIKey: key, Logger: log})
	if err != nil {
		return nil, err
	}
	l, err := listenPublic(ctx, host, port, fixed)
	if err != nil {
		return nil, err
	}
	port = l.Addr().(*net.TCPAddr).Port
	gctx, cancel := context.WithCancel(context.Background())
	rg := &replicaGuard{g: g, port: port, url: "http://" + net.JoinHostPort(PublicHost(host), strconv.Itoa(port)),
		cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rg.done)
		if err := g.Serve(gctx, l); err != nil {
			rg.err = err
		}
	}()
	return rg, nil
}

func listenPublic(ctx context.Context, host string, port int, fixed bool) (net.Listener, error) {
	var lc net.ListenConfig
	addr := net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(port))
	l, err := lc.Listen(ctx, "tcp", addr)
	switch {
	case err == nil:
		return l, nil
	case fixed:
		return nil, &PortInUseError{Addr: addr, Err: err}
	case port == 0:
		return nil, fmt.Errorf("guard: listen on %s: %w", addr, err)
	}
	// The previous start's port was taken meanwhile: any free one will do.
	return listenPublic(ctx, host, 0, false)
}

// beginStop makes the guard stop accepting and start its bounded shutdown.
func (rg *replicaGuard) beginStop() { rg.cancel() }

// stop shuts the guard down and waits for it (at most the guard's
// shutdown timeout once the replica behind it is gone).
func (rg *replicaGuard) stop() {
	rg.cancel()
	<-rg.done
}

// exited is closed when the guard stopped serving; failure says why when
// that was not asked for.
func (rg *replicaGuard) exited() <-chan struct{} { return rg.done }

func (rg *replicaGuard) failure() error {
	if rg.err != nil {
		return rg.err
	}
	return errors.New("guard stopped serving")
}

// PublicHost is the host other machines use for a server bound to host. A
// wildcard bind (0.0.0.0, ::) listens on every address, none of which it
// names, so it is reached by this machine's hostname (as os.Hostname
// reports it: on clusters the name other nodes resolve; "" or an error
// leave the bind address, which then must be replaced by the reader). A
// named address or host is used as given.
func PublicHost(host string) string {
	bare := strings.Trim(host, "[]")
	if ip := net.ParseIP(bare); ip != nil && ip.IsUnspecified() {
		if name, err := os.Hostname(); err == nil && name != "" {
			return name
		}
	}
	return bare
}
