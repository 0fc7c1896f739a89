package envmcp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/peercred"
)

// maxMCPSessions bounds the MCP sessions one episode keeps: an agent that
// re-initializes without DELETE must not grow the map without bound. The
// oldest is ended first.
const maxMCPSessions = 16

// errDetached ends the calls of an episode whose rollout was detached.
var errDetached = errors.New("the rollout was detached")

// ToolCall is one tools/call the agent made, as recorded.
type ToolCall struct {
	Name string
	// Arguments are the call's arguments as sent ({} when absent).
	Arguments json.RawMessage
	// Result is the tool's text; empty on errors.
	Result   string
	Reward   *float64 // nil: the call gave no reward
	Finished bool     // the env said the episode is over
	// IsError: the tool refused or failed (an *envtarget.ToolError) and the
	// agent saw Err as an isError result.
	IsError bool
	// Err is the error's text: the tool's (IsError) or, with IsError
	// false, an infrastructure failure (the session failed, the call timed
	// out or was cancelled) answered with JSON-RPC error -32603.
	Err string
	// AfterFinish: the call came after the episode ended. It never
	// reached the env; the agent saw an isError result saying the episode
	// is over (Err).
	AfterFinish bool
	// Start is when the call reached the session (after any call before
	// it), End when it returned.
	Start, End time.Time
}

// Episode is one attached rollout: its session, its key, and the record of
// what the agent did. Safe for concurrent use.
type Episode struct {
	id      string
	keyHash [sha256.Size]byte
	hasKey  bool
	sess    envtarget.Session
	tools   []mcpTool
	timeout time.Duration
	now     func() time.Time
	log     zerolog.Logger
	// owner, when set, is the process tree the key is honoured from
	// (AttachOwned, owner.go).
	owner *peercred.Owner

	// turn holds one token: a Session serves one rollout, so its calls go
	// one at a time.
	turn chan struct{}
	// life is cancelled by Detach, ending calls in flight.
	life     context.Context
	endLife  context.CancelCauseFunc
	inflight sync.WaitGroup

	mu       sync.Mutex
	detached bool
	calls    []ToolCall
	// finishedCall is the 1-based number of the call that ended the
	// episode (0: not ended), finishedAt when it returned.
	finishedCall int
	finishedAt   time.Time
	afterFinish  int               // calls refused after the end
	mcpSessions  map[string]string // Mcp-Session-Id → negotiated version
	sessionOrder []string          // oldest first
}

func newEpisode(id, key string, sess envtarget.Session, tools []envtarget.ToolSpec, opts Options) *Episode {
	life, end := context.WithCancelCause(context.Background())
	return &Episode{
		id:          id,
		keyHash:     sha256.Sum256([]byte(key)),
		hasKey:      key != "",
		sess:        sess,
		tools:       mcpTools(tools, opts.ToolAnnotations, opts.Logger.With().Str("rollout", id).Logger()),
		timeout:     opts.CallTimeout,
		now:         opts.Now,
		log:         opts.Logger.With().Str("rollout", id).Logger(),
		turn:        make(chan struct{}, 1),
		life:        life,
		endLife:     end,
		mcpSessions: map[string]string{},
	}
}

// ID is the rollout id the episode is attached under.
func (e *Episode) ID() string { return e.id }

// Calls returns a copy of the recorded calls, in the order they ran.
func (e *Episode) Calls() []ToolCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]ToolCall, len(e.calls))
	for i, c := range e.calls {
		c.Arguments = append(json.RawMessage(nil), c.Arguments...)
		c.Reward = copyReward(c.Reward)
		out[i] = c
	}
	return out
}

// Rewards returns each recorded call's reward, parallel to Calls (nil: the
// call gave none, errors included).
func (e *Episode) Rewards() []*float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*float64, len(e.calls))
	for i, c := range e.calls {
		out[i] = copyReward(c.Reward)
	}
	return out
}

// Finished says whether a tool output said the episode is over.
func (e *Episode) Finished() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.finishedCall > 0
}

// FinishedAt is when the call that ended the episode returned (its End);
// ok is false while the episode has not ended. Model calls the agent made
// after it are past the episode.
func (e *Episode) FinishedAt() (t time.Time, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.finishedAt, e.finishedCall > 0
}

// CallsAfterFinish counts the tool calls the agent made after the episode
// ended: each was refused without reaching the env, and recorded in Calls
// with AfterFinish set.
func (e *Episode) CallsAfterFinish() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.afterFinish
}

func copyReward(r *float64) *float64 {
	if r == nil {
		return nil
	}
	v := *r
	return &v
}

// callOutcome is a recorded call and, for infrastructure failures, the
// error behind it.
type callOutcome struct {
	record   ToolCall
	infraErr error
}

// call runs one tool call on the session and records it. Calls after the
// env said finished are refused here: the episode's record and reward are
// settled, and a generic agent loop needs an answer that says to stop.
func (e *Episode) call(ctx context.Context, name string, args json.RawMessage) callOutcome {
	e.mu.Lock()
	if e.detached {
		e.mu.Unlock()
		// Not recorded: the record was final when Detach returned.
		return callOutcome{record: ToolCall{Name: name, Arguments: args}, infraErr: errDetached}
	}
	e.inflight.Add(1)
	e.mu.Unlock()
	defer e.inflight.Done()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(e.life, func() { cancel(context.Cause(e.life)) })
	defer stop()

	outcome := e.callInTurn(ctx, name, args)
	rec := outcome.record
	ev := e.log.Debug()
	if outcome.infraErr != nil {
		ev = e.log.Warn().Err(outcome.infraErr)
	}
	ev.Str("tool", name).Float64("took_s", rec.End.Sub(rec.Start).Round(time.Millisecond).Seconds()).Bool("is_error", rec.IsError).Bool("finished", rec.Finished).Bool("after_finish", rec.AfterFinish).Msg("mcp tool call")
	return outcome
}

// callInTurn waits for the session's turn, then calls it and records the
// call before giving the turn up: Start..End is the env's time, the spans
// of an episode's calls never overlap, and Calls lists them in that order.
func (e *Episode) callInTurn(ctx context.Context, name string, args json.RawMessage) callOutcome {
	rec := ToolCall{Name: name, Arguments: args}
	select {
	case e.turn <- struct{}{}:
	case <-ctx.Done():
		rec.Start = e.now()
		rec.End = rec.Start
		err := fmt.Errorf("wait for the session's previous call: %w", context.Cause(ctx))
		rec.Err = err.Error()
		e.record(rec)
		return callOutcome{record: rec, infraErr: err}
	}
	defer func() { <-e.turn }()
	// Checked in turn, so a call queued behind the one that ends the
	// episode is refused too.
	e.mu.Lock()
	ended := e.finishedCall
	e.mu.Unlock()
	if ended > 0 {
		rec.Start = e.now()
		rec.End = rec.Start
		rec.IsError, rec.AfterFinish = true, true
		rec.Err = fmt.Sprintf("the episode is over (it finished at tool call %d); end the episode", ended)
		e.record(rec)
		return callOutcome{record: rec}
	}
	rec.Start = e.now()
	out, err := e.callSession(ctx, name, args)
	rec.End = e.now()
	outcome := callOutcome{}
	switch {
	case err == nil:
		rec.Result, rec.Reward, rec.Finished = out.Text, copyReward(out.Reward), out.Finished
	case isToolError(err):
		rec.IsError, rec.Err = true, err.Error()
	default:
		rec.Err = err.Error()
		outcome.infraErr = err
	}
	outcome.record = rec
	e.record(rec)
	return outcome
}

// callSession calls the session under the call timeout (also bounded by
// ctx: the request, and the episode's life).
func (e *Episode) callSession(ctx context.Context, name string, args json.RawMessage) (*envtarget.ToolOutput, error) {
	cctx, cancel := context.WithTimeoutCause(ctx, e.timeout, fmt.Errorf("tool call %s timed out after %s", name, e.timeout))
	defer cancel()
	out, err := e.sess.CallTool(cctx, name, args)
	if err != nil {
		if isToolError(err) {
			return nil, err
		}
		if cause := context.Cause(cctx); cause != nil && !errors.Is(err, cause) {
			// Say why the context ended (timeout, detach, client gone),
			// not only that it did.
			return nil, fmt.Errorf("call tool %s: %w (%v)", name, err, cause)
		}
		return nil, fmt.Errorf("call tool %s: %w", name, err)
	}
	if out == nil {
		return nil, fmt.Errorf("call tool %s: the session returned no output", name)
	}
	return out, nil
}

func (e *Episode) record(rec ToolCall) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, rec)
	if rec.Finished && e.finishedCall == 0 {
		e.finishedCall, e.finishedAt = len(e.calls), rec.End
	}
	if rec.AfterFinish {
		e.afterFinish++
	}
}

// detach refuses new calls, cancels those in flight and waits for them to
// be recorded.
func (e *Episode) detach() {
	e.mu.Lock()
	e.detached = true
	e.mcpSessions, e.sessionOrder = map[string]string{}, nil
	e.mu.Unlock()
	e.endLife(errDetached)
	e.inflight.Wait()
}

// openMCPSession starts an MCP session with a random id.
func (e *Episode) openMCPSession(version string) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("draw an MCP session id: %w", err)
	}
	sid := hex.EncodeToString(b[:])
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.detached {
		return "", errDetached
	}
	if len(e.sessionOrder) >= maxMCPSessions {
		delete(e.mcpSessions, e.sessionOrder[0])
		e.sessionOrder = e.sessionOrder[1:]
	}
	e.mcpSessions[sid] = version
	e.sessionOrder = append(e.sessionOrder, sid)
	return sid, nil
}

func (e *Episode) hasMCPSession(sid string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.mcpSessions[sid]
	return ok
}

func (e *Episode) endMCPSession(sid string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.mcpSessions, sid)
	for i, id := range e.sessionOrder {
		if id == sid {
			e.sessionOrder = append(e.sessionOrder[:i:i], e.sessionOrder[i+1:]...)
			break
		}
	}
}

// isToolError says whether err is the tool's own failure (shown to the
// model) rather than the session's.
func isToolError(err error) bool {
	var te *envtarget.ToolError
	return errors.As(err, &te)
}
