package agent

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAgentProcessGetsNoCredentials: a real agent process sees none of the
// trainer's credentials (they are in ortrain's environment), sees what the
// config names or sets, and the facts.
func TestAgentProcessGetsNoCredentials(t *testing.T) {
	t.Setenv("OPENREWARD_API_KEY", "or-secret")
	t.Setenv("HF_TOKEN", "hf-secret")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
	t.Setenv("HF_HOME", "/data/hf")
	check := `test -z "$OPENREWARD_API_KEY" && test -z "$HF_TOKEN" && test -z "$AWS_SECRET_ACCESS_KEY" &&
test "$HF_HOME" = /data/hf && test "$AGENT_MODE" = fast && test -n "$PATH" && test -n "$OPENAI_BASE_URL" && test -n "$ANTHROPIC_API_KEY"`
	spec := Spec{Command: []string{"/bin/sh", "-c", check}, Timeout: 10 * time.Second,
		Env: []string{"AGENT_MODE=fast"}, InheritEnv: []string{"HF_HOME"}}
	res := Run(context.Background(), spec, testFacts())
	require.Equal(t, OutcomeOK, res.Outcome, "%v: %s", res.Err, res.StderrTail)

	spec.InheritEnv = append(spec.InheritEnv, "HF_TOKEN")
	res = Run(context.Background(), spec, testFacts())
	assert.Equal(t, OutcomeAgentError, res.Outcome, "a credential the config names does reach the agent")
}
