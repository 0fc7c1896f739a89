package smoke_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/smoke"
	"github.com/ortrain/ortrain/internal/train"
	"github.com/ortrain/ortrain/internal/verdict"
	"github.com/ortrain/ortrain/internal/worker"
)

func requireWorker(t *testing.T) {
	t.Helper()
	if _, searched, err := worker.FindLibrary("", os.Getenv); err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("worker library missing: %v (searched %v)", err, searched)
		}
		t.Skipf("worker library not built: %v", err)
	}
}

// qwen3Dir is a local model directory as `hf download
// Qwen/Qwen3-4B config.json tokenizer.json tokenizer_config.json` leaves
// it: Qwen3's real tokenizer and chat template (testdata/tokenizers/qwen3),
// no weights.
func qwen3Dir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "Qwen3-4B")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, f := range []string{"../../testdata/models/qwen3-4b/config.json", "../../testdata/tokenizers/qwen3/tokenizer.json.gz", "../../testdata/tokenizers/qwen3/tokenizer_config.json"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	return dir
}

// setaStyle is configs/seta.yaml with the built-in lockbox standing in for
// the hosted Eigent/SETA, the local Qwen3 directory for Qwen/Qwen3-4B and
// an expression reward beside the env's.
func setaStyle(t *testing.T, model string) *config.Config {
	t.Helper()
	cfg, err := config.Load(config.Source{File: "../../configs/seta.yaml"})
	require.NoError(t, err)
	cfg.Model = model
	cfg.Envs[0].Target = "builtin:lockbox"
	half := 0.5
	cfg.Rewards = []reward.Spec{
		{Name: "env", Kind: reward.KindEnv},
		{Name: "brevity", Kind: reward.KindExpression, Weight: &half, Expression: "completion_tokens < 8 ? 1.0 : 0.0"},
		{Name: "judge", Kind: reward.KindHTTP, Weight: &half, URL: judge(t)},
	}
	return cfg
}

// judge serves an http scorer on loopback: 1 for a trajectory with a tool
// call, else 0.
func judge(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req reward.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out := reward.Response{Rewards: make([]*float64, len(req.Trajectories))}
		for i, tr := range req.Trajectories {
			v := 0.0
			if tr.NumToolCalls > 0 {
				v = 1
			}
			out.Rewards[i] = &v
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/score"
}

func opts(t *testing.T) smoke.Options {
	return smoke.Options{RunOptions: train.RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }}, Dir: t.TempDir()}
}

func statuses(v *verdict.Verdict) map[string]verdict.Status {
	out := map[string]verdict.Status{}
	for _, c := range v.Checks {
		out[c.Name] = c.Status
	}
	return out
}

func logVerdict(t *testing.T, v *verdict.Verdict) {
	t.Helper()
	var b bytes.Buffer
	_ = v.WriteText(&b)
	t.Log("\n" + b.String())
}

// TestSmokeSETAStyleConfigPasses: the SETA recipe, its model replaced by
// a tiny Qwen3 with Qwen3's real tokenizer and template, trains two steps
// on CPU against a built-in env, checkpoints, resumes for a third and
// passes every check.
func TestSmokeSETAStyleConfigPasses(t *testing.T) {
	requireWorker(t)
	cfg := setaStyle(t, qwen3Dir(t))
	v, err := smoke.Run(context.Background(), cfg, opts(t))
	require.NoError(t, err)
	logVerdict(t, v)
	require.True(t, v.Passed(), v.Summary())
	got := statuses(v)
	for _, name := range []string{"model files", "chat template and tool-call format", "envs[0] builtin:lockbox: session and tools", "train", "checkpoint", "resume", "rewards"} {
		assert.Equal(t, verdict.Pass, got[name], name)
	}
	for _, c := range v.Checks {
		if c.Name == "model files" {
			assert.Contains(t, c.Observed, "qwen3")
			assert.Contains(t, c.Observed, "151936")
		}
		if c.Name == "rewards" {
			assert.Contains(t, c.Observed, "brevity")
			assert.Contains(t, c.Observed, "judge")
		}
	}
}

// TestSmokeMissingModelFiles: a model directory without its tokenizer is
// a failed check naming the files and how to get them; the later checks
// are skipped, not failed.
func TestSmokeMissingModelFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bare")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	b, err := os.ReadFile("../../testdata/models/qwen3-4b/config.json")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644))
	cfg := setaStyle(t, dir)
	v, err := smoke.Run(context.Background(), cfg, opts(t))
	require.NoError(t, err)
	assert.False(t, v.Passed())
	require.NotEmpty(t, v.Checks)
	assert.Equal(t, "model files", v.Checks[0].Name)
	assert.Equal(t, verdict.Fail, v.Checks[0].Status)
	assert.Contains(t, v.Checks[0].Observed, "tokenizer")
	got := statuses(v)
	assert.Equal(t, verdict.Skip, got["train"])
	assert.Equal(t, verdict.Pass, got["envs[0] builtin:lockbox: session and tools"], "the envs are still checked")
}

// TestSmokeUnreachableEnv: an env nobody serves fails its own check with
// the connection error, and training fails too; a cancelled context stops
// the suite.
func TestSmokeUnreachableEnv(t *testing.T) {
	requireWorker(t)
	cfg := setaStyle(t, qwen3Dir(t))
	cfg.Envs[0].Target = "http://127.0.0.1:1"
	cfg.Envs[0].Protocol = "ors"
	v, err := smoke.Run(context.Background(), cfg, opts(t))
	require.NoError(t, err)
	got := statuses(v)
	assert.Equal(t, verdict.Fail, got["envs[0] http://127.0.0.1:1: session and tools"])
	assert.Equal(t, verdict.Fail, got["train"])
	assert.False(t, v.Passed())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = smoke.Run(ctx, cfg, opts(t))
	require.True(t, errors.Is(err, context.Canceled))
}

// TestSmokeBrokenScorer: an http scorer nobody serves fails the run's
// rollouts on their reward, and the verdict says so.
func TestSmokeBrokenScorer(t *testing.T) {
	requireWorker(t)
	cfg := setaStyle(t, qwen3Dir(t))
	retries := 0
	cfg.Rewards[2].URL, cfg.Rewards[2].Retries = "http://127.0.0.1:1/score", &retries
	v, err := smoke.Run(context.Background(), cfg, opts(t))
	require.NoError(t, err)
	assert.False(t, v.Passed())
	var failed []string
	for _, c := range v.Checks {
		if c.Status == verdict.Fail {
			failed = append(failed, c.Name+": "+c.Observed)
		}
	}
	require.NotEmpty(t, failed)
	assert.Contains(t, strings.Join(failed, "\n"), "reward_error")
}
