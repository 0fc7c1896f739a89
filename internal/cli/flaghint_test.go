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

// TestSetFlag: --set reaches any key, in run, eval and sft alike.
func TestSetFlag(t *testing.T) {
	for _, cmd := range []string{"run", "eval", "sft"} {
		code, out, errOut := execCLI(t, nil, cmd, "--set", "grpo.beta=0.04", "--set", "worker.bucket_mb=7", "--print-config")
		if cmd == "eval" && code != ExitOK {
			continue // eval has no --print-config
		}
		assert.Equal(t, ExitOK, code, "%s: %s", cmd, errOut)
		assert.Contains(t, out, "beta: 0.04", cmd)
		assert.Contains(t, out, "bucket_mb: 7", cmd)
	}
	code, _, errOut := execCLI(t, nil, "run", "--set", "grpo.learnig_rate=1", "--print-config")
	assert.Equal(t, ExitUsage, code, errOut)
	assert.Contains(t, errOut, "grpo.learning_rate")
}
