package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ortrain/ortrain/internal/sft"
)

// TestSFTNextCommandContinuesTheJob: the "next:" line sft prints trains
// the same job with GRPO: the config it ran with (its envs and chat) and
// the weights it wrote, quoted where a shell needs it.
func TestSFTNextCommandContinuesTheJob(t *testing.T) {
	res := &sft.Result{Steps: 2, MaxSteps: 2, Last: map[string]float64{"loss": 0.1}, Model: "runs/x sft/model", RunDir: "runs/x sft"}
	for _, tc := range []struct{ config, want string }{
		{"configs/lockbox.yaml", "next:    ortrain run --config configs/lockbox.yaml --model 'runs/x sft/model'   (GRPO from here)\n"},
		{"", "next:    ortrain run --model 'runs/x sft/model'   (GRPO from here)\n"},
		{"my config's.yaml", "next:    ortrain run --config 'my config'\\''s.yaml' --model 'runs/x sft/model'   (GRPO from here)\n"},
	} {
		var b bytes.Buffer
		printSFTSummary(&b, "ortrain", tc.config, res)
		assert.Contains(t, b.String(), tc.want)
	}
	assert.Equal(t, "a/b-c_1.yaml", shellQuote("a/b-c_1.yaml"))
}
