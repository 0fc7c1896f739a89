package sft_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/sft"
	"github.com/ortrain/ortrain/internal/train"
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

// lockboxRow is a two-turn lockbox conversation with code d.
func lockboxRow(d int) string {
	return strings.ReplaceAll(goodRow, "482", fmt.Sprint(d))
}

// writeData writes n conversations (and a broken row at line bad, if > 0).
func writeData(t *testing.T, dir string, n, bad int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		if i+1 == bad {
			b.WriteString(`{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"tool","content":"z"}]}` + "\n")
			continue
		}
		b.WriteString(lockboxRow(i%10) + "\n")
	}
	path := filepath.Join(dir, "data.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	return path
}

func sftConfig(t *testing.T, dir, data string, maxSteps int, lora bool) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Model = filepath.Join(dir, "tiny")
	cfg.InitModelPreset = "tiny"
	cfg.OutputDir = filepath.Join(dir, "run")
	cfg.Seed = 3
	cfg.Chat.SystemPrompt = "Use the tools."
	cfg.Worker.Threads = 1
	cfg.SFT.Data = data
	cfg.SFT.MaxSteps = maxSteps
	cfg.SFT.LearningRate = 3e-3
	cfg.SFT.PerDeviceTrainBatchSize = 2
	cfg.SFT.GradientAccumulationSteps = 2
	cfg.SFT.EvalSplit = 0.2
	cfg.SFT.EvalSteps = 2
	cfg.SFT.SaveSteps = 0
	cfg.SFT.LoRA.Enabled = lora
	if lora {
		cfg.SFT.LoRA.Dropout = 0
		cfg.SFT.LoRA.ModulesToSave = []string{"norm"}
	}
	return &cfg
}

func readMetrics(t *testing.T, dir string) []map[string]float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]float64
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		out = append(out, m)
	}
	return out
}

func runOpts(resume bool) sft.RunOptions {
	return sft.RunOptions{RunOptions: train.RunOptions{Logger: zerolog.Nop(), Getenv: os.Getenv, Resume: resume}}
}

// TestRunTrainsAndResumesExactly: an SFT run interrupted after step 3 (its
// context cancelled, as SIGINT does) saves step 3; --resume then logs
// exactly the metrics of the run that was never interrupted.
func TestRunTrainsAndResumesExactly(t *testing.T) {
	requireWorker(t)
	dir := t.TempDir()
	data := writeData(t, dir, 20, 0)

	whole := sftConfig(t, filepath.Join(dir, "whole"), data, 6, false)
	res, err := sft.Run(context.Background(), whole, runOpts(false))
	require.NoError(t, err)
	assert.Equal(t, 6, res.Steps)
	assert.Equal(t, 16, res.Data.Rows)
	assert.Equal(t, 4, res.Data.EvalRows)
	require.DirExists(t, res.Model)
	assert.FileExists(t, filepath.Join(res.Model, "config.json"), "the weights run --model takes")
	want := readMetrics(t, whole.OutputDir)
	require.Len(t, want, 6)
	assert.Less(t, want[5]["loss"], want[0]["loss"])
	for _, k := range []string{"loss", "mean_token_accuracy", "learning_rate", "grad_norm", "tokens_per_second", "epoch"} {
		assert.Contains(t, want[0], k)
	}
	assert.Contains(t, want[1], "eval_loss", "eval every 2 steps")
	assert.NotContains(t, want[0], "eval_loss")
	var man struct {
		Extra struct {
			Kind    string        `json:"kind"`
			Details sft.DataStats `json:"details"`
		} `json:"extra"`
	}
	require.NoError(t, train.ReadJSON(filepath.Join(whole.OutputDir, "manifest.json"), &man))
	assert.Equal(t, "sft", man.Extra.Kind)
	assert.Equal(t, 16, man.Extra.Details.Rows)
	assert.Len(t, man.Extra.Details.SHA256, 64)

	cut := sftConfig(t, filepath.Join(dir, "cut"), data, 6, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ro := runOpts(false)
	ro.OnMetrics = func(step int, _ map[string]float64) {
		if step == 3 {
			cancel()
		}
	}
	res, err = sft.Run(ctx, cut, ro)
	require.ErrorIs(t, err, train.ErrInterrupted)
	assert.Equal(t, 3, res.Steps)
	assert.DirExists(t, filepath.Join(cut.OutputDir, "checkpoints", "step-000003"))

	res, err = sft.Run(context.Background(), cut, runOpts(true))
	require.NoError(t, err)
	assert.Equal(t, 6, res.Steps)
	got := readMetrics(t, cut.OutputDir)
	require.Len(t, got, 6)
	for i := range want {
		for _, k := range []string{"loss", "mean_token_accuracy", "grad_norm", "eval_loss", "num_tokens", "epoch"} {
			assert.Equal(t, want[i][k], got[i][k], "%s of step %d", k, i+1)
		}
	}

	// A resume that changes what the steps train on is refused.
	changed := sftConfig(t, filepath.Join(dir, "cut"), data, 6, false)
	changed.OutputDir = cut.OutputDir
	changed.SFT.PerDeviceTrainBatchSize = 4
	_, err = sft.Run(context.Background(), changed, runOpts(true))
	var rc *config.ResumeChangedError
	require.ErrorAs(t, err, &rc)

	// So is one whose data file keeps its name but not its rows.
	other := writeData(t, t.TempDir(), 20, 0)
	b, err := os.ReadFile(other)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(data, append(b, []byte(lockboxRow(7)+"\n")...), 0o644))
	_, err = sft.Run(context.Background(), cut, runOpts(true))
	require.ErrorAs(t, err, &rc)
	require.Len(t, rc.Changes, 1)
	assert.Equal(t, "sft.data (contents, sha256)", rc.Changes[0].Field)

	// --resume-with-changes accepts it and records what changed.
	more := sftConfig(t, filepath.Join(dir, "cut"), data, 7, false)
	more.OutputDir = cut.OutputDir
	accept := runOpts(true)
	accept.ResumeWithChanges = true
	res, err = sft.Run(context.Background(), more, accept)
	require.NoError(t, err)
	assert.Equal(t, 7, res.Steps)
	b, err = os.ReadFile(filepath.Join(cut.OutputDir, "resume-changes.jsonl"))
	require.NoError(t, err)
	assert.Contains(t, string(b), "sft.data (contents, sha256)")
}

func TestRunLoRASavesAnAdapter(t *testing.T) {
	requireWorker(t)
	dir := t.TempDir()
	cfg := sftConfig(t, dir, writeData(t, dir, 12, 0), 2, true)
	res, err := sft.Run(context.Background(), cfg, runOpts(false))
	require.NoError(t, err)
	assert.Equal(t, "adapter", filepath.Base(res.Model))
	assert.FileExists(t, filepath.Join(res.Model, "adapter_model.safetensors"))
	assert.FileExists(t, filepath.Join(res.Model, "adapter_config.json"))
}

func TestRunBadDataNamesTheRow(t *testing.T) {
	dir := t.TempDir()
	cfg := sftConfig(t, dir, writeData(t, dir, 12, 5), 2, false)
	_, err := sft.Run(context.Background(), cfg, runOpts(false))
	var re *sft.RowError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 5, re.Line)
	assert.Equal(t, "messages[2]", re.Field, "a tool message answering no call")
	assert.NoDirExists(t, cfg.OutputDir, "nothing is written for data that cannot train")

	cfg.SFT.SkipBadRows = true
	cfg.SFT.MaxSteps = 1
	cfg.SFT.EvalSplit = 0
	if _, _, err := worker.FindLibrary("", os.Getenv); err != nil {
		return // the rest trains
	}
	res, err := sft.Run(context.Background(), cfg, runOpts(false))
	require.NoError(t, err)
	assert.Equal(t, 1, res.Data.Skipped)
	assert.Equal(t, 11, res.Data.Rows)

	cfg.SFT.Data = filepath.Join(dir, "missing.jsonl")
	_, err = sft.Run(context.Background(), cfg, runOpts(false))
	assert.True(t, errors.Is(err, os.ErrNotExist))
}
