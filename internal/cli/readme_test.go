package cli

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeAction is how TestREADMECommandsRunAsWritten treats one command of
// the README: as written (the zero value), bounded (the same command with a
// smaller step count, where the written one trains for minutes: the edit
// says what changed), or not run, with why (a GPU, vLLM, the network, or a
// command that is the test suite itself).
type readmeAction struct {
	skip    string
	replace [][2]string // old, new
	add     string      // appended arguments
	why     string      // why a bounded command differs from the README
	server  bool        // a foreground server: started in the background, stopped at the end
}

// readmeCommands classifies every command in the README's sh blocks, keyed
// by the command without its trailing comment. A command not listed fails
// the test: a new README command is either run here or says why not.
var readmeCommands = map[string]readmeAction{
	"make demo":  {skip: "scripts/demo: TestMissionSFTThenGRPO trains that path to its learning bar"},
	"make test":  {skip: "the test suite itself"},
	"make build": {skip: "the test runs the binary it built (the same go build); make install and make build run in scripts/check-install"},

	"bin/ortrain env demos lockbox --n 256 --skill 1 --out demos.jsonl": {},
	"bin/ortrain sft --config configs/lockbox.yaml --data demos.jsonl --output-dir runs/lockbox-sft": {
		add: "--max-steps 3", why: "2,500 steps take minutes; TestMissionSFTThenGRPO trains lockbox to the end"},
	"bin/ortrain sft --config configs/lockbox.yaml --data demos.jsonl --output-dir runs/lockbox-sft --resume": {
		add: "--max-steps 4", why: "continues the bounded run one step"},
	"bin/ortrain run --config configs/lockbox.yaml --model runs/lockbox-sft/checkpoints/step-002500/model": {
		replace: [][2]string{{"step-002500", "step-000004"}}, add: "--max-steps 1", why: "the bounded SFT's last step"},

	"bin/ortrain run":                                 {},
	"bin/ortrain run --resume --max-steps 200":        {replace: [][2]string{{"200", "102"}}, why: "two steps more show the continuation"},
	"bin/ortrain run --overwrite":                     {},
	"bin/ortrain run --config my.yaml --dry-run":      {}, // my.yaml: the test writes the quickstart's config there
	"bin/ortrain run --config my.yaml --print-config": {},
	"bin/ortrain run --config configs/ladder.yaml --set grpo.dynamic_sampling=true --set curriculum.enabled=true": {
		add: "--max-steps 3", why: "three steps show the round filled and the pass rates saved (scripts/bench-curriculum trains it to the end)"},
	"bin/ortrain list-tasks --run runs/ladder":                                                  {},
	"bin/ortrain report runs/quickstart":                                                        {},
	"bin/ortrain eval --model runs/quickstart/checkpoints/step-000100/model -n 4 --num-tasks 8": {},

	"bin/ortrain env list":                                       {},
	"bin/ortrain env serve echo --port 8080 &":                   {},
	"bin/ortrain list-tasks --env http://127.0.0.1:8080 --tools": {},
	"bin/ortrain list-tasks --env builtin:letters --num-tasks 5": {},
	"bin/ortrain list-tasks --env Eigent/SETA --num-tasks 5 --format json": {
		skip: "the OpenReward catalog: the network and OPENREWARD_API_KEY (TestListTasks* run a local catalog)"},

	"bin/ortrain init-model --preset mini --out models/mini": {},
	"bin/ortrain doctor": {},
	"bin/ortrain serve-vllm --model Qwen/Qwen3-4B --gpus 2,3": {
		skip: "vLLM, two GPUs and Qwen3-4B (TestServeVLLM* supervise a stand-in)"},
	"bin/ortrain serve-engine --model models/tiny --port 8001": {server: true},

	"bin/ortrain env serve guess --port 8000 &":                                {},
	"bin/ortrain list-tasks --env http://127.0.0.1:8000 --num-tasks 3 --tools": {},
	"cat > guess.yaml <<'YAML'":                                                {},
	"bin/ortrain run --config guess.yaml": {add: "--model models/tiny --max-steps 1",
		why: "Qwen3-0.6B is not in CI's Hugging Face cache: the tiny model trains one step against the same env"},

	"VLLM_API_KEY=$(openssl rand -hex 16) ortrain serve-vllm --model Qwen/Qwen3-4B --gpus 2,3 --host 0.0.0.0": {
		skip: "vLLM and GPUs (TestServeVLLMGuardsBeyondLoopback runs the guard over a stand-in)"},
	"ortrain run --config configs/quickstart.yaml --nproc-per-node 2 --output-dir runs/two-ranks": {
		add: "--max-steps 2", why: "two steps show both ranks train (TestDataParallel* compare them with one rank)"},
	"srun ortrain run --config my.yaml": {skip: "SLURM (TestDataParallelFromLauncherVariables sets its variables by hand)"},

	"make lint":   {skip: "make test runs it"},
	"make worker": {skip: "make test builds the worker"},
	"make bench":  {skip: "benchmarks, not tests"},
}

// readmeCommandLines returns the commands of the README's sh blocks in
// order: one per line, a heredoc with its body, comment-only lines dropped.
func readmeCommandLines(t *testing.T, readme string) []string {
	t.Helper()
	var cmds []string
	inBlock, heredoc := false, ""
	for _, line := range strings.Split(readme, "\n") {
		switch {
		case !inBlock:
			inBlock = line == "```sh"
			continue
		case heredoc != "":
			cmds[len(cmds)-1] += "\n" + line
			if line == heredoc {
				heredoc = ""
			}
			continue
		case line == "```":
			inBlock = false
			continue
		}
		cmd := strings.TrimSpace(line)
		if cmd == "" || strings.HasPrefix(cmd, "#") {
			continue
		}
		cmds = append(cmds, cmd)
		if m := regexp.MustCompile(`<<'(\w+)'`).FindStringSubmatch(cmd); m != nil {
			heredoc = m[1]
		}
	}
	require.False(t, inBlock, "an sh block is not closed")
	return cmds
}

// readmeKey is a command without its trailing comment.
func readmeKey(cmd string) string {
	first, _, _ := strings.Cut(cmd, "\n")
	if i := strings.Index(first, "   #"); i >= 0 {
		first = first[:i]
	} else if i := strings.Index(first, " # "); i >= 0 {
		first = first[:i]
	}
	return strings.Join(strings.Fields(first), " ")
}

// TestREADMECommandsRunAsWritten follows the README from top to bottom as a
// newcomer would, in one scratch directory holding the repository's
// configs: every command of its sh blocks runs as written (bin/ortrain and
// ortrain are the binary this test built), bounded where the written one
// trains for minutes, or is listed with why it cannot run here.
func TestREADMECommandsRunAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a minute")
	}
	lib := requireWorkerLib(t)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	cmds := readmeCommandLines(t, string(readme))
	require.NotEmpty(t, cmds)

	script := []string{
		"set -euo pipefail",
		"trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true' EXIT",
		`listening() { for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "nothing listens on port $1" >&2; return 1; }`,
	}
	port := regexp.MustCompile(`--port (\d+)`)
	seen := map[string]bool{}
	for _, cmd := range cmds {
		key := readmeKey(cmd)
		seen[key] = true
		act, ok := readmeCommands[key]
		if !assert.True(t, ok, "README command %q is neither run by this test nor listed with why not: add it to readmeCommands", key) {
			continue
		}
		if act.skip != "" {
			t.Logf("not run: %s (%s)", key, act.skip)
			continue
		}
		run := cmd
		if !strings.Contains(cmd, "\n") {
			run = key
		}
		for _, r := range act.replace {
			require.Contains(t, run, r[0], "README command %q changed: update readmeCommands", key)
			run = strings.Replace(run, r[0], r[1], 1)
		}
		background := strings.HasSuffix(run, "&") || act.server
		run = strings.TrimSpace(strings.TrimSuffix(run, "&"))
		if act.add != "" {
			run += " " + act.add
			t.Logf("bounded: %s + %s (%s)", key, act.add, act.why)
		}
		script = append(script, "echo "+shellQuote("+ "+strings.SplitN(run, "\n", 2)[0]))
		if background {
			m := port.FindStringSubmatch(run)
			require.NotNil(t, m, "a background command needs --port to wait for: %s", key)
			script = append(script, run+" &", "listening "+m[1])
			continue
		}
		script = append(script, run)
	}
	for key := range readmeCommands {
		assert.True(t, seen[key], "readmeCommands lists %q, which the README no longer has", key)
	}

	dir := t.TempDir()
	bin := buildOrtrain(t)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.Symlink(bin, filepath.Join(dir, "bin", "ortrain")))
	require.NoError(t, os.CopyFS(filepath.Join(dir, "configs"), os.DirFS("../../configs")))
	quickstart, err := os.ReadFile("../../configs/quickstart.yaml")
	require.NoError(t, err)
	// my.yaml is the reader's own config: the quickstart's, in its own run directory.
	mine := strings.Replace(string(quickstart), "output_dir: runs/quickstart", "output_dir: runs/mine", 1)
	require.NotEqual(t, string(quickstart), mine, "configs/quickstart.yaml no longer sets output_dir: update this test")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "my.yaml"), []byte(mine), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "readme.sh"), []byte(strings.Join(script, "\n")+"\n"), 0o755))

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "readme.sh")
	sh.Dir = dir
	sh.Env = append(os.Environ(), "ORTRAIN_WORKER_LIB="+lib, "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"),
		"HF_HOME="+filepath.Join(dir, "hf"), "OPENREWARD_API_KEY=")
	out, err := sh.CombinedOutput()
	require.NoError(t, err, "the README's commands, as run:\n%s", lastLines(string(out), 60))
	for _, want := range []string{"runs/quickstart/checkpoints/step-000100", "report.html", "pass@"} {
		assert.Contains(t, string(out), want)
	}
	assert.FileExists(t, filepath.Join(dir, "runs", "two-ranks", "checkpoints", "step-000002", "model", "model.safetensors"))
	assert.FileExists(t, filepath.Join(dir, "models", "mini", "config.json"))
}
