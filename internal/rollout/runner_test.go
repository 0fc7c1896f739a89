package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// tinyChat loads the byte-level tokenizer and ChatML tool template that
// `ortrain init-model --preset tiny` writes: the real chat stack.
func tinyChat(t *testing.T) ChatSpec {
	t.Helper()
	dir := t.TempDir()
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.InitOverwrite(dir, preset, 1))
	tok, err := chat.LoadTokenizer(dir)
	require.NoError(t, err)
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	return ChatSpec{Tokenizer: tok, Template: tmpl}
}

// turnFunc scripts the model: given the turn number and everything the
// model has seen so far (decoded), it returns the text it "samples".
type turnFunc func(turn int, seen string) (text string, stop engine.StopReason, delay time.Duration)

// scriptedGenerator is an engine.Generator that answers from a script, so
// the rollout loop is exercised against real envs without a model.
type scriptedGenerator struct {
	tok    *chat.Tokenizer
	script turnFunc
	mu     sync.Mutex
	turns  map[string]int // per conversation (keyed by its first user text)
	seen   []string       // every prompt, decoded
	// end is the stop token a StopToken turn ends with ("": <|im_end|>).
	end string
}

func (g *scriptedGenerator) Generate(ctx context.Context, req engine.Request) (engine.Result, error) {
	seen := g.tok.Decode(req.PromptIDs, false)
	g.mu.Lock()
	if g.turns == nil {
		g.turns = map[string]int{}
	}
	key := seen[:min(len(seen), strings.Index(seen, "<|im_start|>assistant")+1)]
	turn := g.turns[key]
	g.turns[key]++
	g.seen = append(g.seen, seen)
	g.mu.Unlock()
	text, stop, delay := g.script(turn, seen)
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return engine.Result{}, ctx.Err()
	}
	ids := g.tok.Encode(text)
	if stop == engine.StopToken {
		name := g.end
		if name == "" {
			name = "<|im_end|>"
		}
		end, ok := g.tok.TokenID(name)
		if !ok {
			return engine.Result{}, fmt.Errorf("no token %q", name)
		}
		ids = append(ids, end)
	}
	if len(ids) > req.MaxTokens {
		ids, stop = ids[:req.MaxTokens], engine.StopLength
	}
	return engine.Result{IDs: ids, Logprobs: make([]float32, len(ids)), StopReason: stop}, nil
}

func (g *scriptedGenerator) SyncWeights(context.Context, int) error { return nil }
func (g *scriptedGenerator) Close() error                           { return nil }

func call(name, args string) string {
	return `<tool_call>{"name": "` + name + `", "arguments": ` + args + `}</tool_call>`
}

// serveEnv serves env over real loopback HTTP and returns an opener.
func serveEnv(t *testing.T, env *orsserver.Env) (Opener, *orsserver.Server, func()) {
	t.Helper()
	srv, err := orsserver.New(orsserver.Options{Logger: zerolog.Nop()}, env)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	stop := func() { _ = srv.Shutdown(context.Background()) }
	t.Cleanup(stop)
	url := "http://" + l.Addr().String()
	c, err := ors.NewClient(url, ors.Options{
		Logger: zerolog.Nop(), RequestAttempts: 1, CallRetries: 1, CreateRetries: 1,
		Sleep: func(context.Context, time.Duration) error { return nil },
	})
	require.NoError(t, err)
	return envtarget.FromORSClient(c, url), srv, stop
}

func newRunner(t *testing.T, opener Opener, gen engine.Generator, cs ChatSpec, mut func(*Options)) *Runner {
	t.Helper()
	opts := Options{
		Sampling:            engine.SamplingParams{Temperature: 1, TopP: 1},
		MaxCompletionTokens: 512,
		MaxToolIterations:   4,
		MaxConcurrency:      4,
		EpisodeTimeout:      10 * time.Second,
		CallTimeout:         2 * time.Second,
		Logger:              zerolog.Nop(),
	}
	if mut != nil {
		mut(&opts)
	}
	r, err := NewRunner([]Opener{opener}, gen, cs, opts)
	require.NoError(t, err)
	return r
}

func targetOf(seen string) string {
	_, after, _ := strings.Cut(seen, "text='")
	target, _, _ := strings.Cut(after, "'")
	return target
}

func TestRolloutAgainstEcho(t *testing.T) {
	cs := tinyChat(t)
	tests := []struct {
		name         string
		script       turnFunc
		mut          func(*Options)
		outcome      Outcome
		reward       []*float64 // per call, nil = none
		calls, fails int
		formatErrors int
		check        func(t *testing.T, tr *Trajectory)
	}{
		{
			name: "correct tool call finishes",
			script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
				return call("echo", `{"text": "`+targetOf(seen)+`"}`), engine.StopToken, 0
			},
			outcome: OutcomeDone, reward: []*float64{ors.Reward(1)}, calls: 1,
		},
		{
			name: "wrong call, then right call",
			script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
				if turn == 0 {
					return call("echo", `{"text": "nope"}`), engine.StopToken, 0
				}
				return "Trying again. " + call("echo", `{"text": "`+targetOf(seen)+`"}`), engine.StopToken, 0
			},
			outcome: OutcomeDone, reward: []*float64{ors.Reward(0), ors.Reward(1)}, calls: 2,
			check: func(t *testing.T, tr *Trajectory) {
				assert.Contains(t, tr.Turns[1].Text, "no match (got 'nope')")
			},
		},
		{
			name: "task-scoped hint is offered and callable; unknown tool is an error the model sees",
			script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
				switch turn {
				case 0:
					return call("hint", `{}`), engine.StopToken, 0
				case 1:
					return call("nosuchtool", `{}`), engine.StopToken, 0
				}
				return "I give up.", engine.StopToken, 0
			},
			outcome: OutcomeStopped, reward: []*float64{nil, nil}, calls: 2, fails: 1,
			check: func(t *testing.T, tr *Trajectory) {
				assert.Contains(t, tr.Turns[1].Text, "try echo(text=...)")
				assert.Contains(t, tr.Turns[3].Error, "is not a valid tool")
			},
		},
		{
			name: "malformed call is answered with an error and counted",
			script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
				if turn == 0 {
					return `<tool_call>{"name": "echo", "arguments": {"text": }</tool_call>`, engine.StopToken, 0
				}
				return call("echo", `{"text": "`+targetOf(seen)+`"}`), engine.StopToken, 0
			},
			outcome: OutcomeDone, reward: []*float64{ors.Reward(1)}, calls: 1, fails: 1, formatErrors: 1,
			check: func(t *testing.T, tr *Trajectory) {
				require.Equal(t, "tool", tr.Turns[1].Role)
				assert.Contains(t, tr.Turns[1].Error, "is malformed", "the parse failure is in the trajectory")
			},
		},
		{
			name: "model stops without a tool call",
			script: func(int, string) (string, engine.StopReason, time.Duration) {
				return "hello", engine.StopToken, 0
			},
			outcome: OutcomeStopped,
		},
		{
			name: "final answer tool receives plain text",
			script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
				return targetOf(seen), engine.StopToken, 0
			},
			mut:     func(o *Options) { o.FinalAnswerTool = "echo" },
			outcome: OutcomeDone, reward: []*float64{ors.Reward(1)}, calls: 1,
		},
		{
			name: "tool iterations run out",
			script: func(int, string) (string, engine.StopReason, time.Duration) {
				return call("echo", `{"text": "nope"}`), engine.StopToken, 0
			},
			mut:     func(o *Options) { o.MaxToolIterations = 2 },
			outcome: OutcomeIterations, reward: []*float64{ors.Reward(0), ors.Reward(0)}, calls: 2,
		},
		{
			name: "completion budget exhausted mid-turn",
			script: func(int, string) (string, engine.StopReason, time.Duration) {
				return strings.Repeat("blah ", 40), engine.StopToken, 0
			},
			mut:     func(o *Options) { o.MaxCompletionTokens = 20 },
			outcome: OutcomeTruncated,
			check: func(t *testing.T, tr *Trajectory) {
				assert.Len(t, tr.Tokens, tr.PromptLen+20)
			},
		},
		{
			name: "tool turn that would overflow the budget is rolled back",
			script: func(int, string) (string, engine.StopReason, time.Duration) {
				return call("echo", `{"text": "nope"}`), engine.StopToken, 0
			},
			mut:     func(o *Options) { o.MaxCompletionTokens = 70 },
			outcome: OutcomeBudget, reward: []*float64{ors.Reward(0)}, calls: 1,
			check: func(t *testing.T, tr *Trajectory) {
				require.NotEmpty(t, tr.LossMask)
				assert.Equal(t, uint8(1), tr.LossMask[len(tr.LossMask)-1], "ends with the sampled call, no tool glue")
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opener, srv, _ := serveEnv(t, envs.Echo())
			gen := &scriptedGenerator{tok: cs.Tokenizer, script: tc.script}
			r := newRunner(t, opener, gen, cs, tc.mut)
			tr := r.Run(context.Background(), Task{Split: "train", Index: 3}, 1)
			require.Equal(t, tc.outcome, tr.Outcome, "err: %v", tr.Err)
			assert.NoError(t, tr.Err)
			assert.Equal(t, tc.reward, tr.Rewards)
			assert.Equal(t, tc.calls, tr.ToolCalls)
			assert.Equal(t, tc.fails, tr.ToolFailures)
			assert.Equal(t, tc.formatErrors, tr.FormatErrors)
			assertMaskCoversSampled(t, cs, gen, tr)
			if tc.check != nil {
				tc.check(t, tr)
			}
			st := srv.Stats()
			assert.Equal(t, int64(0), st.Live, "session closed")
			assert.Equal(t, int64(1), st.Created)
		})
	}
}

// assertMaskCoversSampled checks the loss mask is 1 exactly on tokens the
// generator produced: the completion decomposes into sampled runs (mask 1)
// and template/tool runs (mask 0), and the prompt of every later turn is the
// conversation so far.
func assertMaskCoversSampled(t *testing.T, cs ChatSpec, gen *scriptedGenerator, tr *Trajectory) {
	t.Helper()
	require.Len(t, tr.LossMask, len(tr.Tokens)-tr.PromptLen)
	require.Len(t, tr.Logprobs, len(tr.LossMask))
	sampled := 0
	for _, m := range tr.LossMask {
		sampled += int(m)
	}
	total := 0
	for _, turn := range tr.Turns {
		if turn.Role == "assistant" {
			total += len(cs.Tokenizer.Encode(strings.TrimSuffix(turn.Text, "<|im_end|>")))
			if strings.HasSuffix(turn.Text, "<|im_end|>") {
				total++
			}
		}
	}
	assert.Equal(t, total, sampled, "mask covers exactly the sampled tokens")
}

func TestRolloutShowsTaskScopedToolsToModel(t *testing.T) {
	cs := tinyChat(t)
	opener, _, _ := serveEnv(t, envs.Echo())
	gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(int, string) (string, engine.StopReason, time.Duration) {
		return "ok", engine.StopToken, 0
	}}
	tr := newRunner(t, opener, gen, cs, nil).Run(context.Background(), Task{Split: "train", Index: 0}, 1)
	require.Equal(t, OutcomeStopped, tr.Outcome, "err: %v", tr.Err)
	require.Len(t, gen.seen, 1)
	assert.Contains(t, gen.seen[0], `"name": "echo"`)
	assert.Contains(t, gen.seen[0], `"name": "hint"`, "the task-scoped tool reaches the model's tool list")
	assert.Contains(t, gen.seen[0], "Call the `echo` tool with text='hello' to win.")
}

// slowEnv has one tool that sleeps past the call deadline, counting calls.
func slowEnv(calls *atomic.Int64) *orsserver.Env {
	return &orsserver.Env{
		Name:   "slow",
		Splits: []ors.Split{{Name: "train", Type: "train"}},
		ListTasks: func(context.Context, string) ([]json.RawMessage, error) {
			return []json.RawMessage{json.RawMessage(`{"id":"s0"}`)}, nil
		},
		Tools: []orsserver.Tool{orsserver.NewToolNoInput("wait", "Waits a long time.",
			func(ctx context.Context, _ *slowInstance) (ors.ToolOutput, error) {
				calls.Add(1)
				select {
				case <-time.After(3 * time.Second):
				case <-ctx.Done():
				}
				return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock("done")}, Reward: ors.Reward(1), Finished: true}, nil
			})},
		New: func(context.Context, json.RawMessage, map[string]string) (orsserver.Instance, error) {
			return &slowInstance{}, nil
		},
	}
}

type slowInstance struct{}

func (*slowInstance) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{ors.TextBlock("Call wait.")}, nil
}

func TestRolloutFailures(t *testing.T) {
	cs := tinyChat(t)

	t.Run("slow tool past its deadline", func(t *testing.T) {
		var calls atomic.Int64
		opener, srv, _ := serveEnv(t, slowEnv(&calls))
		gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(int, string) (string, engine.StopReason, time.Duration) {
			return call("wait", `{}`), engine.StopToken, 0
		}}
		r := newRunner(t, opener, gen, cs, func(o *Options) { o.CallTimeout = 300 * time.Millisecond })
		start := time.Now()
		tr := r.Run(context.Background(), Task{Split: "train", Index: 0}, 1)
		assert.Equal(t, OutcomeTimeout, tr.Outcome, "err: %v", tr.Err)
		assert.True(t, tr.Outcome.Failed())
		assert.Less(t, time.Since(start), 2500*time.Millisecond, "the episode does not wait for the tool")
		assert.Eventually(t, func() bool { return srv.Stats().Live == 0 }, 5*time.Second, 20*time.Millisecond, "session closed")
	})

	t.Run("env killed mid-episode", func(t *testing.T) {
		opener, srv, stop := serveEnv(t, envs.Echo())
		gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
			stop() // the env dies while the model is thinking
			return call("echo", `{"text": "nope"}`), engine.StopToken, 0
		}}
		tr := newRunner(t, opener, gen, cs, nil).Run(context.Background(), Task{Split: "train", Index: 1}, 1)
		assert.Contains(t, []Outcome{OutcomeUnreachable, OutcomeEnvError}, tr.Outcome, "err: %v", tr.Err)
		assert.True(t, tr.Outcome.Failed())
		require.Error(t, tr.Err)
		assert.Equal(t, int64(0), srv.Stats().Live, "shutdown tore the session down")
	})

	// The tiny model may end a turn holding a tool call with <|endoftext|>,
	// a stop token that is not the template's end-of-turn: the turn cannot
	// be closed token-exactly, a failure of ortrain's own chat pipeline that
	// must not be counted as the env's.
	t.Run("turn ended by a stop token the template does not close with", func(t *testing.T) {
		opener, srv, _ := serveEnv(t, envs.Echo())
		gen := &scriptedGenerator{tok: cs.Tokenizer, end: "<|endoftext|>", script: func(int, string) (string, engine.StopReason, time.Duration) {
			return call("echo", `{"text": "x"}`), engine.StopToken, 0
		}}
		tr := newRunner(t, opener, gen, cs, nil).Run(context.Background(), Task{Split: "train", Index: 0}, 1)
		assert.Equal(t, OutcomeRenderError, tr.Outcome, "err: %v", tr.Err)
		assert.True(t, tr.Outcome.Failed(), "masked out of the loss and counted")
		require.Error(t, tr.Err)
		assert.Equal(t, int64(0), srv.Stats().Live, "session closed")
	})

	// A server that answered with a null log-prob: the rollout ends with
	// its own outcome, out of the loss, never trained as log p = 0.
	t.Run("completion the server left without log-probs", func(t *testing.T) {
		opener, srv, _ := serveEnv(t, envs.Echo())
		invalid := &invalidGenerator{}
		tr := newRunner(t, opener, invalid, cs, nil).Run(context.Background(), Task{Split: "train", Index: 0}, 1)
		assert.Equal(t, OutcomeGenInvalid, tr.Outcome, "err: %v", tr.Err)
		assert.True(t, tr.Outcome.Failed())
		var ie *engine.InvalidResultError
		require.ErrorAs(t, tr.Err, &ie)
		assert.Equal(t, "http://replica-0", ie.Server)
		assert.Empty(t, tr.Logprobs, "nothing of the invalid completion is kept")
		assert.Equal(t, int64(0), srv.Stats().Live, "session closed")
	})

	t.Run("unreachable env", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		c, err := ors.NewClient("http://"+addr, ors.Options{RequestAttempts: 1, CreateRetries: 1, Sleep: func(context.Context, time.Duration) error { return nil }})
		require.NoError(t, err)
		gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(int, string) (string, engine.StopReason, time.Duration) { return "", engine.StopToken, 0 }}
		tr := newRunner(t, envtarget.FromORSClient(c, "http://"+addr), gen, cs, nil).Run(context.Background(), Task{Split: "train", Index: 0}, 1)
		assert.Equal(t, OutcomeUnreachable, tr.Outcome, "err: %v", tr.Err)
		var ue *ors.UnreachableError
		assert.True(t, errors.As(tr.Err, &ue))
	})

	t.Run("episode deadline and cancel close sessions", func(t *testing.T) {
		opener, srv, _ := serveEnv(t, envs.Echo())
		gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(int, string) (string, engine.StopReason, time.Duration) {
			return "slow thought", engine.StopToken, time.Hour
		}}
		r := newRunner(t, opener, gen, cs, func(o *Options) { o.EpisodeTimeout = 200 * time.Millisecond })
		tr := r.Run(context.Background(), Task{Split: "train", Index: 0}, 1)
		assert.Equal(t, OutcomeTimeout, tr.Outcome, "err: %v", tr.Err)

		ctx, cancel := context.WithCancel(context.Background())
		r = newRunner(t, opener, gen, cs, nil)
		time.AfterFunc(100*time.Millisecond, cancel)
		trs := r.RunAll(ctx, []Task{{Split: "train", Index: 0}, {Split: "train", Index: 1}, {Split: "train", Index: 2}}, nil)
		for _, tr := range trs {
			assert.Equal(t, OutcomeCanceled, tr.Outcome)
		}
		assert.Equal(t, int64(0), srv.Stats().Live, "every session closed after cancel")
		assert.Equal(t, srv.Stats().Created, srv.Stats().Deleted)
	})
}

func TestRunAllConcurrentSessions(t *testing.T) {
	cs := tinyChat(t)
	opener, srv, _ := serveEnv(t, envs.Echo())
	gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
		return call("echo", `{"text": "`+targetOf(seen)+`"}`), engine.StopToken, 10 * time.Millisecond
	}}
	r := newRunner(t, opener, gen, cs, func(o *Options) { o.MaxConcurrency = 16; o.CallTimeout = 20 * time.Second })
	tasks := make([]Task, 64)
	for i := range tasks {
		tasks[i] = Task{Split: "train", Index: i % 4}
	}
	var done atomic.Int64
	trs := r.RunAll(context.Background(), tasks, func(*Trajectory) { done.Add(1) })
	require.Len(t, trs, 64)
	for i, tr := range trs {
		require.Equal(t, OutcomeDone, tr.Outcome, "rollout %d: %v", i, tr.Err)
		assert.Equal(t, i%4, tr.Task.Index, "results in task order")
	}
	assert.Equal(t, int64(64), done.Load())
	assert.Equal(t, int64(64), srv.Stats().Created)
	assert.Equal(t, int64(0), srv.Stats().Live)
}

// sessionGenerator records each request's session key by conversation and
// the sessions ended.
type sessionGenerator struct {
	scriptedGenerator
	smu   sync.Mutex
	keys  map[string][]string // conversation (first user text) -> session key of each turn
	ended []string
}

func (g *sessionGenerator) Generate(ctx context.Context, req engine.Request) (engine.Result, error) {
	seen := g.tok.Decode(req.PromptIDs, false)
	conv := seen[:min(len(seen), strings.Index(seen, "<|im_start|>assistant")+1)]
	g.smu.Lock()
	g.keys[conv] = append(g.keys[conv], req.SessionKey)
	g.smu.Unlock()
	return g.scriptedGenerator.Generate(ctx, req)
}

func (g *sessionGenerator) EndSession(ctx context.Context, key string) error {
	g.smu.Lock()
	defer g.smu.Unlock()
	g.ended = append(g.ended, key)
	return nil
}

// TestRolloutSessionKeys: all turns of a rollout carry one session key, no
// two rollouts share one, and each is ended when its rollout ends.
func TestRolloutSessionKeys(t *testing.T) {
	cs := tinyChat(t)
	opener, _, _ := serveEnv(t, envs.Echo())
	gen := &sessionGenerator{keys: map[string][]string{}}
	gen.tok = cs.Tokenizer
	gen.script = func(turn int, seen string) (string, engine.StopReason, time.Duration) {
		if turn == 0 {
			return call("echo", `{"text": "nope"}`), engine.StopToken, 0
		}
		return call("echo", `{"text": "`+targetOf(seen)+`"}`), engine.StopToken, 0
	}
	r := newRunner(t, opener, gen, cs, nil)
	tasks := make([]Task, 4)
	for i := range tasks {
		tasks[i] = Task{Split: "train", Index: i}
	}
	for i, tr := range r.RunAll(context.Background(), tasks, nil) {
		require.Equal(t, OutcomeDone, tr.Outcome, "rollout %d: %v", i, tr.Err)
	}
	gen.smu.Lock()
	defer gen.smu.Unlock()
	require.Len(t, gen.keys, 4)
	seen := map[string]bool{}
	for conv, keys := range gen.keys {
		require.Len(t, keys, 2, conv)
		require.NotEmpty(t, keys[0])
		assert.Equal(t, keys[0], keys[1], "both turns of a rollout share its key")
		assert.False(t, seen[keys[0]], "key %s used by two rollouts", keys[0])
		seen[keys[0]] = true
	}
	assert.ElementsMatch(t, slices.Collect(maps.Keys(seen)), gen.ended)
}

// invalidGenerator answers every request as a server whose completion
// lacked a log-prob.
type invalidGenerator struct{}

func (invalidGenerator) Generate(context.Context, engine.Request) (engine.Result, error) {
	return engine.Result{}, &engine.InvalidResultError{Server: "http://replica-0", Request: "POST /v1/completions",
		Err: errors.New("completion answer: choice 0: logprobs.token_logprobs[3]: null")}
}
func (invalidGenerator) SyncWeights(context.Context, int) error { return nil }
func (invalidGenerator) Close() error                           { return nil }
