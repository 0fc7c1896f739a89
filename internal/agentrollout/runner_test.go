package agentrollout

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/agent"
	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/gateway"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/rollout"
)

// lockboxModel is a deterministic engine.Generator standing in for the
// policy: it plays lockbox as a trained model would (open the envelope,
// then unlock with the code the tool's answer shows, read from the prompt
// ids it was given), ends each turn with <|im_end|>, and keeps every
// request and result: the engine's own record of what it sampled.
type lockboxModel struct {
	tok   *chat.Tokenizer
	imEnd int32
	// toolPrefix is put before the tool names it calls: agents that name
	// MCP tools by server (Codex, Claude Code: mcp__env__unlock) offer
	// them to the model so. Set before the first call.
	toolPrefix string

	mu    sync.Mutex
	calls []engineCall
}

type engineCall struct {
	req engine.Request
	res engine.Result
}

var codeRE = regexp.MustCompile(`code: (\d)`)

func (m *lockboxModel) Generate(ctx context.Context, req engine.Request) (engine.Result, error) {
	prompt := m.tok.Decode(req.PromptIDs, false)
	text := "<tool_call>\n{\"name\": \"" + m.toolPrefix + "open_envelope\", \"arguments\": {}}\n</tool_call>"
	if c := codeRE.FindAllStringSubmatch(prompt, -1); len(c) > 0 && strings.Contains(prompt, "<tool_response>") {
		text = "<tool_call>\n{\"name\": \"" + m.toolPrefix + "unlock\", \"arguments\": {\"code\": \"" + c[len(c)-1][1] + "\"}}\n</tool_call>"
	}
	if strings.Count(prompt, "<tool_response>") >= 2 {
		text = "Done."
	}
	ids := append(m.tok.Encode(text), m.imEnd)
	lps := make([]float32, len(ids))
	for i := range lps {
		lps[i] = -0.01 * float32(i+1)
	}
	res := engine.Result{IDs: ids, Logprobs: lps, StopReason: engine.StopToken}
	m.mu.Lock()
	m.calls = append(m.calls, engineCall{req: req, res: res})
	m.mu.Unlock()
	return res, nil
}

func (m *lockboxModel) SyncWeights(context.Context, int) error { return nil }
func (m *lockboxModel) Close() error                           { return nil }

func (m *lockboxModel) recorded() []engineCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// harness is a Runner over a built-in env and the lockbox model.
type harness struct {
	runner *Runner
	model  *lockboxModel
}

func newHarness(t *testing.T, target, protocol string, spec agent.Spec) *harness {
	t.Helper()
	dir := t.TempDir()
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.InitOverwrite(dir, preset, 1))
	tok, err := chat.LoadTokenizer(dir)
	require.NoError(t, err)
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	format, err := chat.DetectToolCallFormat(tmpl.Source())
	require.NoError(t, err)
	imEnd, ok := tok.TokenID("<|im_end|>")
	require.True(t, ok)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	env, err := envtarget.Resolve(ctx, target, envtarget.Options{Logger: zerolog.Nop(), Protocol: protocol})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Close(context.Background()) })

	m := &lockboxModel{tok: tok, imEnd: imEnd}
	if spec.Timeout == 0 {
		spec.Timeout = 30 * time.Second
	}
	if spec.KillGrace == 0 {
		spec.KillGrace = 500 * time.Millisecond
	}
	r, err := New([]rollout.Opener{env}, m, Options{
		Agent: spec,
		Gateway: gateway.Options{Model: "ortrain-policy", Tokenizer: tok, Template: tmpl, Format: format,
			Defaults: gateway.Defaults{MaxTokens: 256, ForceSampling: true, Sampling: engine.SamplingParams{Temperature: 1, TopP: 1}}},
		EnvNames: []string{"lockbox"}, MaxConcurrency: 4, CallTimeout: 10 * time.Second, Logger: zerolog.Nop(),
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return &harness{runner: r, model: m}
}

func python(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	return p
}

func toolAgent(t *testing.T) []string {
	abs, err := filepath.Abs("testdata/tool_agent.py")
	require.NoError(t, err)
	return []string{python(t), abs}
}

// TestToolAgentTrajectoryIsTheEnginesTokens: a Python agent (standard
// library only) makes its own chat calls with tools, runs the model's tool
// calls on the env's MCP server (one call's result feeding the next call),
// over ORS and over OpenEnv; the trajectory is token for token what the
// engine was asked and sampled, the env's rewards and the agent's reward
// are recorded.
func TestToolAgentTrajectoryIsTheEnginesTokens(t *testing.T) {
	for _, protocol := range []string{"ors", "openenv"} {
		t.Run(protocol, func(t *testing.T) {
			h := newHarness(t, "builtin:lockbox", protocol, agent.Spec{Command: toolAgent(t)})
			tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 5, Version: 3})
			require.Equal(t, rollout.OutcomeDone, tr.Outcome, "%v", tr.Err)
			assert.True(t, tr.Agent)
			require.NotNil(t, tr.AgentReward)
			assert.Equal(t, 0.5, *tr.AgentReward)
			assert.Equal(t, 2, tr.ToolCalls, "open_envelope, then unlock")
			require.Len(t, tr.Rewards, 2)
			require.NotNil(t, tr.Rewards[1])
			assert.Equal(t, 1.0, *tr.Rewards[1], "the code read from the first tool's answer unlocked the box")

			all := h.model.recorded()
			require.Len(t, all, 3, "open, unlock, then an answer without a call")
			// The agent asked once more after unlock ended the episode: that
			// call was answered but is not the episode's, so it is counted,
			// not trained.
			assert.Equal(t, 1, tr.AgentCalls.AfterFinish)
			calls := all[:2]
			assert.Zero(t, tr.PrefixBreaks)
			assert.Empty(t, tr.Forks)
			// The trajectory is the last trained call's prompt and
			// completion, its prompt the first call's: every later prompt
			// extends the one before and its sampled ids, token for token.
			assert.Equal(t, calls[0].req.PromptIDs, tr.Tokens[:tr.PromptLen])
			last := calls[len(calls)-1]
			assert.Equal(t, append(slices.Clone(last.req.PromptIDs), last.res.IDs...), tr.Tokens)
			var sampled []int32
			var lps []float32
			for i, c := range calls {
				if i > 0 {
					prev := calls[i-1]
					require.Equal(t, append(slices.Clone(prev.req.PromptIDs), prev.res.IDs...), c.req.PromptIDs[:len(prev.req.PromptIDs)+len(prev.res.IDs)])
				}
				sampled = append(sampled, c.res.IDs...)
				lps = append(lps, c.res.Logprobs...)
			}
			var masked []int32
			var maskedLps []float32
			completion := tr.Tokens[tr.PromptLen:]
			require.Len(t, tr.LossMask, len(completion))
			for i, m := range tr.LossMask {
				if m == 1 {
					masked = append(masked, completion[i])
					maskedLps = append(maskedLps, tr.Logprobs[i])
				} else {
					assert.Zero(t, tr.Logprobs[i])
				}
			}
			assert.Equal(t, sampled, masked, "the loss covers exactly the sampled ids")
			assert.Equal(t, lps, maskedLps, "with the engine's log-probs")
			for _, c := range calls {
				assert.Equal(t, engine.SamplingParams{Temperature: 1, TopP: 1}, c.req.Sampling, "the agent's temperature 0 is overridden")
			}
			assert.NotEmpty(t, tr.Turns)
		})
	}
}

// TestRewritingAgentForks: an agent that replaces its history before its
// second call forks the trajectory; each segment is kept, the break counted.
func TestRewritingAgentForks(t *testing.T) {
	h := newHarness(t, "builtin:lockbox", "ors", agent.Spec{Command: append([]string{"/bin/sh", "-c", `AGENT_REWRITE=1 exec "$0" "$1"`}, toolAgent(t)...)})
	tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 0})
	require.False(t, tr.Outcome.Failed(), "%s: %v", tr.Outcome, tr.Err)
	assert.Equal(t, 1, tr.PrefixBreaks)
	require.Len(t, tr.Forks, 1)
	calls := h.model.recorded()
	assert.Equal(t, append(slices.Clone(calls[0].req.PromptIDs), calls[0].res.IDs...), tr.Tokens, "the first segment is the first call")
	fork := tr.Forks[0]
	assert.Equal(t, calls[1].req.PromptIDs, fork.Tokens[:fork.PromptLen], "the fork starts at the rewritten prompt")
}

// TestMisbehavingAgentsAreClassified: a crash, a hang and a key thief each
// end their rollout with their own outcome, and the rollouts beside them
// are not blamed.
func TestMisbehavingAgentsAreClassified(t *testing.T) {
	cases := []struct {
		name string
		spec agent.Spec
		want rollout.Outcome
	}{
		{"crash", agent.Spec{Command: []string{"/bin/sh", "-c", "kill -SEGV $$"}}, rollout.OutcomeAgentError},
		{"non-zero exit", agent.Spec{Command: []string{"/bin/sh", "-c", "echo oops >&2; exit 3"}}, rollout.OutcomeAgentError},
		{"hang", agent.Spec{Command: []string{"/bin/sh", "-c", "sleep 60"}, Timeout: time.Second}, rollout.OutcomeAgentTimeout},
		{"garbage reward", agent.Spec{Command: []string{"/bin/sh", "-c", `echo '{"reward": "high"}'`}}, rollout.OutcomeAgentBadOutput},
		{"no model call", agent.Spec{Command: []string{"/bin/sh", "-c", `echo '{"reward": 1}'`}}, rollout.OutcomeAgentNoCalls},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "builtin:lockbox", "ors", tc.spec)
			start := time.Now()
			tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 1})
			assert.Equal(t, tc.want, tr.Outcome, "%v", tr.Err)
			assert.True(t, tr.Outcome.Failed(), "masked from the loss")
			assert.Less(t, time.Since(start), 20*time.Second)
		})
	}
}

// TestKeyThiefIsBlamedNotItsVictim: an agent that calls a neighbour
// rollout's endpoint with its own key gets 401 and its rollout ends
// agent_bad_request; the neighbour's rollout completes unharmed.
func TestKeyThiefIsBlamedNotItsVictim(t *testing.T) {
	py := python(t)
	script, err := filepath.Abs("testdata/tool_agent.py")
	require.NoError(t, err)
	// Both rollouts run the thief's script; the victim plays normally but
	// waits first, so it is still open when the thief reaches for it.
	h := newHarness(t, "builtin:lockbox", "ors", agent.Spec{Command: []string{"/bin/sh", "-c",
		`if [ "${ORTRAIN_ROLLOUT_ID##*-}" = 1 ]; then AGENT_STEAL=1 exec "$0" "$1"; else sleep 2; exec "$0" "$1"; fi`, py, script}})
	trs := h.runner.RunAll(context.Background(), []rollout.Task{{Split: "train", Index: 2}, {Split: "train", Index: 3}}, nil)
	var outcomes []rollout.Outcome
	for _, tr := range trs {
		outcomes = append(outcomes, tr.Outcome)
	}
	assert.ElementsMatch(t, []rollout.Outcome{rollout.OutcomeAgentBadRequest, rollout.OutcomeDone}, outcomes)
}

// TestOpenAIClientAgent: an agent written with the real `openai` package
// (non-streamed and streamed calls mixed) trains through the gateway
// unchanged; its trajectory extends token for token. Skipped where the
// package is missing, unless ORTRAIN_REQUIRE_OPENAI is set (CI's libtorch
// 2.x lane installs Debian's python3-openai).
func TestOpenAIClientAgent(t *testing.T) {
	py := python(t)
	if err := exec.Command(py, "-c", "import openai").Run(); err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_OPENAI") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_OPENAI is set but python3 cannot import openai: %v", err)
		}
		t.Skipf("the openai Python package is not installed (Debian: python3-openai): %v", err)
	}
	script, err := filepath.Abs("testdata/openai_agent.py")
	require.NoError(t, err)
	h := newHarness(t, "builtin:lockbox", "ors", agent.Spec{Command: []string{py, script}})
	tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 4})
	require.Equal(t, rollout.OutcomeDone, tr.Outcome, "%v", tr.Err)
	require.NotNil(t, tr.AgentReward)
	assert.Equal(t, 0.75, *tr.AgentReward)
	require.NotNil(t, tr.Rewards[len(tr.Rewards)-1])
	assert.Equal(t, 1.0, *tr.Rewards[len(tr.Rewards)-1])
	calls := h.model.recorded()
	require.Len(t, calls, 3)
	assert.Zero(t, tr.PrefixBreaks, "the client's messages re-render to the sampled ids")
	// The third call came after unlock ended the episode: counted, not
	// trained; the trajectory ends with the unlocking call.
	assert.Equal(t, 1, tr.AgentCalls.AfterFinish)
	last := calls[1]
	assert.Equal(t, append(slices.Clone(last.req.PromptIDs), last.res.IDs...), tr.Tokens)
}

// TestAgentTask: ORTRAIN_TASK holds the prompt as messages, the session's
// tools in OpenAI's shape, where the task comes from and its spec as the
// env lists it.
func TestAgentTask(t *testing.T) {
	out := filepath.Join(t.TempDir(), "task.json")
	h := newHarness(t, "builtin:lockbox", "ors", agent.Spec{Command: []string{"/bin/sh", "-c", `printf '%s' "$ORTRAIN_TASK" > "$0"`, out}})
	tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 3})
	require.Equal(t, rollout.OutcomeAgentNoCalls, tr.Outcome)
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var task struct {
		Messages []map[string]string `json:"messages"`
		Tools    []struct {
			Type     string `json:"type"`
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
		Env   string          `json:"env"`
		Split string          `json:"split"`
		Index int             `json:"index"`
		Spec  json.RawMessage `json:"spec"`
	}
	require.NoError(t, json.Unmarshal(raw, &task), string(raw))
	require.Len(t, task.Messages, 1)
	assert.Equal(t, "user", task.Messages[0]["role"])
	assert.Equal(t, "Open the envelope, then unlock the box with the code inside.", task.Messages[0]["content"])
	require.Len(t, task.Tools, 2)
	assert.Equal(t, "function", task.Tools[0].Type)
	assert.Equal(t, "open_envelope", task.Tools[0].Function.Name)
	assert.JSONEq(t, `{"properties":{"code":{"type":"string"}},"required":["code"],"type":"object"}`, string(task.Tools[1].Function.Parameters))
	assert.Equal(t, "lockbox", task.Env)
	assert.Equal(t, "train", task.Split)
	assert.Equal(t, 3, task.Index)
	assert.Contains(t, string(task.Spec), `"id":"lockbox-3"`)
}

// TestREADMEAgent runs the complete standard-library agent the README
// shows (section "Bring your own agent"), so the documentation stays a
// working agent: over MCP it opens the envelope and unlocks the box.
func TestREADMEAgent(t *testing.T) {
	py := python(t)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	text := string(readme)
	at := strings.Index(text, "A complete agent with Python's standard library only")
	require.GreaterOrEqual(t, at, 0, "the README's agent section")
	start := strings.Index(text[at:], "```python\n")
	require.GreaterOrEqual(t, start, 0)
	code := text[at+start+len("```python\n"):]
	code = code[:strings.Index(code, "```")]
	example, err := os.ReadFile("../../docs/examples/agents/chat_agent.py")
	require.NoError(t, err)
	require.Contains(t, string(example), code, "the README shows docs/examples/agents/chat_agent.py")
	script := filepath.Join(t.TempDir(), "agent.py")
	require.NoError(t, os.WriteFile(script, []byte(code), 0o644))
	h := newHarness(t, "builtin:lockbox", "openenv", agent.Spec{Command: []string{py, script}})
	tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 6})
	require.Equal(t, rollout.OutcomeDone, tr.Outcome, "%v", tr.Err)
	require.NotNil(t, tr.Rewards[len(tr.Rewards)-1])
	assert.Equal(t, 1.0, *tr.Rewards[len(tr.Rewards)-1])
	assert.Zero(t, tr.PrefixBreaks)
	assert.Zero(t, tr.AgentCalls.AfterFinish, "the agent stops when the episode is over")
}
