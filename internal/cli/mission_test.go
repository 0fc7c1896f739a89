package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// metricsRows reads a run directory's metrics.jsonl.
func metricsRows(t *testing.T, dir string) []map[string]float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	var rows []map[string]float64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
	for sc.Scan() {
		var m map[string]float64
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		rows = append(rows, m)
	}
	require.NoError(t, sc.Err())
	return rows
}

// meanOf is the mean of key over rows.
func meanOf(rows []map[string]float64, key string) float64 {
	s := 0.0
	for _, r := range rows {
		s += r[key]
	}
	return s / float64(len(rows))
}

// TestMissionSFTThenGRPO is issue 25's learning test, the CPU demo as
// `make demo` runs it (configs/lockbox.yaml, scripts/demo): demonstrations
// written by a scripted policy through the real protocol, `ortrain sft` on
// the expert ones, continued on mixed-quality ones, then GRPO with tools
// rendered in the prompt and parsed from the model's output. After SFT at
// least 90% of the assistant turns' tool calls parse; GRPO raises the mean
// reward by at least 0.25 (first 5 steps vs last 10) and ends with at least
// two tool calls per episode. Each phase runs the built binary, as make demo
// does (minutes of training; under -race in-process it took most of the
// package's time).
func TestMissionSFTThenGRPO(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for minutes")
	}
	requireWorkerLib(t)
	dir := t.TempDir()
	cfgText, err := os.ReadFile("../../configs/lockbox.yaml")
	require.NoError(t, err)
	template, err := filepath.Abs("../../configs/templates/tool-signatures.jinja")
	require.NoError(t, err)
	cfgOut := strings.NewReplacer(
		"model: models/mini-lockbox", "model: "+filepath.Join(dir, "mini"),
		"template_path: configs/templates/tool-signatures.jinja", "template_path: "+template,
	).Replace(string(cfgText))
	require.Contains(t, cfgOut, "model: "+filepath.Join(dir, "mini"), "the config names its model")
	require.Contains(t, cfgOut, "template_path: "+template, "the config names its chat template")
	cfg := filepath.Join(dir, "lockbox.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(cfgOut), 0o644))
	env := map[string]string{"ORTRAIN_WORKER_LIB": os.Getenv("ORTRAIN_WORKER_LIB")}

	expert, mixed := filepath.Join(dir, "expert.jsonl"), filepath.Join(dir, "mixed.jsonl")
	code, _, errOut := execBinary(t, env, "env", "demos", "lockbox", "--n", "256", "--skill", "1", "--seed", "0", "--out", expert)
	require.Equal(t, ExitOK, code, errOut)
	code, _, errOut = execBinary(t, env, "env", "demos", "lockbox", "--n", "256", "--skill", "0.5", "--seed", "0", "--out", mixed)
	require.Equal(t, ExitOK, code, errOut)

	sftDir := filepath.Join(dir, "sft")
	code, out, errOut := execBinary(t, env, "sft", "--config", cfg, "--data", expert, "--output-dir", sftDir, "--log-format", "json")
	require.Equal(t, ExitOK, code, errOut)
	expertModel := strings.TrimSpace(out)
	require.DirExists(t, expertModel, "sft prints the weights run takes")
	sft := metricsRows(t, sftDir)
	require.NotEmpty(t, sft)
	last := sft[len(sft)-1]
	require.Contains(t, last, "eval_loss")
	t.Logf("expert SFT: eval_loss %.5f, token accuracy %.4f", last["eval_loss"], last["mean_token_accuracy"])
	assert.Greater(t, last["mean_token_accuracy"], 0.99)
	// Held-out loss per trained token: about 0.025 while the model cannot
	// copy the code (the digit is a 1-in-10 guess), under 0.001 once it can.
	assert.Less(t, last["eval_loss"], 0.005, "SFT learned to copy the code from the tool's answer")

	mixedDir := filepath.Join(dir, "sft-mixed")
	code, out, errOut = execBinary(t, env, "sft", "--config", cfg, "--model", expertModel, "--data", mixed, "--max-steps", "400", "--output-dir", mixedDir, "--log-format", "json")
	require.Equal(t, ExitOK, code, errOut)
	model := strings.TrimSpace(out)
	require.DirExists(t, model)

	grpoDir := filepath.Join(dir, "grpo")
	code, _, errOut = execBinary(t, env, "run", "--config", cfg, "--model", model, "--output-dir", grpoDir, "--log-format", "json")
	require.Equal(t, ExitOK, code, errOut)
	rows := metricsRows(t, grpoDir)
	require.GreaterOrEqual(t, len(rows), 15)
	head, tail := rows[:5], rows[len(rows)-10:]
	t.Logf("reward first 5 %.3f, last 10 %.3f; parse rate first 5 %.3f; tool calls last 5 %.2f",
		meanOf(head, "reward"), meanOf(tail, "reward"), meanOf(head, "tools/parse_rate"), meanOf(rows[len(rows)-5:], "tools/call_frequency"))
	assert.GreaterOrEqual(t, meanOf(head, "tools/parse_rate"), 0.9, "after SFT the tool calls parse")
	assert.GreaterOrEqual(t, meanOf(tail, "reward")-meanOf(head, "reward"), 0.25, "GRPO improves the strategy SFT imitated")
	assert.GreaterOrEqual(t, meanOf(rows[len(rows)-5:], "tools/call_frequency"), 2.0, "the policy looks the code up, then unlocks")

	// Issue 36: the same SFT policy trained through the README's agent (a
	// real Python process per rollout, its own loop over the gateway and
	// the env's MCP tools, stopping when a tool result says the episode
	// is over) learns as ortrain's own loop does.
	agentDir := filepath.Join(dir, "grpo-agent")
	agentRows := missionAgentRun(t, env, dir, cfgOut, model, agentDir)
	head, tail = agentRows[:5], agentRows[len(agentRows)-5:]
	t.Logf("agent: reward first 5 %.3f, last 5 %.3f; identical groups first 5 %.1f; calls after finish %.0f",
		meanOf(head, "reward"), meanOf(tail, "reward"), meanOf(head, "rollouts/identical_groups"), meanOf(agentRows, "agent/calls_after_finish"))
	assert.GreaterOrEqual(t, meanOf(tail, "reward")-meanOf(head, "reward"), 0.2, "the agent's policy learns from the env's rewards")
	assert.Less(t, meanOf(head, "rollouts/identical_groups"), 4.0, "a group's rollouts sample differently")
	assert.Zero(t, meanOf(agentRows, "agent/calls_after_finish"), "the agent stops when the episode is over")
}

// missionAgentRun trains model with GRPO on lockbox through the README's
// agent (docs/examples/agents/chat_agent.py) for 25 steps and returns the
// metrics rows.
func missionAgentRun(t *testing.T, env map[string]string, dir, cfgText, model, out string) []map[string]float64 {
	t.Helper()
	py, err := exec.LookPath("python3")
	require.NoError(t, err, "the README's agent runs with python3")
	script, err := filepath.Abs("../../docs/examples/agents/chat_agent.py")
	require.NoError(t, err)
	cfg := filepath.Join(dir, "lockbox-agent.yaml")
	agent := fmt.Sprintf("\nagent:\n  command: [%q, %q]\n", py, script)
	require.NoError(t, os.WriteFile(cfg, []byte(cfgText+agent), 0o644))
	code, _, errOut := execBinary(t, env, "run", "--config", cfg, "--model", model, "--output-dir", out, "--max-steps", "25", "--log-format", "json")
	require.Equal(t, ExitOK, code, errOut)
	rows := metricsRows(t, out)
	require.Len(t, rows, 25)
	for _, r := range rows {
		require.Zero(t, r["rollouts/agent_error"]+r["rollouts/agent_bad_request"], "every agent rollout completes")
	}
	return rows
}
