package smoke

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
	"github.com/ortrain/ortrain/internal/train"
	"github.com/ortrain/ortrain/internal/verdict"
	"github.com/ortrain/ortrain/internal/worker"
)

// envSuite is a suite over one env entry with a short env deadline.
func envSuite(target string) *suite {
	cfg := config.Default()
	cfg.Envs = []config.EnvConfig{{Target: target, Split: "train", Weight: 1, NumTasks: 4}} // OpenEnv envs have no task list
	return &suite{ctx: context.Background(), cfg: &cfg, v: &verdict.Verdict{},
		o: Options{RunOptions: train.RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }}, EnvTimeout: time.Second}}
}

// TestEnvCheckPassesEveryBuiltin: every built-in env, over its own
// protocol, passes the session-and-tools check.
func TestEnvCheckPassesEveryBuiltin(t *testing.T) {
	for _, info := range envs.List() {
		t.Run(info.Key, func(t *testing.T) {
			s := envSuite("builtin:" + info.Key)
			s.env(0)
			require.Len(t, s.v.Checks, 1)
			c := s.v.Checks[0]
			assert.Equal(t, verdict.Pass, c.Status, c.Observed)
		})
	}
}

type brokenInstance struct{}

func (brokenInstance) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{ors.TextBlock("do it")}, nil
}

// serveBroken serves one ORS env with tools on loopback; hangDelete makes
// /delete never answer (a session that never closes).
func serveBroken(t *testing.T, hangDelete bool, tools ...orsserver.Tool) string {
	t.Helper()
	env := &orsserver.Env{
		Name:   "broken",
		Splits: []ors.Split{{Name: "train", Type: "train"}},
		ListTasks: func(context.Context, string) ([]json.RawMessage, error) {
			return []json.RawMessage{json.RawMessage(`{"id":"0"}`)}, nil
		},
		Tools: tools,
		New: func(context.Context, json.RawMessage, map[string]string) (orsserver.Instance, error) {
			return brokenInstance{}, nil
		},
	}
	srv, err := orsserver.New(orsserver.Options{}, env)
	require.NoError(t, err)
	release := make(chan struct{})
	h := http.Handler(srv)
	if hangDelete {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/delete" {
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			srv.ServeHTTP(w, r)
		})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	t.Cleanup(func() {
		close(release)
		_ = hs.Close()
		_ = srv.Shutdown(context.Background())
	})
	return "http://" + ln.Addr().String()
}

func finish(reward *float64) orsserver.Tool {
	return orsserver.NewToolNoInput("finish", "End the episode.", func(context.Context, brokenInstance) (ors.ToolOutput, error) {
		return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock("done")}, Reward: reward, Finished: true}, nil
	})
}

// TestEnvCheckNamesABrokenEnv: a tool that raises, an episode that ends
// without a reward, and a session that never closes each fail the check
// with what went wrong.
func TestEnvCheckNamesABrokenEnv(t *testing.T) {
	one := 1.0
	crash := orsserver.NewToolNoInput("crash", "Fails.", func(context.Context, brokenInstance) (ors.ToolOutput, error) {
		return ors.ToolOutput{}, errors.New("boom: the sandbox is gone")
	})
	for _, tc := range []struct {
		name       string
		hangDelete bool
		tools      []orsserver.Tool
		want       string
	}{
		{"a tool that errors", false, []orsserver.Tool{crash, finish(&one)}, "crash({}) raised"},
		{"a reward never sent", false, []orsserver.Tool{finish(nil)}, "without a reward"},
		{"a session that never closes", true, []orsserver.Tool{finish(&one)}, "did not close"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := serveBroken(t, tc.hangDelete, tc.tools...)
			s := envSuite(url)
			s.cfg.Envs[0].Protocol = "ors"
			s.env(0)
			require.Len(t, s.v.Checks, 1)
			c := s.v.Checks[0]
			assert.Equal(t, verdict.Fail, c.Status)
			assert.Contains(t, c.Observed, tc.want)
		})
	}

	// The healthy version of the same env passes.
	s := envSuite(serveBroken(t, false, finish(&one)))
	s.cfg.Envs[0].Protocol = "ors"
	s.env(0)
	assert.Equal(t, verdict.Pass, s.v.Checks[0].Status, s.v.Checks[0].Observed)
}

// TestSmokeRunFailsOnABrokenEnv: the whole smoke run fails when its env's
// tool raises, naming the env and the tool in the verdict.
func TestSmokeRunFailsOnABrokenEnv(t *testing.T) {
	if _, _, err := worker.FindLibrary("", os.Getenv); err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("worker library missing: %v", err)
		}
		t.Skipf("worker library not built: %v", err)
	}
	src := filepath.Join(t.TempDir(), "tiny")
	preset, _ := model.PresetByName("tiny")
	require.NoError(t, model.Init(src, preset, 1))
	crash := orsserver.NewToolNoInput("crash", "Fails.", func(context.Context, brokenInstance) (ors.ToolOutput, error) {
		return ors.ToolOutput{}, errors.New("boom: the sandbox is gone")
	})
	url := serveBroken(t, false, crash)
	cfg := config.Default()
	cfg.Model, cfg.OutputDir = src, filepath.Join(t.TempDir(), "never")
	cfg.Envs = []config.EnvConfig{{Target: url, Protocol: "ors", Split: "train", Weight: 1}}
	v, err := Run(context.Background(), &cfg, Options{RunOptions: train.RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }},
		Dir: t.TempDir(), EnvTimeout: 5 * time.Second})
	require.NoError(t, err)
	assert.False(t, v.Passed())
	var env verdict.Check
	for _, c := range v.Checks {
		if c.Name == "envs[0] "+url+": session and tools" {
			env = c
		}
	}
	assert.Equal(t, verdict.Fail, env.Status)
	assert.Contains(t, env.Observed, "crash({}) raised")
	assert.Contains(t, env.Observed, "sandbox is gone")
}
