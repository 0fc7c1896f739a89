package rollout

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/backoff"
	"github.com/ortrain/ortrain/internal/chat"
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

// EnvChat is how the conversations of one env's rollouts look: the chat
// settings an env entry can set for itself.
type EnvChat struct {
	SystemPrompt    string
	FinalAnswerTool string
	HideTools       bool
	Kwargs          map[string]any
}

// envChat is the episode's env's own chat settings (nil: the runner's).
func (e *episode) envChat() *EnvChat {
	if i := e.tr.Task.Env; i < len(e.r.opts.EnvChat) {
		return e.r.opts.EnvChat[i]
	}
	return nil
}

func (e *episode) finalAnswerTool() string {
	if ec := e.envChat(); ec != nil {
		return ec.FinalAnswerTool
	}
	return e.r.opts.FinalAnswerTool
}

// episode is the state of one running turn loop.
type episode struct {
	r     *Runner
	tr    *Trajectory
	sess  Session
	conv  *chat.Conversation
	tools []envtarget.ToolSpec
	// keep is how many tokens of the conversation belong to the trajectory
	// (a tool turn that overflowed the budget is cut off); -1 = all.
	keep int
	seed int64
	done bool
	// sessionKey names this attempt's turns to the engine (engine.Request.SessionKey).
	sessionKey string
}

func (e *episode) run(ctx context.Context) error {
	r, tr := e.r, e.tr
	prompt, tools, err := e.start(ctx)
	if err != nil {
		return err
	}
	tr.Prompt, e.tools, e.keep = prompt, tools, -1
	system := r.opts.SystemPrompt
	chatSpec := r.chat
	if ec := e.envChat(); ec != nil {
		system, chatSpec.HideTools, chatSpec.Kwargs = ec.SystemPrompt, ec.HideTools, ec.Kwargs
	}
	for _, t := range tools {
		tr.ToolsOffered = append(tr.ToolsOffered, t.Name)
	}
	tr.ToolsRendered = !chatSpec.HideTools && len(tools) > 0
	if tr.ToolsRendered {
		tr.ToolsSHA256 = toolsDigest(chatTools(tools))
	}
	conv, err := chatSpec.newConversation(system, prompt, tools)
	if err != nil {
		tr.Outcome = OutcomeRenderError
		return fmt.Errorf("render prompt: %w", err)
	}
	e.conv = conv
	promptLen := len(conv.PromptIDs())
	if r.opts.LogPrompts {
		tr.PromptText = r.chat.Tokenizer.Decode(conv.PromptIDs(), false)
	}
	defer e.snapshot(promptLen)
	for iter := 0; ; iter++ {
		ids := conv.IDs()
		budget := r.opts.MaxCompletionTokens - (len(ids) - promptLen)
		if budget <= 0 {
			tr.Outcome = OutcomeTruncated
			return nil
		}
		res, err := e.generate(ctx, ids, budget, iter)
		if err != nil {
			tr.Outcome = OutcomeGenError
			if ctx.Err() != nil {
				tr.Outcome = Classify(ctx, ctx.Err())
			}
			return fmt.Errorf("generate turn %d: %w", iter, err)
		}
		msg, perr := conv.AppendSampled(res.IDs)
		tr.Logprobs = append(tr.Logprobs, res.Logprobs...)
		tr.Turns = append(tr.Turns, Turn{Role: "assistant", Text: r.chat.Tokenizer.Decode(res.IDs, false), ToolCalls: turnCalls(msg.ToolCalls)})
		if res.StopReason == engine.StopLength {
			tr.Outcome = OutcomeTruncated
			if e.finalAnswerTool() != "" {
				return e.submitFinal(ctx, msg.Content, OutcomeTruncated)
			}
			return nil
		}
		if perr != nil {
			tr.FormatErrors++
			tr.Turns[len(tr.Turns)-1].FormatError = true
		}
		actor, textAction := e.sess.(envtarget.TextActor)
		if len(msg.ToolCalls) == 0 && perr == nil && !textAction {
			return e.submitFinal(ctx, msg.Content, OutcomeStopped)
		}
		if iter >= r.opts.MaxToolIterations {
			tr.Outcome = OutcomeIterations
			return nil
		}
		var turn []chat.Message
		if textAction {
			// The plain answer is the env's action; its observation is the
			// next user turn.
			obs, err := e.textAction(ctx, actor, msg.Content)
			if err != nil {
				return err
			}
			turn = []chat.Message{{Role: "user", Content: obs}}
		} else {
			results, err := e.callTools(ctx, msg.ToolCalls, perr)
			if err != nil {
				return err
			}
			turn = toolMessages(results)
		}
		if stop, err := e.appendTurn(promptLen, turn); stop || err != nil {
			return err
		}
		if e.done {
			tr.Outcome = OutcomeDone
			return nil
		}
	}
}

// start reads the prompt and the session's own tools (task-scoped ones included).
func (e *episode) start(ctx context.Context) (string, []envtarget.ToolSpec, error) {
	var prompt string
	var tools []envtarget.ToolSpec
	_, err := e.r.callEnv(ctx, e.tr, func(cctx context.Context) (Session, error) {
		var err error
		if prompt, err = e.sess.Prompt(cctx); err != nil {
			return nil, fmt.Errorf("get prompt: %w", err)
		}
		if tools, err = e.sess.Tools(cctx); err != nil {
			return nil, fmt.Errorf("list tools: %w", err)
		}
		return nil, nil
	})
	if err != nil {
		return "", nil, err
	}
	return prompt, tools, nil
}

func (e *episode) generate(ctx context.Context, ids []int32, budget, iter int) (engine.Result, error) {
	t0 := time.Now()
	defer func() { e.tr.addGen(t0) }()
	seed := e.seed
	if seed != 0 {
		seed = seed*1000003 + int64(iter)
	}
	return e.r.gen.Generate(ctx, engine.Request{
		PromptIDs:  ids,
		MaxTokens:  budget,
		Sampling:   e.r.opts.Sampling,
		StopIDs:    e.r.chat.stopIDs(),
		Seed:       seed,
		SessionKey: e.sessionKey,
	})
}

// submitFinal handles a plain-text answer: it is submitted to the
// final-answer tool when one is configured, else the episode simply ends.
func (e *episode) submitFinal(ctx context.Context, content string, outcome Outcome) error {
	e.tr.Outcome = outcome
	tool := e.finalAnswerTool()
	if tool == "" {
		return nil
	}
	args, _ := json.Marshal(map[string]string{e.finalAnswerArg(tool): strings.TrimSpace(content)})
	if _, err := e.callTool(ctx, ToolCall{Name: tool, Arguments: args}); err != nil {
		return err
	}
	if e.done && outcome != OutcomeTruncated {
		e.tr.Outcome = OutcomeDone
	}
	return nil
}

// finalAnswerArg names the argument that receives a plain-text answer:
// the schema's only property, else its first string property by name, else
// "answer".
func (e *episode) finalAnswerArg(tool string) string {
	for _, t := range e.tools {
		if t.Name != tool {
			continue
		}
		var schema struct {
			Properties map[string]struct {
				Type string `json:"type"`
			} `json:"properties"`
		}
		if json.Unmarshal(t.InputSchema, &schema) != nil {
			break
		}
		names := slices.Sorted(maps.Keys(schema.Properties))
		if len(names) == 1 {
			return names[0]
		}
		for _, n := range names {
			if schema.Properties[n].Type == "string" {
				return n
			}
		}
	}
	return "answer"
}

// callTools runs the model's calls in order. A parse error becomes one
// Error: tool message; tool-level failures become Error: text for the model
// and are counted; transport failures end the episode.
func (e *episode) callTools(ctx context.Context, calls []ToolCall, perr error) ([]chat.ToolResult, error) {
	results := make([]chat.ToolResult, 0, len(calls)+1)
	for _, c := range calls {
		res, err := e.callTool(ctx, c)
		if err != nil {
			return nil, err
		}
		results = append(results, res)
	}
	// A malformed call, or one whose arguments break its tool's schema, is
	// answered, not executed: the model sees why, the trajectory records it.
	var failed chat.ToolCallErrors
	if perr != nil && !errors.As(perr, &failed) {
		failed = chat.ToolCallErrors{{Reason: perr.Error()}}
	}
	for _, pe := range failed {
		e.tr.ToolFailures++
		e.tr.Turns = append(e.tr.Turns, Turn{Role: "tool", Tool: pe.Name, Error: pe.Error()})
		name := pe.Name
		if name == "" {
			name = "error"
		}
		results = append(results, chat.ToolResult{ToolCallID: pe.ID, Name: name, Content: errText(fmt.Errorf("could not parse your tool call: %w", pe))})
	}
	return results, nil
}

func (e *episode) callTool(ctx context.Context, c ToolCall) (chat.ToolResult, error) {
	tr := e.tr
	tr.ToolCalls++
	input := c.Arguments
	if len(input) == 0 || string(input) == "null" {
		input = json.RawMessage("{}")
	}
	var out *envtarget.ToolOutput
	_, err := e.r.callEnv(ctx, tr, func(cctx context.Context) (Session, error) {
		var err error
		out, err = e.sess.CallTool(cctx, c.Name, input)
		return nil, err
	})
	var toolErr *envtarget.ToolError
	switch {
	case errors.As(err, &toolErr):
		// The tool ran (or refused the input): the model sees the error.
		tr.ToolFailures++
		tr.Rewards = append(tr.Rewards, nil)
		tr.Turns = append(tr.Turns, Turn{Role: "tool", Tool: c.Name, Error: err.Error()})
		return chat.ToolResult{ToolCallID: c.ID, Name: c.Name, Content: errText(err)}, nil
	case err != nil:
		return chat.ToolResult{}, fmt.Errorf("call tool %s: %w", c.Name, err)
	}
	text := out.Text
	if text == "" {
		text = "(no output)"
	}
	tr.Rewards = append(tr.Rewards, out.Reward)
	tr.Turns = append(tr.Turns, Turn{Role: "tool", Tool: c.Name, Text: text, Reward: out.Reward, Finished: out.Finished})
	if len(out.Metadata) > 0 && string(out.Metadata) != "null" {
		tr.Metadata = out.Metadata
	}
	if out.Finished {
		e.done = true
	}
	return chat.ToolResult{ToolCallID: c.ID, Name: c.Name, Content: text}, nil
}

// textAction sends the assistant's plain text as the env's action and
// returns the observation's text (an action the env refused is shown to the
// model the same way).
func (e *episode) textAction(ctx context.Context, actor envtarget.TextActor, text string) (string, error) {
	tr := e.tr
	tr.ToolCalls++
	var out *envtarget.ToolOutput
	_, err := e.r.callEnv(ctx, tr, func(cctx context.Context) (Session, error) {
		var err error
		out, err = actor.TextAction(cctx, strings.TrimSpace(text))
		return nil, err
	})
	var toolErr *envtarget.ToolError
	switch {
	case errors.As(err, &toolErr):
		tr.ToolFailures++
		tr.Rewards = append(tr.Rewards, nil)
		tr.Turns = append(tr.Turns, Turn{Role: "user", Error: err.Error()})
		return errText(err), nil
	case err != nil:
		return "", fmt.Errorf("text action: %w", err)
	}
	tr.Rewards = append(tr.Rewards, out.Reward)
	tr.Turns = append(tr.Turns, Turn{Role: "user", Text: out.Text, Reward: out.Reward, Finished: out.Finished})
	if out.Finished {
		e.done = true
	}
	return out.Text, nil
}

func toolMessages(results []chat.ToolResult) []chat.Message {
	msgs := make([]chat.Message, len(results))
	for i, r := range results {
		msgs[i] = chat.Message{Role: "tool", Content: r.Content, Name: r.Name, ToolCallID: r.ToolCallID}
	}
	return msgs
}

// appendTurn renders the env's turn (tool results or an observation); if it
// would overflow the completion budget the turn is cut off and the episode
// ends (TRL's overlong guard).
func (e *episode) appendTurn(promptLen int, msgs []chat.Message) (stop bool, err error) {
	before := len(e.conv.IDs())
	ids, err := e.conv.AppendMessages(msgs)
	if err != nil {
		e.tr.Outcome = OutcomeRenderError
		return true, fmt.Errorf("render tool results: %w", err)
	}
	e.tr.Divergences = len(e.conv.Divergences())
	if len(ids)-promptLen >= e.r.opts.MaxCompletionTokens {
		e.keep = before
		e.tr.Outcome = OutcomeBudget
		if e.done {
			e.tr.Outcome = OutcomeDone
		}
		return true, nil
	}
	e.tr.Logprobs = append(e.tr.Logprobs, make([]float32, len(ids)-before)...)
	return false, nil
}

// snapshot copies the conversation's tokens and mask into the trajectory.
func (e *episode) snapshot(promptLen int) {
	ids := e.conv.IDs()
	mask := e.conv.LossMask()
	if e.keep >= 0 && e.keep < len(ids) {
		ids, mask = ids[:e.keep], mask[:e.keep-promptLen]
	}
	e.tr.Tokens, e.tr.PromptLen = ids, promptLen
	e.tr.LossMask = make([]uint8, len(mask))
	for i, m := range mask {
		e.tr.LossMask[i] = uint8(m)
	}
	if n := len(ids) - promptLen; len(e.tr.Logprobs) > n {
		e.tr.Logprobs = e.tr.Logprobs[:n]
	}
}
