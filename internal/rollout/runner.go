package rollout

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/backoff"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// Options bound and shape every episode.
type Options struct {
	SystemPrompt string
	Sampling     engine.SamplingParams
	// MaxCompletionTokens is the budget for everything after the prompt
	// (assistant turns and tool turns).
	MaxCompletionTokens int
	// MaxToolIterations bounds the tool-calling turns (0: the first answer
	// is final).
	MaxToolIterations int
	// FinalAnswerTool, when set, receives a plain-text final answer as its
	// single string argument.
	FinalAnswerTool string
	// EnvChat overrides SystemPrompt, FinalAnswerTool and the chat spec's
	// HideTools and Kwargs for the rollouts of env i (nil: none do).
	EnvChat        []*EnvChat
	MaxConcurrency int
	EpisodeTimeout time.Duration
	CallTimeout    time.Duration
	// CloseTimeout bounds closing a session, also after cancellation.
	CloseTimeout time.Duration
	// MaxRetries reruns a rollout whose session died with its server (new
	// session, same task and seed) up to this many times; an unreachable
	// env is retried until it has been down for EnvDownTimeout. Waits start
	// at RetryBackoff and double, capped at 30 s.
	MaxRetries     int
	RetryBackoff   time.Duration
	EnvDownTimeout time.Duration
	// LogPrompts keeps each rollout's rendered prompt in its trajectory.
	LogPrompts bool
	Seed       int64
	Logger     zerolog.Logger
}

// Runner runs rollouts against a set of environments.
type Runner struct {
	envs []Opener
	gen  engine.Generator
	chat ChatSpec
	opts Options
	// Each attempt of a rollout gets its own engine session key, unique
	// across runners sharing a generator: a random prefix and a counter.
	sessionPrefix string
	sessions      atomic.Int64
}

// NewRunner builds a runner; envs are indexed by Task.Env.
func NewRunner(envs []Opener, gen engine.Generator, chat ChatSpec, opts Options) (*Runner, error) {
	switch {
	case chat.Tokenizer == nil || chat.Template == nil:
		return nil, fmt.Errorf("rollout: a tokenizer and a chat template are required")
	case len(envs) == 0:
		return nil, fmt.Errorf("rollout: no environments")
	case opts.MaxCompletionTokens < 1:
		return nil, fmt.Errorf("rollout: max completion tokens %d must be at least 1", opts.MaxCompletionTokens)
	case opts.EpisodeTimeout <= 0 || opts.CallTimeout <= 0:
		return nil, fmt.Errorf("rollout: episode and call timeouts must be positive")
	}
	if opts.MaxConcurrency < 1 {
		opts.MaxConcurrency = 1
	}
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = 10 * time.Second
	}
	var prefix [8]byte
	_, _ = rand.Read(prefix[:]) // crypto/rand.Read never fails (Go 1.24+)
	return &Runner{envs: envs, gen: gen, chat: chat, opts: opts, sessionPrefix: "rollout-" + hex.EncodeToString(prefix[:])}, nil
}

// RunAll runs every task, at most MaxConcurrency at once, and returns the
// trajectories in task order. A failed rollout never fails the batch; the
// caller decides from the outcomes. onDone (optional) is called as each
// rollout finishes, for progress reporting.
func (r *Runner) RunAll(ctx context.Context, tasks []Task, onDone func(*Trajectory)) []*Trajectory {
	return RunEach(ctx, tasks, r.opts.MaxConcurrency, func(i int, t Task) *Trajectory {
		seed := t.Seed
		if seed == 0 {
			seed = r.opts.Seed + int64(i) + 1
		}
		return r.Run(ctx, t, seed)
	}, onDone)
}

// RunEach runs run for every task, at most maxConcurrency at once, and
// returns the trajectories in task order; a task still waiting for a slot
// when ctx ends is canceled. onDone (optional) sees each trajectory as it
// ends, from the goroutine that ran it. Every runner of rollouts (ortrain's
// turn loop, a user's agent) schedules its tasks with it.
func RunEach(ctx context.Context, tasks []Task, maxConcurrency int, run func(i int, t Task) *Trajectory, onDone func(*Trajectory)) []*Trajectory {
	out := make([]*Trajectory, len(tasks))
	sem := make(chan struct{}, max(1, maxConcurrency))
	var wg sync.WaitGroup
	for i, t := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
				out[i] = run(i, t)
				<-sem
			case <-ctx.Done():
				out[i] = &Trajectory{Task: t, Outcome: OutcomeCanceled, Err: ctx.Err()}
			}
			if onDone != nil {
				onDone(out[i])
			}
		}()
	}
	wg.Wait()
	return out
}

// Run runs one episode. A rollout whose session died with its server is
// run again from the start with a new session (same task, same seed), so
// an env restart costs time, not samples.
func (r *Runner) Run(ctx context.Context, task Task, seed int64) *Trajectory {
	start := time.Now()
	b := backoff.New(r.opts.RetryBackoff, 30*time.Second)
	b.Jitter, b.Name, b.Logger, b.LogOver = 0.2, "rollout retry", r.opts.Logger, 5*time.Second
	var downSince time.Time
	for retries := 0; ; retries++ {
		tr := r.runOnce(ctx, task, seed)
		tr.Retries = retries
		if !r.retry(ctx, tr, retries, &downSince) || b.Wait(ctx) != nil {
			tr.Duration = time.Since(start)
			return tr
		}
		r.opts.Logger.Warn().Err(tr.Err).Str("outcome", string(tr.Outcome)).Int("task", task.Index).Int("retry", retries+1).Msg("rollout lost its env session; retrying with a new one")
	}
}

// retry decides whether a finished attempt is run again.
func (r *Runner) retry(ctx context.Context, tr *Trajectory, retries int, downSince *time.Time) bool {
	if ctx.Err() != nil || !tr.Outcome.Failed() || r.opts.RetryBackoff <= 0 {
		return false
	}
	var lost *envtarget.SessionLostError
	switch {
	case tr.Outcome == OutcomeUnreachable:
		if downSince.IsZero() {
			*downSince = time.Now()
		}
		return time.Since(*downSince) < r.opts.EnvDownTimeout
	case errors.As(tr.Err, &lost):
		return retries < r.opts.MaxRetries
	}
	return false
}

// runOnce runs one attempt of an episode on a new session.
func (r *Runner) runOnce(ctx context.Context, task Task, seed int64) *Trajectory {
	tr := &Trajectory{Task: task}
	if task.Env < 0 || task.Env >= len(r.envs) {
		tr.Outcome, tr.Err = OutcomeEnvError, fmt.Errorf("task refers to env %d of %d", task.Env, len(r.envs))
		return tr
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.EpisodeTimeout)
	defer cancel()

	// Opening is not cut short by cancellation (only by the call deadline):
	// a /create aborted mid-flight can leave a session the server created
	// but the client never learned of. Cancellation is checked right after.
	sess, err := r.callEnv(context.WithoutCancel(ctx), tr, func(cctx context.Context) (Session, error) {
		return r.envs[task.Env].OpenSession(cctx, envtarget.TaskRef{Split: task.Split, Index: task.Index, Secrets: task.Secrets})
	})
	if err != nil {
		r.fail(ctx, tr, fmt.Errorf("open session for %s task %d: %w", task.Split, task.Index, err))
		return tr
	}
	defer r.closeSession(sess, tr)
	if err := ctx.Err(); err != nil {
		r.fail(ctx, tr, err)
		return tr
	}

	ep := &episode{r: r, tr: tr, sess: sess, seed: seed, sessionKey: fmt.Sprintf("%s-%d", r.sessionPrefix, r.sessions.Add(1))}
	defer r.endSession(ep.sessionKey)
	if err := ep.run(ctx); err != nil {
		r.fail(ctx, tr, err)
	}
	return tr
}

// endSession lets a generator that keeps per-rollout state drop it now.
func (r *Runner) endSession(key string) {
	if err := EndEngineSession(r.gen, key, r.opts.CloseTimeout); err != nil {
		r.opts.Logger.Warn().Err(err).Str("session", key).Msg("end engine session")
	}
}

// EndEngineSession lets a generator that keeps per-rollout state (the
// builtin engine's KV cache) drop the rollout's now rather than when its
// budget evicts it; other generators keep nothing.
func EndEngineSession(gen engine.Generator, key string, timeout time.Duration) error {
	ender, ok := gen.(engine.SessionEnder)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return ender.EndSession(ctx, key)
}

// callEnv runs one ORS call under the per-call deadline and adds its time.
func (r *Runner) callEnv(ctx context.Context, tr *Trajectory, call func(context.Context) (Session, error)) (Session, error) {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	t0 := time.Now()
	s, err := call(cctx)
	tr.addEnv(t0)
	return s, err
}

func (r *Runner) fail(ctx context.Context, tr *Trajectory, err error) {
	tr.Err = err
	if tr.Outcome == "" || !tr.Outcome.Failed() {
		tr.Outcome = Classify(ctx, err)
	}
	r.opts.Logger.Debug().Err(err).Str("outcome", string(tr.Outcome)).Int("task", tr.Task.Index).Msg("rollout failed")
}

// closeSession always runs, with its own deadline, so cancelled runs still
// release their sessions.
func (r *Runner) closeSession(sess Session, tr *Trajectory) {
	if err := CloseSession(sess, r.opts.CloseTimeout); err != nil {
		r.opts.Logger.Warn().Err(err).Int("task", tr.Task.Index).Msg("close env session")
	}
}

// CloseSession closes sess under its own deadline, not the rollout's
// context: a cancelled or timed-out rollout still releases its session.
func CloseSession(sess Session, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return sess.Close(ctx)
}
