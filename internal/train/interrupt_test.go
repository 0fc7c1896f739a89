package train

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/launch"
)

// TestInterruptSummary: an interrupted run's result says what was saved,
// and its error never prints an empty checkpoint path (SIGINT before the
// first step used to print "checkpoint: ").
func TestInterruptSummary(t *testing.T) {
	tests := []struct {
		name       string
		step       int
		rank       int
		checkpoint string // res.Checkpoint before finishRun (a periodic save)
		wantNote   string
	}{
		{name: "before the first step", wantNote: "(no step had completed: nothing was saved)"},
		{name: "step saved already", step: 3, checkpoint: "/runs/r/checkpoints/step-3", wantNote: "(checkpoint: /runs/r/checkpoints/step-3)"},
		{name: "another rank", step: 3, rank: 1, wantNote: "(rank 0 saves the checkpoint)"},
		{name: "another rank before the first step", rank: 1, wantNote: "(no step had completed: nothing was saved)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			loop := &stepLoop{step: tt.step}
			res := &Result{RunDir: "/runs/r", Checkpoint: tt.checkpoint}
			if tt.checkpoint != "" {
				res.savedStep = tt.step
			}
			ro := RunOptions{World: launch.World{Rank: tt.rank, WorldSize: 2}}
			got, err := finishRun(ctx, &config.Config{}, ro, loop, nil, res, context.Canceled)
			require.ErrorIs(t, err, ErrInterrupted)
			require.NotNil(t, got)
			assert.Equal(t, tt.step, got.Steps)
			assert.Equal(t, tt.checkpoint, got.Checkpoint, "nothing is saved by an interrupt with no new step")
			assert.Contains(t, err.Error(), tt.wantNote)
			assert.NotContains(t, err.Error(), "checkpoint: )")
		})
	}
}
