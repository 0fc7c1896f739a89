package worker

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
)

// Issue 24 (the Hugging Face parity check found it): a model with a
// sliding attention window was computed with full attention, silently 0.8
// to 1.8 nats off transformers past the window. Sequences that fit the
// window are exact, so only longer ones are refused, with a typed error.
func TestSlidingWindowRefusesLongerSequences(t *testing.T) {
	p, ok := model.PresetByName("tiny")
	require.True(t, ok)
	dir := filepath.Join(t.TempDir(), "windowed")
	require.NoError(t, model.Init(dir, p, 1))
	var cfg map[string]any
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &cfg))
	cfg["use_sliding_window"], cfg["sliding_window"], cfg["max_window_layers"] = true, 16, 0
	raw, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644))
	m := loadTiny(t, ModelOptions{Dir: dir, Threads: 1})
	ctx := context.Background()

	row := func(n int) grpo.Row {
		toks := make([]int32, n)
		return grpo.Row{Tokens: toks, PromptLen: 4, LossMask: make([]uint8, n-4)}
	}
	_, _, err = m.Logprobs(ctx, []grpo.Row{row(16)}, 1, false)
	require.NoError(t, err, "a row that fits the window is computed")
	var we *WindowError
	_, _, err = m.Logprobs(ctx, []grpo.Row{row(16), row(17)}, 1, false)
	require.ErrorAs(t, err, &we)
	assert.Equal(t, WindowError{What: "row 1", Len: 17, Window: 16}, *we)
	_, err = m.ForwardBackward(ctx, grpo.MicroBatch{Rows: []grpo.Row{row(20)}, RoundTokens: 16, GradAccumSteps: 1}, grpo.DefaultLossConfig())
	require.ErrorAs(t, err, &we)
	_, err = m.Sample(ctx, []SampleRequest{{PromptIDs: make([]int32, 10), MaxNewTokens: 7, Temperature: 1}})
	require.ErrorAs(t, err, &we)
	assert.Equal(t, 17, we.Len)
	_, err = m.Sample(ctx, []SampleRequest{{PromptIDs: make([]int32, 10), MaxNewTokens: 6, Temperature: 1}})
	require.NoError(t, err)
}
