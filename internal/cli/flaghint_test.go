package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestUnknownFlagsPointToTheirOrtrainForm: TRL habits on the command line
// are usage errors that say what to type instead.
func TestUnknownFlagsPointToTheirOrtrainForm(t *testing.T) {
	cases := []struct {
		args   []string
		wantIn string
	}{
		{[]string{"run", "--learning_rate", "1e-5"}, "spelled with dashes: --learning-rate"},
		{[]string{"run", "--beta", "0.04"}, "grpo.beta"},
		{[]string{"run", "--beta", "0.04"}, "ORTRAIN_GRPO_BETA=VALUE"},
		{[]string{"run", "--use-vllm"}, "engine.kind: vllm"},
		{[]string{"run", "--bf16"}, "worker.dtype: bfloat16"},
		{[]string{"run", "--reward-weights", "1"}, "rewards[].weight"},
	}
	for _, tc := range cases {
		code, _, errOut := execCLI(t, nil, tc.args...)
		assert.Equal(t, ExitUsage, code, "%v", tc.args)
		assert.Contains(t, errOut, tc.wantIn, "%v", tc.args)
	}
}
