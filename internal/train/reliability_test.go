package train

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
	"github.com/ortrain/ortrain/internal/rollout"
)

func noEnv(string) string { return "" }

// Issue 14 bug 3: a fatal error after completed steps saves the last
// completed step first, and says how to continue.
func TestFatalErrorSavesTheLastCompletedStep(t *testing.T) {
	requireWorker(t)
	url, _, stop, err := envs.ServeLocal(context.Background(), "letters", orsserver.Options{Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stop(context.Background()) })
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 10)
	cfg.Envs[0].Target = url
	cfg.GRPO.SaveSteps = 0
	cfg.Rollout.RetryBackoff, cfg.Rollout.EnvDownTimeout = 10*time.Millisecond, 50*time.Millisecond
	ro := RunOptions{Logger: zerolog.Nop(), Getenv: noEnv, OnMetrics: func(m StepMetrics) {
		if m.Step == 2 {
			_ = stop(context.Background()) // the env goes away for good
		}
	}}
	res, err := Run(context.Background(), cfg, ro)
	require.ErrorIs(t, err, ErrTooManyFailures)
	assert.Contains(t, err.Error(), "continue with --resume")
	assert.Equal(t, 2, res.Steps)
	ck, step, err := LatestCheckpoint(out)
	require.NoError(t, err)
	assert.Equal(t, 2, step, "the last completed step was saved before exiting")
	assert.FileExists(t, filepath.Join(ck, "model", "model.safetensors"))
}

// Issue 14 bug 6: a final_answer_tool the env does not offer stops the run
// at startup, naming the env's tools.
func TestFinalAnswerToolMustExist(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 1)
	cfg.Chat.FinalAnswerTool = "answer"
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: noEnv})
	var fe *config.FieldError
	require.ErrorAs(t, err, &fe)
	assert.Contains(t, err.Error(), "chat.final_answer_tool")
	assert.Contains(t, err.Error(), "submit", "the error lists the env's tools")
	_, statErr := os.Stat(filepath.Join(out, "metrics.jsonl"))
	assert.True(t, errors.Is(statErr, os.ErrNotExist), "nothing was trained")
}

// Issue 14 bug 6: rounds in which every tool call fails are warned about,
// and rollout.max_failed_tool_steps of them in a row stop the run.
func TestEveryToolCallFailingStopsTheRun(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	loop, _, _ := newTestLoop(t, shape, 10, failingTools{&roundRollouts{}})
	loop.cfg.MaxFailedToolSteps = 3
	err := loop.Run(context.Background())
	require.ErrorIs(t, err, ErrToolsFailing)
	assert.Contains(t, err.Error(), "'submit' is not a valid tool")
	assert.Equal(t, 2, loop.Step(), "two rounds of failing tools are tolerated, the third stops the run")
}

// failingTools makes every tool call of every rollout fail.
type failingTools struct{ inner rolloutRunner }

func (f failingTools) RunAll(ctx context.Context, tasks []rollout.Task, onDone func(*rollout.Trajectory)) []*rollout.Trajectory {
	trajs := f.inner.RunAll(ctx, tasks, onDone)
	for _, t := range trajs {
		t.ToolCalls, t.ToolFailures = 1, 1
		t.Turns = append(t.Turns, rollout.Turn{Role: "tool", Tool: "submit", Error: "tool \"submit\" failed (not_found): 'submit' is not a valid tool"})
	}
	return trajs
}

// Issue 14 bug 8: --overwrite deletes the earlier run only once the new one
// has passed its startup checks.
func TestOverwriteKeepsTheEarlierRunWhenStartupFails(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	require.NoError(t, os.MkdirAll(filepath.Join(out, "checkpoints", "step-000007"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(out, "metrics.jsonl"), []byte("{\"step\":1}\n"), 0o644))
	cfg := quickstart(t, out, 1)
	cfg.Envs[0].Target = "http://127.0.0.1:1" // nothing listens there
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: noEnv, Overwrite: true})
	require.Error(t, err)
	assert.FileExists(t, filepath.Join(out, "metrics.jsonl"), "the earlier run is intact")
	assert.DirExists(t, filepath.Join(out, "checkpoints", "step-000007"))
}

// Issue 14 bug 9: chat settings per env entry: the quickstart's submit tool
// applies to letters only, so echo rollouts in the mix do not all fail.
func TestPerEnvChatSettings(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 2)
	cfg.GRPO.SaveSteps = 0
	none, render := "", true
	cfg.Envs = append(cfg.Envs, config.EnvConfig{Target: "builtin:echo", Split: "train", Weight: 1,
		Chat: config.EnvChatConfig{FinalAnswerTool: &none, RenderTools: &render}})
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: noEnv})
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(out, "trajectories.jsonl"))
	require.NoError(t, err)
	assert.NotContains(t, string(b), "'submit' is not a valid tool")
	assert.Contains(t, string(b), `"tools_offered":["echo","hint"]`)
}

// Issue 14: --resume refuses changed settings that shape the batch unless
// --resume-with-changes, which records them; --resume without a checkpoint
// creates nothing; secrets stay out of config.yaml and the manifest.
func TestResumeWithChangesAndSecrets(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 1)
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: noEnv, Resume: true})
	require.ErrorIs(t, err, ErrNoCheckpoint)
	assert.NoDirExists(t, out, "--resume without a checkpoint creates nothing")

	cfg.Envs[0].Secrets = map[string]string{"TOKEN": "s3cret-value"}
	_, err = Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: noEnv})
	require.NoError(t, err)
	for _, f := range []string{"config.yaml", "manifest.json"} {
		b, err := os.ReadFile(filepath.Join(out, f))
		require.NoError(t, err)
		assert.NotContains(t, string(b), "s3cret-value", f)
		assert.Contains(t, string(b), "TOKEN", f)
	}

	changed := *cfg
	changed.GRPO.MaxSteps = 2
	changed.GRPO.NumGenerations = 4
	changed.GRPO.PerDeviceTrainBatchSize = 16
	_, err = Run(context.Background(), &changed, RunOptions{Logger: zerolog.Nop(), Getenv: noEnv, Resume: true})
	var rc *config.ResumeChangedError
	require.ErrorAs(t, err, &rc)
	assert.Contains(t, err.Error(), "num_generations")

	res, err := Run(context.Background(), &changed, RunOptions{Logger: zerolog.Nop(), Getenv: noEnv, Resume: true, ResumeWithChanges: true})
	require.NoError(t, err)
	assert.Equal(t, 2, res.Steps)
	b, err := os.ReadFile(filepath.Join(out, "resume-changes.jsonl"))
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(b), "num_generations") && strings.Contains(string(b), `"resumed_at_step":1`), string(b))
}
