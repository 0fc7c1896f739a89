package engineserver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver/servetest"
	"github.com/ortrain/ortrain/internal/vllm"
)

// These tests check each fault the way ortrain meets it: through
// vllm.Client, against the real HTTP server.

func TestFaultsSet(t *testing.T) {
	tests := []struct {
		specs []string
		want  Faults
		err   string
	}{
		{[]string{"reload-noop", "no-token-ids"}, Faults{ReloadNoop: true, NoTokenIDs: true}, ""},
		{[]string{"null-logprobs=0.25", "slow-health=2s"}, Faults{NullLogprobs: 0.25, SlowHealth: 2 * time.Second}, ""},
		{[]string{"null-logprobs=1"}, Faults{NullLogprobs: 1}, ""},
		{[]string{"bogus"}, Faults{}, `unknown fault "bogus": want one of reload-noop, null-logprobs, no-token-ids, slow-health`},
		{[]string{"null-logprobs"}, Faults{}, "fault null-logprobs needs a value: null-logprobs=FRACTION"},
		{[]string{"null-logprobs=2"}, Faults{}, `want a fraction from 0 to 1, got "2"`},
		{[]string{"slow-health=soon"}, Faults{}, `want a duration such as 3s, got "soon"`},
		{[]string{"reload-noop=1"}, Faults{}, "fault reload-noop takes no value"},
	}
	for _, tt := range tests {
		var f Faults
		var err error
		for _, s := range tt.specs {
			if err = f.Set(s); err != nil {
				break
			}
		}
		if tt.err != "" {
			assert.ErrorContains(t, err, tt.err, "%v", tt.specs)
			continue
		}
		require.NoError(t, err, "%v", tt.specs)
		assert.Equal(t, tt.want, f, "%v", tt.specs)
	}
	assert.Contains(t, FaultHelp(), "null-logprobs=FRACTION")
}

func faultClient(t *testing.T, backend *servetest.Backend, faults Faults, lora bool) (*vllm.Client, *toyServer) {
	ts := startToyServer(t, backend, lora, func(o *Options) { o.Faults = faults })
	c, err := vllm.NewClient(ts.URL, nil)
	require.NoError(t, err)
	return c, ts
}

func faultRequest(seed int64, n int) *vllm.CompletionRequest {
	zero := 0
	return &vllm.CompletionRequest{Model: "toy", Prompt: []int32{1, 2}, MaxTokens: 12, N: n, Temperature: 1, TopP: 1, TopK: -1,
		RepetitionPenalty: 1, Seed: &seed, IgnoreEOS: true, Logprobs: &zero, ReturnTokenIDs: true}
}

// TestFaultNullLogprobs: with 1 every log-prob is null and Validate refuses
// the answer; with a fraction, about that share is null, the same tokens
// for the same seed.
func TestFaultNullLogprobs(t *testing.T) {
	ctx := context.Background()
	c, _ := faultClient(t, servetest.NewBackend(0.3), Faults{NullLogprobs: 1}, false)
	resp, err := c.Complete(ctx, faultRequest(5, 1))
	require.NoError(t, err, "the server answers 200")
	var re *vllm.ResponseError
	require.ErrorAs(t, resp.Validate(1), &re)
	assert.Equal(t, "logprobs.token_logprobs", re.Field)
	assert.Equal(t, 0, re.Token)
	for i, lp := range resp.Choices[0].Logprobs.TokenLogprobs {
		assert.Nil(t, lp, "token %d", i)
		assert.Nil(t, resp.Choices[0].Logprobs.TopLogprobs[i], "top_logprobs %d is null with it, as vLLM", i)
	}

	c, _ = faultClient(t, servetest.NewBackend(0.3), Faults{NullLogprobs: 0.5}, false)
	nulls := func(seed int64) []bool {
		resp, err := c.Complete(ctx, faultRequest(seed, 4))
		require.NoError(t, err)
		var out []bool
		for _, ch := range resp.Choices {
			require.Len(t, ch.Logprobs.TokenLogprobs, 12)
			for _, lp := range ch.Logprobs.TokenLogprobs {
				out = append(out, lp == nil)
			}
		}
		return out
	}
	first := nulls(9)
	assert.Equal(t, first, nulls(9), "the same seed blanks the same tokens")
	count := 0
	for _, n := range first {
		if n {
			count++
		}
	}
	assert.InDelta(t, 24, count, 12, "about half of 48 log-probs are null")
}

// TestFaultNoTokenIDs: token_ids are null although asked for; Validate
// refuses the answer.
func TestFaultNoTokenIDs(t *testing.T) {
	c, _ := faultClient(t, servetest.NewBackend(0.3), Faults{NoTokenIDs: true}, false)
	resp, err := c.Complete(context.Background(), faultRequest(5, 2))
	require.NoError(t, err)
	for _, ch := range resp.Choices {
		assert.Nil(t, ch.TokenIDs)
		assert.Nil(t, ch.PromptTokenIDs)
	}
	var re *vllm.ResponseError
	require.ErrorAs(t, resp.Validate(2), &re)
	assert.Equal(t, "token_ids", re.Field)
}

// TestFaultReloadNoop: a full reload and an adapter load of new weights
// succeed, yet samples stay those of the start-up weights.
func TestFaultReloadNoop(t *testing.T) {
	ctx := context.Background()
	backend := servetest.NewBackend(0.3)
	c, _ := faultClient(t, backend, Faults{ReloadNoop: true}, true)
	ref := engine.Request{PromptIDs: []int32{1, 2}, MaxTokens: 12, Seed: 5, Sampling: engine.SamplingParams{Temperature: 1, TopP: 1}}
	want := servetest.Sample(ref, 0.3)
	sample := func(model string) []int32 {
		req := faultRequest(5, 1)
		req.Model = model
		resp, err := c.Complete(ctx, req)
		require.NoError(t, err)
		require.NoError(t, resp.Validate(1))
		return resp.Choices[0].TokenIDs
	}
	require.Equal(t, want.IDs, sample("toy"))
	require.NotEqual(t, want.IDs, servetest.Sample(ref, 3).IDs, "the new weights would sample differently")

	dir := t.TempDir()
	servetest.WriteWeights(t, dir, servetest.Weights{Slope: 3})
	require.NoError(t, c.ReloadWeights(ctx, dir, time.Minute), "the reload answers success")
	assert.Equal(t, want.IDs, sample("toy"), "samples keep the old weights")
	assert.Empty(t, backend.Reloads())
	assert.Equal(t, 0.3, backend.Slope())

	require.NoError(t, c.LoadLoRAAdapter(ctx, "policy-v1", dir), "the adapter load answers success")
	assert.Equal(t, want.IDs, sample("policy-v1"), "the adapter's name samples the base weights")
	assert.Empty(t, backend.Adapters())
	require.NoError(t, c.UnloadLoRAAdapter(ctx, "policy-v1"))
}

// TestFaultSlowHealth: /health answers only after the delay, so a short
// health check times out.
func TestFaultSlowHealth(t *testing.T) {
	c, _ := faultClient(t, servetest.NewBackend(0), Faults{SlowHealth: 300 * time.Millisecond}, false)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, c.Health(short), context.DeadlineExceeded)
	start := time.Now()
	require.NoError(t, c.Health(context.Background()))
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
}
