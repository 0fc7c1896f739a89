package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSpecValidate(t *testing.T) {
	t.Parallel()
	ok := Spec{Command: []string{"agent"}, Timeout: time.Second}
	cases := []struct {
		name  string
		edit  func(*Spec)
		field string // "" means valid
	}{
		{name: "command", edit: func(*Spec) {}},
		{name: "url", edit: func(s *Spec) { s.Command, s.URL = nil, "https://agent.example/run" }},
		{name: "both", edit: func(s *Spec) { s.URL = "http://127.0.0.1/run" }, field: "agent.url"},
		{name: "neither", edit: func(s *Spec) { s.Command = nil }, field: "agent.command"},
		{name: "empty program", edit: func(s *Spec) { s.Command = []string{" ", "x"} }, field: "agent.command"},
		{name: "unparsable url", edit: func(s *Spec) { s.Command, s.URL = nil, "http://[::1" }, field: "agent.url"},
		{name: "relative url", edit: func(s *Spec) { s.Command, s.URL = nil, "/run" }, field: "agent.url"},
		{name: "other scheme", edit: func(s *Spec) { s.Command, s.URL = nil, "ftp://host/run" }, field: "agent.url"},
		{name: "no timeout", edit: func(s *Spec) { s.Timeout = 0 }, field: "agent.timeout"},
		{name: "negative grace", edit: func(s *Spec) { s.KillGrace = -time.Second }, field: "agent.kill_grace"},
		{name: "negative tail", edit: func(s *Spec) { s.TailBytes = -1 }, field: "agent.tail_bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := ok
			spec.Command = append([]string(nil), ok.Command...)
			tc.edit(&spec)
			err := spec.Validate()
			if tc.field == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field)
			res := Run(context.Background(), spec, testFacts())
			assert.Equal(t, OutcomeAgentError, res.Outcome)
		})
	}
	t.Run("url credentials stay out of the message", func(t *testing.T) {
		t.Parallel()
		err := Spec{URL: "ftp://user:hunter2@host/", Timeout: time.Second}.Validate()
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "hunter2")
	})
}

func TestOutcome(t *testing.T) {
	t.Parallel()
	assert.False(t, OutcomeOK.Failed())
	for _, o := range []Outcome{OutcomeAgentError, OutcomeTimeout, OutcomeBadOutput, OutcomeCanceled} {
		assert.True(t, o.Failed(), o)
		assert.Equal(t, o != OutcomeCanceled, o.AgentFault(), o)
	}
	assert.False(t, OutcomeOK.AgentFault())
}

func TestBadTask(t *testing.T) {
	t.Parallel()
	facts := testFacts()
	facts.Task = json.RawMessage(`{"unclosed":`)
	for _, spec := range []Spec{
		{Command: []string{"/bin/true"}, Timeout: time.Second},
		{URL: "http://127.0.0.1:1/run", Timeout: time.Second},
	} {
		res := Run(context.Background(), spec, facts)
		assert.Equal(t, OutcomeAgentError, res.Outcome)
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, key, want string }{
		{"plain", "", "plain"},
		{"a " + testKey + " b " + testKey, testKey, "a " + redacted + " b " + redacted},
		{testKey[len(testKey)-6:] + " rest", testKey, redacted + " rest"},
		{testKey[len(testKey)-3:] + " rest", testKey, testKey[len(testKey)-3:] + " rest"}, // too short to be the key
		{"nothing here", testKey, "nothing here"},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, redact(tc.in, tc.key), tc.in)
	}
}

// TestTailBuffer compares the kept tail with the end of everything written,
// for writes smaller than, equal to and larger than the limit.
func TestTailBuffer(t *testing.T) {
	t.Parallel()
	const limit = 100
	tail := newTailBuffer(limit)
	var all bytes.Buffer
	for i, n := range []int{1, 7, 99, 100, 101, 250, 3, 0, 64, 64, 64} {
		chunk := bytes.Repeat([]byte{byte('a' + i)}, n)
		tail.write(chunk)
		all.Write(chunk)
		want := all.Bytes()
		if len(want) > limit {
			want = want[len(want)-limit:]
		}
		assert.Equal(t, string(want), tail.String(), "after write %d", i)
		assert.LessOrEqual(t, cap(tail.buf), 8*limit)
	}
	// A multi-byte character cut by the limit is dropped whole.
	tail = newTailBuffer(4)
	tail.write([]byte("xé€")) // é is 2 bytes, € is 3: the tail starts inside é
	assert.Equal(t, "€", tail.String())
}

func TestLastLine(t *testing.T) {
	t.Parallel()
	write := func(limit int, chunks ...string) (string, bool) {
		l := &lastLine{limit: limit}
		for _, c := range chunks {
			l.write([]byte(c))
		}
		line, cut := l.final()
		return string(line), cut
	}
	line, cut := write(100, "a\nb", "c\n", "\n  \n")
	assert.Equal(t, "bc", line)
	assert.False(t, cut)
	line, cut = write(100, "a\n", "last")
	assert.Equal(t, "last", line)
	assert.False(t, cut)
	line, cut = write(4, "ok\n", "{\"reward\"", ": 1}\n")
	assert.Equal(t, "{\"re", line)
	assert.True(t, cut)
	line, _ = write(4, "")
	assert.Empty(t, line)
}

func TestParseReportLine(t *testing.T) {
	t.Parallel()
	cases := []struct {
		line   string
		cut    bool
		bad    bool
		reward *float64
	}{
		{line: `{"reward": 3}`, reward: ptr(3)},
		{line: `  {"reward": 0, "x": null}  `, reward: ptr(0)},
		{line: `{"reward": null}`},
		{line: `done`},
		{line: `[1, 2]`},
		{line: ``},
		{line: `{"reward": true}`, bad: true},
		{line: `{"Reward": 1}`, bad: true},
		{line: `{}`, bad: true},
		{line: `{"reward": 1}{"reward": 2}`, bad: true},
		{line: `{"reward": 1`, cut: true, bad: true},
		{line: "text \xe2\x82", cut: true}, // a cut, otherwise valid line
		{line: "text \xe2\x82", bad: true},
		{line: "\xff", bad: true},
	}
	for _, tc := range cases {
		reward, err := parseReportLine([]byte(tc.line), tc.cut)
		if tc.bad {
			assert.ErrorIs(t, err, errBadOutput, tc.line)
			continue
		}
		assert.NoError(t, err, tc.line)
		assert.Equal(t, tc.reward, reward, tc.line)
	}
}

func TestProgramPath(t *testing.T) {
	t.Parallel()
	wd, err := os.Getwd()
	require.NoError(t, err)
	for in, want := range map[string]string{
		"python3":         "python3",
		"/usr/bin/env":    "/usr/bin/env",
		"./bin/agent":     filepath.Join(wd, "bin/agent"),
		"scripts/agent.x": filepath.Join(wd, "scripts/agent.x"),
	} {
		got, err := programPath(in)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
}

func TestAgentEnv(t *testing.T) {
	t.Parallel()
	parent := []string{"PATH=/bin", "OPENAI_API_KEY=old", "ORTRAIN_MCP_URL=old", "OPENAI_BASE_URL_EXTRA=kept", "LC_ALL=C",
		"OPENREWARD_API_KEY=secret", "HF_TOKEN=secret", "VLLM_API_KEY=secret", "AWS_SECRET_ACCESS_KEY=secret", "MY_ENV_TOKEN=secret",
		"HF_HOME=/cache", "EMPTY="}
	facts := testFacts()
	facts.MCPURL = ""
	env := agentEnv(parent, Spec{Env: []string{"AGENT_MODE=fast"}, InheritEnv: []string{"HF_HOME"}}, facts, "{}")
	joined := strings.Join(env, "\n")
	assert.Contains(t, env, "PATH=/bin")
	assert.Contains(t, env, "OPENAI_BASE_URL_EXTRA=kept")
	assert.Contains(t, env, "LC_ALL=C")
	assert.Contains(t, env, "HF_HOME=/cache", "named by agent.inherit_env")
	assert.Contains(t, env, "AGENT_MODE=fast", "set by agent.env")
	assert.NotContains(t, joined, "secret", "the trainer's credentials never reach the agent")
	assert.NotContains(t, env, "EMPTY=")
	assert.Contains(t, env, EnvAPIKey+"="+testKey)
	assert.Contains(t, env, EnvTask+"={}")
	assert.NotContains(t, joined, "=old")
	assert.NotContains(t, joined, EnvMCPURL+"=")
}
