package orsserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ortrain/ortrain/internal/ors"
)

// session is one sid's state: SETTING_UP until ready is closed, then READY
// (inst set) or FAILED (setupErr set); removed from the map when deleted.
type session struct {
	sid        string
	env        *servedEnv
	lastActive atomic.Int64 // unix nanos

	ready       chan struct{} // closed when setup finished
	inst        Instance      // valid after ready, nil if setup failed
	setupErr    error
	cancelSetup context.CancelFunc

	deleted    chan struct{}
	deleteOnce sync.Once
}

func (s *session) touch() { s.lastActive.Store(time.Now().UnixNano()) }

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (*session, bool) {
	sid, ok := requireSID(w, r)
	if !ok {
		return nil, false
	}
	v, ok := s.sessions.Load(sid)
	if !ok {
		writeDetail(w, http.StatusNotFound, "Active environment not found")
		return nil, false
	}
	sess := v.(*session)
	sess.touch()
	return sess, true
}

// awaitReady blocks until setup finished; on failure it answers and
// returns false.
func (s *Server) awaitReady(w http.ResponseWriter, r *http.Request, sess *session) (Instance, bool) {
	select {
	case <-sess.ready:
	case <-sess.deleted:
		writeDetail(w, http.StatusGone, "Session deleted")
		return nil, false
	case <-r.Context().Done():
		return nil, false
	}
	if sess.setupErr != nil {
		status, detail := errStatus(sess.setupErr)
		writeDetail(w, status, detail)
		return nil, false
	}
	return sess.inst, true
}

func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	sid := newSID()
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		writeJSON(w, http.StatusOK, map[string]string{"sid": sid})
		return
	}
	stream := startSSE(w)
	if stream.event("task_id", sid) == nil {
		_ = stream.event("end", "")
	}
}

func (s *Server) handlePing(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.lookup(w, r); ok {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	sid, ok := requireSID(w, r)
	if !ok {
		return
	}
	s.deleteSession(sid, "client")
	writeJSON(w, http.StatusOK, map[string]string{"sid": sid})
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) {
	sid, ok := requireSID(w, r)
	if !ok {
		return
	}
	body, ok := decodeBody(w, r, []bodyField{
		{name: "env_name", kind: kindString},
		{name: "task_spec", kind: kindObject},
		{name: "split", kind: kindString},
		{name: "index", kind: kindInt},
		{name: "secrets", kind: kindStringMap},
		{name: "toolset_name", kind: kindString},
	})
	if !ok {
		return
	}
	_, hasSpec := body["task_spec"]
	_, hasSplit := body["split"]
	_, hasIndex := body["index"]
	if hasSpec == (hasSplit || hasIndex) || hasSplit != hasIndex {
		unprocessable(w, "Value error, provide either task_spec, or both split and index", body)
		return
	}
	if name, ok := bodyString(body, "toolset_name"); ok {
		writeDetail(w, http.StatusBadRequest, fmt.Sprintf("unknown toolset '%s'", name))
		return
	}
	env := s.envs[0]
	if name, ok := bodyString(body, "env_name"); ok {
		if env, ok = s.byName[strings.ToLower(name)]; !ok {
			writeDetail(w, http.StatusNotFound, fmt.Sprintf("unknown environment '%s'", name))
			return
		}
	}
	secrets := map[string]string{}
	if v, ok := body["secrets"]; ok {
		_ = json.Unmarshal(v, &secrets)
	}
	headerSecrets, err := decodeSecrets(r.Header.Get("X-Secrets"))
	if err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	maps.Copy(secrets, headerSecrets) // header values win
	spec := body["task_spec"]
	if !hasSpec {
		split, _ := bodyString(body, "split")
		index, _ := bodyInt(body, "index")
		if spec, err = env.task(r.Context(), split, index); err != nil {
			status, detail := errStatus(err)
			writeDetail(w, status, detail)
			return
		}
	}
	switch s.startSession(sid, env, spec, secrets) {
	case startExists:
		writeDetail(w, http.StatusBadRequest, "Session already exists")
		return
	case startFull:
		// 503 is the busy answer ORS clients wait out and retry (ortrain's
		// and openreward's sessions policy retry 429/502/503/504).
		w.Header().Set("Retry-After", "1")
		writeDetail(w, http.StatusServiceUnavailable, fmt.Sprintf("Server at capacity: %d sessions open (the limit); retry after one ends", s.opts.MaxSessions))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"sid": sid})
}

// startOutcome is what startSession did.
type startOutcome int

const (
	startOK     startOutcome = iota
	startExists              // sid is live already
	startFull                // MaxSessions are open
)

// startSession registers sid and runs construction and setup in the
// background, unless sid is taken or every slot is.
func (s *Server) startSession(sid string, env *servedEnv, spec json.RawMessage, secrets map[string]string) startOutcome {
	if _, ok := s.sessions.Load(sid); ok {
		return startExists // before the capacity check: a duplicate is a client bug, not a wait
	}
	if !s.reserveSlot() {
		return startFull
	}
	ctx, cancel := context.WithCancel(s.baseCtx)
	sess := &session{sid: sid, env: env, ready: make(chan struct{}), deleted: make(chan struct{}), cancelSetup: cancel}
	sess.touch()
	if _, loaded := s.sessions.LoadOrStore(sid, sess); loaded {
		s.live.Add(-1)
		cancel()
		return startExists
	}
	s.created.Add(1)
	go func() {
		inst, err := s.setup(ctx, env, spec, secrets)
		sess.inst, sess.setupErr = inst, err
		close(sess.ready)
		if err != nil {
			s.log.Debug().Str("sid", sid).Err(err).Msg("session setup failed")
		}
	}()
	return startOK
}

// reserveSlot counts one more live session, unless MaxSessions are live.
// The live count is the slot count, so deleteSession frees the slot.
func (s *Server) reserveSlot() bool {
	limit := int64(s.opts.MaxSessions)
	if limit <= 0 {
		s.live.Add(1)
		return true
	}
	for {
		n := s.live.Load()
		if n >= limit {
			return false
		}
		if s.live.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (s *Server) setup(ctx context.Context, env *servedEnv, spec json.RawMessage, secrets map[string]string) (inst Instance, err error) {
	defer func() {
		if p := recover(); p != nil {
			inst, err = nil, fmt.Errorf("setup panicked: %v", p)
		}
	}()
	inst, err = env.New(ctx, spec, secrets)
	if err != nil {
		return nil, err
	}
	if su, ok := inst.(SetupInstance); ok {
		if err := su.Setup(ctx); err != nil {
			s.teardown(inst) // release what a partial setup acquired
			return nil, err
		}
	}
	return inst, nil
}

// deleteSession removes sid, cancels a running setup (waiters get 410) and
// tears the instance down; false if sid was not live.
func (s *Server) deleteSession(sid, why string) bool {
	v, ok := s.sessions.LoadAndDelete(sid)
	if !ok {
		return false
	}
	sess := v.(*session)
	s.live.Add(-1)
	s.deleted.Add(1)
	sess.deleteOnce.Do(func() { close(sess.deleted) })
	sess.cancelSetup()
	s.log.Debug().Str("sid", sid).Str("why", why).Msg("session deleted")
	select {
	case <-sess.ready:
		s.teardown(sess.inst)
	default:
		s.teardowns.Add(1)
		go func() {
			defer s.teardowns.Done()
			<-sess.ready
			s.teardown(sess.inst)
		}()
	}
	return true
}

func (s *Server) teardown(inst Instance) {
	td, ok := inst.(TeardownInstance)
	if !ok || inst == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.TeardownTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			s.log.Warn().Interface("panic", p).Msg("teardown panicked")
		}
	}()
	if err := td.Teardown(ctx); err != nil {
		s.log.Warn().Err(err).Msg("teardown failed")
	}
}

func (s *Server) handlePrompt(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.lookup(w, r)
	if !ok {
		return
	}
	inst, ok := s.awaitReady(w, r, sess)
	if !ok {
		return
	}
	blocks, err := inst.Prompt(r.Context())
	if err != nil {
		status, detail := errStatus(err)
		writeDetail(w, status, detail)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(blocks))
}

func (s *Server) handleTaskTools(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.lookup(w, r)
	if !ok {
		return
	}
	inst, ok := s.awaitReady(w, r, sess)
	if !ok {
		return
	}
	tools := append([]ors.ToolSpec{}, sess.env.listed...)
	if tt, ok := inst.(TaskToolsInstance); ok {
		for _, t := range tt.TaskTools() {
			tools = append(tools, t.Spec())
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tools": tools})
}

// decodeBase64 accepts standard base64 with or without padding.
func decodeBase64(s string) ([]byte, error) {
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}
