// Package peercred tells which local process is at the other end of a TCP
// connection a server accepted, and whether that process belongs to a given
// process tree. ortrain binds each rollout's gateway tenant and MCP endpoint
// to its agent's process tree with it: agents run as one uid, so a hostile
// agent can read a sibling's key from /proc/<pid>/environ, but it cannot
// make its own connections come from the sibling's processes.
//
// It is pure Go and reads procfs (Linux): the connection's client end is
// found in /proc/net/tcp{,6}, the process holding that socket among
// /proc/*/fd, and its ancestry through /proc/<pid>/stat. Elsewhere every
// lookup fails with ErrUnsupported and callers admit the request as before.
package peercred

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors of the lookups; callers branch on them with errors.Is.
var (
	// ErrUnsupported: this platform cannot tell (not Linux, or no procfs).
	ErrUnsupported = errors.New("peer process lookup is not supported on this platform")
	// ErrNotFound: no socket or process matches (the client is on another
	// host or in another network namespace, or it already closed).
	ErrNotFound = errors.New("peer process not found")
	// ErrForeign: the peer is outside the owner's process tree.
	ErrForeign = errors.New("request from outside the owner's process tree")
	// ErrUnbound: the owner was not bound in time.
	ErrUnbound = errors.New("owner process not bound")
)

// LookupTimeout bounds one connection's lookup when it is made for an
// HTTP request (RequestPID).
const LookupTimeout = 2 * time.Second

// ConnPID is the pid of the local process that holds the client end of c,
// a connection accepted by this process.
func ConnPID(ctx context.Context, c net.Conn) (int, error) {
	local, err := addrPort(c.LocalAddr())
	if err != nil {
		return 0, err
	}
	remote, err := addrPort(c.RemoteAddr())
	if err != nil {
		return 0, err
	}
	return PID(ctx, local, remote)
}

// PID is the pid of the local process holding the TCP socket whose local
// address is client and remote address is server: the client end of a
// connection this process accepted on server.
func PID(ctx context.Context, server, client netip.AddrPort) (int, error) {
	return lookupPID(ctx, unmap(server), unmap(client))
}

// IsDescendant reports whether process pid is ancestor or descends from it,
// following parent pids. A process whose parent exited was re-parented
// (to init or a subreaper) and no longer descends from its old ancestors.
func IsDescendant(pid, ancestor int) (bool, error) {
	if pid <= 0 || ancestor <= 0 {
		return false, fmt.Errorf("is %d a descendant of %d: pids must be positive", pid, ancestor)
	}
	return isDescendant(pid, ancestor)
}

// maxDepth bounds an ancestry walk: process trees are far shallower, and a
// walk that races with pid reuse must still end.
const maxDepth = 1024

// parseStat reads the parent pid from the text of /proc/<pid>/stat:
// "pid (comm) state ppid …". comm is whatever the process named itself,
// spaces and parentheses included, so the fields are read after the last
// ')'.
func parseStat(stat string) (ppid int, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse stat %.40q: no ')' closing the command name", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("parse stat %.40q: too few fields after the command name", stat)
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil || ppid < 0 {
		return 0, fmt.Errorf("parse stat: parent pid %q is not a pid", f[1])
	}
	return ppid, nil
}

func addrPort(a net.Addr) (netip.AddrPort, error) {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort(), nil
	}
	if a == nil {
		return netip.AddrPort{}, fmt.Errorf("%w: no address", ErrNotFound)
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: address %q: %v", ErrNotFound, a.String(), err)
	}
	return ap, nil
}

// unmap turns an IPv4-mapped IPv6 address (a dual-stack listener's view of
// an IPv4 client) into the IPv4 address the client's own socket shows.
func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// connKey is the context key of a connection's cached peer.
type connKey struct{}

// connPeer resolves a connection's peer once and keeps the answer: a
// connection's client end stays with the process that opened it.
type connPeer struct {
	conn net.Conn
	mu   sync.Mutex
	done bool
	pid  int
	err  error
}

// ConnContext is an http.Server ConnContext: it lets RequestPID resolve a
// connection's peer once for all its requests. Nothing is looked up until
// a request asks.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, &connPeer{conn: c})
}

// RequestPID is the pid of the local process that sent r, resolved within
// LookupTimeout; cached per connection when the server installed
// ConnContext, else looked up from r's addresses.
func RequestPID(r *http.Request) (int, error) {
	ctx, cancel := context.WithTimeout(r.Context(), LookupTimeout)
	defer cancel()
	if cp, ok := r.Context().Value(connKey{}).(*connPeer); ok {
		return cp.resolve(ctx)
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return 0, fmt.Errorf("%w: the request carries no local address", ErrNotFound)
	}
	server, err := addrPort(local)
	if err != nil {
		return 0, err
	}
	client, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return 0, fmt.Errorf("%w: remote address %q: %v", ErrNotFound, r.RemoteAddr, err)
	}
	return PID(ctx, server, client)
}

func (cp *connPeer) resolve(ctx context.Context) (int, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.done {
		return cp.pid, cp.err
	}
	pid, err := ConnPID(ctx, cp.conn)
	// A lookup cut short by its deadline may succeed next time; any other
	// answer is the connection's for good.
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		cp.done, cp.pid, cp.err = true, pid, err
	}
	return pid, err
}
