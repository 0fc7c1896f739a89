package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/testclients"
)

// The coding-agent CLIs pinned in scripts/test-clients (OpenAI's Codex CLI,
// Anthropic's Claude Agent SDK) play `ortrain run`'s rollouts through their
// example wrappers (docs/examples/agents), against a random model with
// Qwen3's real tokenizer and chat template, so their real, long prompts are
// encoded, sampled from and trained on. Nothing is learnt: the random model
// writes text until its budget runs out and the CLI ends the episode; what
// is checked is that every rollout is the CLI's, completes, and trains on
// what was sampled.

// agentContext is the smoke model's context: Codex's prompt with its
// default tools is about 9k Qwen3 tokens.
const agentContext = 16384

// agentCompletion is grpo.max_completion_length of these runs.
const agentCompletion = 24

// qwen3Smoke builds the random Qwen3-shaped model `run --smoke` builds
// (model.InitSmoke: 2 layers x 64 hidden, Qwen3's vocabulary, tokenizer and
// template) with a context long enough for a coding agent's prompt.
func qwen3Smoke(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "Qwen3-4B")
	require.NoError(t, os.MkdirAll(src, 0o755))
	for _, f := range []string{"../../testdata/models/qwen3-4b/config.json", "../../testdata/tokenizers/qwen3/tokenizer.json.gz", "../../testdata/tokenizers/qwen3/tokenizer_config.json"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(src, filepath.Base(f)), b, 0o644))
	}
	dir := filepath.Join(t.TempDir(), "smoke")
	mc, err := model.InitSmoke(dir, src, 7)
	require.NoError(t, err)
	// InitSmoke caps the context at 4096 positions; rope has no weights,
	// so raising it is a config change only.
	mc.MaxPositionEmbeddings = agentContext
	b, err := mc.Encode()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, model.ConfigFile), b, 0o644))
	return dir
}

// cliAgentRun is one `ortrain run` whose rollouts a CLI agent plays.
type cliAgentRun struct {
	argv, env []string // the agent's command and agent.env
	steps     int      // 1 task x 2 generations each
	kind      string   // the gateway's kind of every call (its API)
}

// config writes the run's config: builtin:lockbox, the smoke model on CPU.
func (c cliAgentRun) config(t *testing.T, modelDir, out string) string {
	t.Helper()
	list := func(ss []string) string {
		q := make([]string, len(ss))
		for i, s := range ss {
			q[i] = fmt.Sprintf("%q", s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	cfg := fmt.Sprintf(`model: %s
output_dir: %s
seed: 7
envs:
  - target: builtin:lockbox
    split: train
chat:
  final_answer_tool: ""
grpo:
  num_generations: 2
  per_device_train_batch_size: 1
  gradient_accumulation_steps: 2
  max_completion_length: %d
  # The random model's replies run out of budget: train them anyway.
  mask_truncated_completions: false
  loss_type: dapo
  beta: 0.0
  max_steps: %d
  logging_steps: 1
  save_steps: 0
rollout:
  max_concurrency: 2
  episode_timeout: 3m
worker:
  device: cpu
  dtype: float32
  threads: 1
agent:
  command: %s
  env: %s
`, modelDir, out, agentCompletion, c.steps, list(c.argv), list(c.env))
	path := filepath.Join(t.TempDir(), "agent.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o644))
	return path
}

// servedLine is the gateway's debug line for a model call it served, or
// the agent runner's for a rollout it ended.
type servedLine struct {
	Message          string `json:"message"`
	Rollout          string `json:"rollout"`
	Kind             string `json:"kind"`
	PromptTokens     int    `json:"prompt_tokens"`
	CompletionTokens int    `json:"completion_tokens"`
	Outcome          string `json:"outcome"`
	ModelCalls       int    `json:"model_calls"`
	PrefixBreaks     int    `json:"prefix_breaks"`
}

// trajectoryLine is what is checked of a trajectories.jsonl record.
type trajectoryLine struct {
	Outcome      string `json:"outcome"`
	Error        string `json:"error"`
	AgentStderr  string `json:"agent_stderr"`
	PromptTokens int    `json:"prompt_tokens"`
	Completion   int    `json:"completion_tokens"`
	Sampled      int    `json:"sampled_tokens"`
	Turns        []struct {
		Role string `json:"role"`
	} `json:"turns"`
}

// failed are the outcomes of a rollout the agent did not complete.
var failed = []string{"agent_error", "agent_bad_request", "agent_bad_output", "agent_no_calls", "agent_timeout", "generation_error", "env_error"}

// run runs `ortrain run` with debug logs and checks what every CLI's run
// shares: exit 0, a metrics row per step, every rollout the agent's,
// complete, with at least one model call, each of c.kind, and trained on
// what was sampled: its first sequence is its first call's prompt and
// sampled ids (the random model's text does not re-encode to the ids it
// sampled, so a later call forks instead of extending it).
func (c cliAgentRun) run(t *testing.T) {
	t.Helper()
	requireWorkerLib(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := c.config(t, qwen3Smoke(t), out)
	env := map[string]string{"ORTRAIN_WORKER_LIB": os.Getenv("ORTRAIN_WORKER_LIB")}
	start := time.Now()
	// The built binary: internal/agentrollout runs these agents under the race detector.
	code, stdout, errOut := execBinary(t, env, "run", "--config", cfg, "--log-format", "json", "--log-level", "debug")
	t.Logf("ortrain run: %d steps in %s", c.steps, time.Since(start).Round(time.Millisecond))
	require.Equal(t, ExitOK, code, "stdout:\n%s\nstderr (end):\n%s", stdout, lastLines(errOut, 30))

	calls := map[string][]servedLine{} // rollout id -> its served calls, in order
	var ended []servedLine
	sc := bufio.NewScanner(strings.NewReader(errOut))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<24)
	for sc.Scan() {
		var l servedLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch l.Message {
		case "served":
			calls[l.Rollout] = append(calls[l.Rollout], l)
		case "agent rollout":
			ended = append(ended, l)
		}
	}
	rollouts := 2 * c.steps
	require.Len(t, ended, rollouts, "one agent rollout per generation")
	var firstPrompts, firstCompletions []int
	allForked := true
	for _, r := range ended {
		rc := calls[r.Rollout]
		assert.NotContains(t, failed, r.Outcome, "rollout %s", r.Rollout)
		require.NotEmpty(t, rc, "rollout %s called the model", r.Rollout)
		assert.Equal(t, len(rc), r.ModelCalls)
		prompts := make([]int, len(rc))
		for i, call := range rc {
			assert.Equal(t, c.kind, call.Kind, "rollout %s call %d", r.Rollout, i)
			prompts[i] = call.PromptTokens
		}
		t.Logf("rollout %s: %s, prompt tokens per call %v, prefix breaks %d", r.Rollout, r.Outcome, prompts, r.PrefixBreaks)
		assert.LessOrEqual(t, r.PrefixBreaks, len(rc)-1)
		allForked = allForked && r.PrefixBreaks == len(rc)-1
		firstPrompts = append(firstPrompts, rc[0].PromptTokens)
		firstCompletions = append(firstCompletions, rc[0].CompletionTokens)
	}

	var prompts, completions, sampled []int
	for _, tr := range readJSONL[trajectoryLine](t, filepath.Join(out, "trajectories.jsonl")) {
		assert.NotContains(t, failed, tr.Outcome, "%s\n%s", tr.Error, tr.AgentStderr)
		assistant := 0
		for _, turn := range tr.Turns {
			if turn.Role == "assistant" {
				assistant++
			}
		}
		assert.Positive(t, assistant, "the transcript holds the model's replies")
		assert.LessOrEqual(t, tr.Completion, agentCompletion, "cut at max_completion_length")
		assert.Positive(t, tr.Sampled)
		assert.LessOrEqual(t, tr.Sampled, tr.Completion)
		prompts, completions, sampled = append(prompts, tr.PromptTokens), append(completions, tr.Completion), append(sampled, tr.Sampled)
	}
	require.Len(t, prompts, rollouts)
	slices.Sort(firstPrompts)
	slices.Sort(prompts)
	assert.Equal(t, firstPrompts, prompts, "each trajectory starts with its first call's prompt, as the engine was given it")
	if allForked {
		// Every sequence is one call: trained are exactly its sampled ids.
		slices.Sort(firstCompletions)
		slices.Sort(completions)
		slices.Sort(sampled)
		assert.Equal(t, firstCompletions, completions)
		assert.Equal(t, firstCompletions, sampled)
	}

	rows := metricsRows(t, out)
	require.Len(t, rows, c.steps)
	for _, row := range rows {
		assert.Contains(t, row, "agent/prefix_breaks")
		assert.Zero(t, row["rollouts/agent_error"]+row["rollouts/agent_bad_request"]+row["rollouts/generation_error"])
		t.Logf("step: train %.1fs, generation %.1fs, peak RSS %.1f GiB", row["time/train"], row["time/generation"], row["memory/peak_rss_bytes"]/(1<<30))
	}
}

// readJSONL decodes every line of a JSONL file.
func readJSONL[T any](t *testing.T, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<24)
	for sc.Scan() {
		var v T
		require.NoError(t, json.Unmarshal(sc.Bytes(), &v))
		out = append(out, v)
	}
	require.NoError(t, sc.Err())
	return out
}

// lastLines is the end of a log, for failure messages.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestRunCodexCLIAgent: `ortrain run` with Codex CLI (codex-agent.sh) as
// the agent, with Codex's default tools (shell, sub-agents, goals, skills:
// its prompt as shipped, ~9k Qwen3 tokens), over the Responses API.
func TestRunCodexCLIAgent(t *testing.T) {
	n := testclients.RequireNode(t, "@openai/codex")
	script, err := filepath.Abs("../../docs/examples/agents/codex-agent.sh")
	require.NoError(t, err)
	cliAgentRun{
		argv:  []string{"bash", script},
		env:   []string{"ORTRAIN_CODEX_BIN=" + filepath.Join(n.Modules, ".bin", "codex"), "ORTRAIN_AGENT_BUILTIN_TOOLS=1"},
		steps: 1, kind: "responses",
	}.run(t)
}

// TestRunClaudeAgentSDK: `ortrain run` with the Claude Agent SDK
// (claude-agent.js, Claude Code) as the agent, over the Messages API.
func TestRunClaudeAgentSDK(t *testing.T) {
	n := testclients.RequireNode(t, "@anthropic-ai/claude-agent-sdk")
	script, err := filepath.Abs("../../docs/examples/agents/claude-agent.js")
	require.NoError(t, err)
	cliAgentRun{argv: []string{n.Bin, script}, env: []string{"NODE_PATH=" + n.Modules}, steps: 2, kind: "messages"}.run(t)
}
