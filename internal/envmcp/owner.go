package envmcp

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/peercred"
)

// ownerWait bounds how long a request to an owned episode waits for
// BindOwner: the agent is started after its episode is attached and may
// call before its starter has bound it.
const ownerWait = 5 * time.Second

// AttachOwned is Attach for an episode whose key is honoured only from one
// process tree, named by BindOwner once the agent has started: agents run
// as one uid, and one may read a sibling's key from its environment. Where
// the platform cannot tell the calling process (not Linux) the key alone
// decides.
func (s *Server) AttachOwned(id, key string, sess envtarget.Session, tools []envtarget.ToolSpec) *Episode {
	return s.attach(id, key, sess, tools, peercred.NewOwner())
}

// BindOwner binds an episode attached with AttachOwned to the process tree
// of pid. It may be called once.
func (e *Episode) BindOwner(pid int) error {
	if e.owner == nil {
		return fmt.Errorf("bind rollout %q: it was attached without an owner (Attach, not AttachOwned)", e.id)
	}
	if err := e.owner.Bind(pid); err != nil {
		return fmt.Errorf("bind rollout %q: %w", e.id, err)
	}
	return nil
}

// ForeignProcess counts requests that presented an attached rollout's key
// from outside its agent's process tree (a stolen key), or before the
// episode was bound in time. They get the answer of a wrong key and touch
// no episode: another agent must not write into this one's session.
func (s *Server) ForeignProcess() int64 { return s.foreign.Load() }

// fromOwner reports whether r may use ep's key: always for an episode
// without an owner and where the platform cannot tell, else only from the
// owner's process tree. A refusal is counted and logged here.
func (s *Server) fromOwner(r *http.Request, ep *Episode) bool {
	if ep.owner == nil {
		return true
	}
	ctx, cancel := context.WithTimeoutCause(r.Context(), ownerWait, fmt.Errorf("no owner bound within %s", ownerWait))
	defer cancel()
	stop := context.AfterFunc(ep.life, cancel)
	defer stop()
	peer, err := ep.owner.Check(ctx, r)
	if err == nil {
		return true
	}
	s.foreign.Add(1)
	ev := s.log.Debug()
	if s.warnedForeign.CompareAndSwap(false, true) {
		ev = s.log.Warn() // once: a hostile agent must not flood the log
	}
	ev.Str("rollout", ep.id).Int("peer_pid", peer).Err(err).
		Msg("a rollout's MCP key was presented from outside its agent's process tree: refused as a wrong key")
	return false
}

// refuseKey is the answer to a missing, wrong or stolen key: the same in
// every case, so a caller learns nothing about open rollouts.
func refuseKey(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="ortrain"`)
	writeHTTPError(w, http.StatusUnauthorized, "missing or wrong bearer key for this rollout")
}
