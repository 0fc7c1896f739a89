package cli

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEnvCheckBuiltins: the built-in envs pass the conformance suite over
// both protocols, through the command a user types; the JSON and JUnit
// verdicts land in their files and agree with the exit status.
func TestEnvCheckBuiltins(t *testing.T) {
	for _, tc := range []struct{ target, protocol, suite string }{
		{"builtin:lockbox", "", "env check (ORS)"},
		{"builtin:letters", "", "env check (ORS)"},
		{"builtin:lockbox", "openenv", "env check (OpenEnv)"},
		{"builtin:guess", "", "env check (OpenEnv)"},
		{"builtin:echo", "", "env check (ORS)"},
		{"builtin:echo", "openenv", "env check (OpenEnv)"},
		{"builtin:letters", "openenv", "env check (OpenEnv)"},
		{"builtin:mcp-echo", "", "env check (OpenEnv)"},
		{"builtin:ladder", "", "env check (ORS)"},
		{"builtin:ladder", "openenv", "env check (OpenEnv)"},
	} {
		t.Run(tc.target+"/"+tc.protocol, func(t *testing.T) {
			dir := t.TempDir()
			jsonPath, junitPath := filepath.Join(dir, "v.json"), filepath.Join(dir, "v.xml")
			args := []string{"env", "check", tc.target, "--json", jsonPath, "--junit", junitPath}
			if tc.protocol != "" {
				args = append(args, "--protocol", tc.protocol)
			}
			code, out, errOut := execCLI(t, nil, args...)
			require.Equal(t, ExitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			assert.Contains(t, out, "PASS: ")

			var v struct {
				Suite, Target string
				Passed        bool
				Counts        map[string]int
			}
			b, err := os.ReadFile(jsonPath)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &v))
			assert.True(t, v.Passed)
			assert.Equal(t, tc.suite, v.Suite)
			assert.Equal(t, tc.target, v.Target, "the verdict names what the user typed, not a loopback port")
			assert.Zero(t, v.Counts["fail"])
			assert.GreaterOrEqual(t, v.Counts["pass"], 5)

			var ju struct {
				Suites []struct {
					Tests    int `xml:"tests,attr"`
					Failures int `xml:"failures,attr"`
				} `xml:"testsuite"`
			}
			b, err = os.ReadFile(junitPath)
			require.NoError(t, err)
			require.NoError(t, xml.Unmarshal(b, &ju))
			require.Len(t, ju.Suites, 1)
			assert.Zero(t, ju.Suites[0].Failures)
			assert.Equal(t, v.Counts["pass"]+v.Counts["skip"], ju.Suites[0].Tests)
		})
	}
}

// TestEnvCheckFailsOnANonEnvServer: a server that speaks neither standard
// fails (exit 1) with the detection case named, and --json - puts the
// verdict on stdout.
func TestEnvCheckFailsOnANonEnvServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.NotFoundHandler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	code, out, errOut := execCLI(t, nil, "env", "check", "http://"+ln.Addr().String(), "--json", "-")
	require.Equal(t, ExitError, code, errOut)
	var v struct {
		Passed bool
		Checks []struct{ Name, Status, Observed string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	assert.False(t, v.Passed)
	require.NotEmpty(t, v.Checks)
	assert.Equal(t, "protocol detected", v.Checks[0].Name)
	assert.Equal(t, "fail", v.Checks[0].Status)
	assert.Contains(t, v.Checks[0].Observed, "--protocol")
	assert.Contains(t, errOut, "env check failed")
}

func TestEnvCheckUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"env", "check", "ftp://127.0.0.1:1"},
		{"env", "check", "builtin:"},
		{"env", "check", "builtin:nope"},
		{"env", "check", "http://127.0.0.1:1", "--protocol", "grpc"},
		{"env", "check", "http://127.0.0.1:1", "--json", "-", "--junit", "-"},
		{"env", "check", "http://127.0.0.1:1", "--token-env", "ORTRAIN_TEST_UNSET_KEY"},
		{"env", "check"},
	} {
		code, _, errOut := execCLI(t, nil, args...)
		assert.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
	}
}

// TestCIExamplesParse: every `ortrain` command line of the CI examples in
// docs/examples is one the CLI accepts (env check and run --smoke).
func TestCIExamplesParse(t *testing.T) {
	want := map[string]int{"env-check.yml": 2, "smoke-run.yml": 2}
	for file, n := range want {
		b, err := os.ReadFile(filepath.Join("../../docs/examples", file))
		require.NoError(t, err)
		got := 0
		for _, line := range strings.Split(string(b), "\n") {
			_, cmdline, ok := strings.Cut(line, "run: ortrain ")
			if !ok {
				continue
			}
			got++
			deps := SystemDeps()
			streams, _, _ := TestIO()
			deps.IO = streams
			deps.Getenv = func(string) string { return "" }
			fields := strings.Fields(cmdline)
			ran := false
			var cmd *cobra.Command
			switch {
			case len(fields) > 1 && fields[0] == "env" && fields[1] == "check":
				cmd = newEnvCheckCmd(deps, func(context.Context, *EnvCheckOptions) error { ran = true; return nil })
				fields = fields[2:]
			case fields[0] == "run":
				cmd = newRunCmd(deps, func(_ context.Context, o *RunOptions) error { ran = o.Smoke; return nil })
				fields = fields[1:]
			default:
				t.Fatalf("%s: no parser for %q", file, line)
			}
			cmd.SetArgs(fields)
			cmd.SetOut(streams.Out)
			cmd.SetErr(streams.ErrOut)
			require.NoError(t, cmd.Execute(), "%s: %s", file, line)
			assert.True(t, ran, "%s: %s", file, line)
		}
		assert.Equal(t, n, got, "%s: its ortrain commands", file)
	}
}
