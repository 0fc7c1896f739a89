package train

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/rollout"
)

// sameSeedRollouts stands in for a sampler that ignores seeds (an agent or
// a server that fixes one): every rollout of a group is the same tokens,
// the group's rewards have no spread; with distinct set, each rollout
// samples its own tokens.
type sameSeedRollouts struct {
	g        int
	distinct bool
}

func (r *sameSeedRollouts) RunAll(ctx context.Context, tasks []rollout.Task, onDone func(*rollout.Trajectory)) []*rollout.Trajectory {
	out := make([]*rollout.Trajectory, len(tasks))
	for i, t := range tasks {
		tok := int32(i / r.g)
		if r.distinct {
			tok = int32(100 + i)
		}
		rew := 0.5
		out[i] = &rollout.Trajectory{Task: t, Tokens: []int32{1, 2, tok, 9}, PromptLen: 2, LossMask: []uint8{1, 1},
			Logprobs: []float32{-1, -1}, Rewards: []*float64{&rew}, Outcome: rollout.OutcomeDone}
		if onDone != nil {
			onDone(out[i])
		}
	}
	return out
}

// TestIdenticalGroupsAreCountedAndWarned: a sampler whose rollouts of a
// task are token for token the same is counted every step
// (rollouts/identical_groups) and warned about loudly once per run at a
// temperature above 0; distinct samples, or greedy sampling, are not.
func TestIdenticalGroupsAreCountedAndWarned(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	for _, tc := range []struct {
		name        string
		distinct    bool
		temperature float64
		identical   float64
		warnings    int
	}{
		{"one seed for every rollout", false, 1, 2, 1},
		{"distinct samples", true, 1, 0, 0},
		{"greedy decoding is identical by design", false, 0, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loop, _, _ := newTestLoop(t, shape, 3, &sameSeedRollouts{g: shape.G, distinct: tc.distinct})
			var logs bytes.Buffer
			loop.log = zerolog.New(&logs)
			loop.cfg.Loss.Temperature = tc.temperature
			var got []map[string]float64
			loop.OnMetrics = func(m StepMetrics) { got = append(got, m.Map()) }
			require.NoError(t, loop.Run(context.Background()))
			require.Len(t, got, 3)
			for _, m := range got {
				assert.Equal(t, tc.identical, m["rollouts/identical_groups"])
			}
			warnings := 0
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				var rec map[string]any
				if json.Unmarshal([]byte(line), &rec) != nil {
					continue
				}
				if rec["level"] == "warn" && rec["identical_groups"] != nil {
					warnings++
					assert.Equal(t, 2.0, rec["identical_groups"])
					assert.Equal(t, 2.0, rec["groups"])
				}
			}
			assert.Equal(t, tc.warnings, warnings, "warned once per run, not every step")
		})
	}
}
