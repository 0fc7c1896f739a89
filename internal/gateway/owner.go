package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ErrRolloutNotOpen: BindOwner named a rollout that is not open.
var ErrRolloutNotOpen = errors.New("rollout not open")

// ownerWait bounds how long a request to a tenant that requires an owner
// waits for BindOwner: the agent is started after its tenant is opened and
// may call before its starter has bound it.
const ownerWait = 5 * time.Second

// BindOwner binds rollout id, opened with Tenant.RequireOwner, to the
// process tree of pid (its agent): from then on its key is honoured only
// on connections from pid or its descendants. It may be called once.
func (g *Gateway) BindOwner(id string, pid int) error {
	g.mu.Lock()
	ro := g.rollouts[id]
	g.mu.Unlock()
	switch {
	case ro == nil:
		return fmt.Errorf("bind rollout %q: %w", id, ErrRolloutNotOpen)
	case ro.owner == nil:
		return fmt.Errorf("bind rollout %q: it was opened without Tenant.RequireOwner", id)
	}
	if err := ro.owner.Bind(pid); err != nil {
		return fmt.Errorf("bind rollout %q: %w", id, err)
	}
	return nil
}

// ForeignProcess counts requests that presented an open rollout's key from
// a process outside its agent's process tree (a stolen key), or before the
// tenant was bound in time. They are refused as a wrong key is, and counted
// here rather than against the rollout: another agent must not get it
// masked.
func (g *Gateway) ForeignProcess() int64 { return g.foreign.Load() }

// fromOwner reports whether r may use ro's key: always for a tenant that
// requires no owner and where the platform cannot tell, else only from
// the owner's process tree. A refusal is counted and logged here.
func (g *Gateway) fromOwner(r *http.Request, ro *rollout) bool {
	if ro.owner == nil {
		return true
	}
	ctx, cancel := context.WithTimeoutCause(r.Context(), ownerWait, fmt.Errorf("no owner bound within %s", ownerWait))
	defer cancel()
	stop := context.AfterFunc(ro.ctx, func() { cancel() })
	defer stop()
	peer, err := ro.owner.Check(ctx, r)
	if err == nil {
		return true
	}
	g.foreign.Add(1)
	ev := g.log.Debug()
	if _, seen := g.noted.LoadOrStore("foreign-process", true); !seen {
		ev = g.log.Warn() // once: a hostile agent must not flood the log
	}
	ev.Str("rollout", ro.id).Int("peer_pid", peer).Err(err).
		Msg("a rollout's key was presented from outside its agent's process tree: refused as a wrong key, not counted against the rollout")
	return false
}
