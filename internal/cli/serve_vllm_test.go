package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/model"
)

func TestServeVLLMFlags(t *testing.T) {
	tests := []struct {
		args  []string
		check func(t *testing.T, o *ServeVLLMOptions)
	}{
		{[]string{"--model", "m", "--gpus", "2,3"}, func(t *testing.T, o *ServeVLLMOptions) {
			assert.Equal(t, "2,3", o.GPUs)
			assert.Equal(t, 1, o.TensorParallel)
			assert.Equal(t, 8000, o.Port)
			assert.Equal(t, "vllm serve", o.Command)
			assert.Empty(t, o.ExtraArgs)
		}},
		{[]string{"--model", "m", "--gpus", "2,3", "--tensor-parallel-size", "2", "--replicas", "1", "--port", "9000", "--", "--enforce-eager", "--max-num-seqs", "64"},
			func(t *testing.T, o *ServeVLLMOptions) {
				assert.Equal(t, 2, o.TensorParallel)
				assert.Equal(t, 1, o.Replicas)
				assert.Equal(t, 9000, o.Port)
				assert.Equal(t, []string{"--enforce-eager", "--max-num-seqs", "64"}, o.ExtraArgs)
			}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			deps := SystemDeps()
			deps.IO, _, _ = TestIO()
			var got *ServeVLLMOptions
			cmd := newServeVLLMCmd(deps, func(_ context.Context, o *ServeVLLMOptions) error { got = o; return nil })
			cmd.SetArgs(tt.args)
			require.NoError(t, cmd.Execute())
			require.NotNil(t, got)
			tt.check(t, got)
		})
	}
}

func TestServeVLLMUsageErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	p, _ := model.PresetByName("tiny")
	require.NoError(t, model.InitOverwrite(dir, p, 1))
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"serve-vllm"}, "--model is required"},
		{[]string{"serve-vllm", "--model", dir, "--gpus", "2,2"}, "GPU 2 is listed twice"},
		{[]string{"serve-vllm", "--model", dir, "--gpus", "1,2,3", "--tensor-parallel-size", "2"}, "do not split into 1 replica(s) × tensor parallel size 2"},
		{[]string{"serve-vllm", "--model", dir, "--gpus", "a"}, "--gpus"},
		{[]string{"serve-vllm", "--model", dir, "stray"}, "extra vllm serve args go after --"},
		{[]string{"serve-vllm", "--model", dir, "--enable-lora", "--max-lora-rank", "12"}, "vLLM accepts 1, 8, 16"},
		{[]string{"serve-vllm", "--model", filepath.Join(dir, "missing")}, "--model"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, _, errOut := execCLI(t, nil, tt.args...)
			assert.Equal(t, ExitUsage, code, errOut)
			assert.Contains(t, errOut, tt.msg)
		})
	}
}

// TestServeVLLMSupervisesUntilInterrupted runs the command over two toy
// replicas (the serve-engine HTTP layer over a pure-Go sampler): it prints
// each replica's URL when ready, and on interrupt stops them all.
func TestServeVLLMSupervisesUntilInterrupted(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "toyserver")
	out, err := exec.Command("go", "build", "-o", bin, "../vllm/testdata/toyserver").CombinedOutput()
	require.NoError(t, err, string(out))
	dir := filepath.Join(t.TempDir(), "tiny")
	p, _ := model.PresetByName("tiny")
	require.NoError(t, model.InitOverwrite(dir, p, 1))

	// Without --log-dir the replica logs go to a fresh directory under the
	// temp dir, never the working directory.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cwd := t.TempDir()
	t.Chdir(cwd)

	deps := SystemDeps()
	stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
	deps.IO = &IOStreams{In: &bytes.Buffer{}, Out: stdout, ErrOut: stderr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	codeCh := make(chan int, 1)
	go func() {
		codeCh <- Execute(ctx, deps, []string{"serve-vllm", "--model", dir, "--replicas", "2", "--port", "0", "--command", bin,
			"--stop-grace", "5s", "--log-format", "json"})
	}()
	ready := regexp.MustCompile(`(?m)^replica (\d) ready (http://127\.0\.0\.1:\d+) gpus= restarts=0$`)
	require.Eventually(t, func() bool { return len(ready.FindAllString(stdout.String(), -1)) == 2 }, time.Minute, 20*time.Millisecond, stdout.String()+stderr.String())
	var urls []string
	for _, m := range ready.FindAllStringSubmatch(stdout.String(), -1) {
		urls = append(urls, m[2])
		resp, err := http.Get(m[2] + "/v1/models")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode)
	}
	cancel()
	select {
	case code := <-codeCh:
		assert.Equal(t, ExitOK, code, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("serve-vllm did not stop on interrupt")
	}
	assert.Regexp(t, `(?m)^replica 0 stopped `, stdout.String())
	assert.Regexp(t, `(?m)^replica 1 stopped `, stdout.String())
	for _, u := range urls {
		_, err := http.Get(u + "/health")
		assert.Error(t, err, "%s still answers after stop", u)
	}
	logs, err := filepath.Glob(filepath.Join(tmp, "ortrain-vllm-*", "replica-*.log"))
	require.NoError(t, err)
	assert.Len(t, logs, 2, "replica logs under $TMPDIR/ortrain-vllm-*")
	assert.Contains(t, stderr.String(), "replica logs in "+filepath.Dir(logs[0]))
	entries, err := os.ReadDir(cwd)
	require.NoError(t, err)
	assert.Empty(t, entries, "serve-vllm wrote into the working directory")
}

// TestServeVLLMGuardsBeyondLoopback: with --host 0.0.0.0 the printed URL
// is the guard's, named by this machine's hostname; it refuses every route
// without VLLM_API_KEY and serves with it.
func TestServeVLLMGuardsBeyondLoopback(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "toyserver")
	out, err := exec.Command("go", "build", "-o", bin, "../vllm/testdata/toyserver").CombinedOutput()
	require.NoError(t, err, string(out))
	dir := filepath.Join(t.TempDir(), "tiny")
	p, _ := model.PresetByName("tiny")
	require.NoError(t, model.InitOverwrite(dir, p, 1))
	const key = "sk-serve-vllm-guard"
	t.Setenv("VLLM_API_KEY", key)
	host, err := os.Hostname()
	require.NoError(t, err)

	deps := SystemDeps()
	stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
	deps.IO = &IOStreams{In: &bytes.Buffer{}, Out: stdout, ErrOut: stderr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	codeCh := make(chan int, 1)
	go func() {
		codeCh <- Execute(ctx, deps, []string{"serve-vllm", "--model", dir, "--host", "0.0.0.0", "--port", "0", "--command", bin,
			"--log-dir", t.TempDir(), "--stop-grace", "5s", "--log-format", "json"})
	}()
	ready := regexp.MustCompile(`(?m)^replica 0 ready http://` + regexp.QuoteMeta(host) + `:(\d+) gpus= restarts=0$`)
	require.Eventually(t, func() bool { return ready.MatchString(stdout.String()) }, time.Minute, 20*time.Millisecond, stdout.String()+stderr.String())
	port := ready.FindStringSubmatch(stdout.String())[1]
	assert.Contains(t, stderr.String(), "through ortrain's proxy, which requires VLLM_API_KEY")
	assert.NotContains(t, stdout.String()+stderr.String(), key)

	guard := "http://127.0.0.1:" + port // the guard listens on every address
	for _, tc := range []struct {
		path, key string
		want      int
	}{
		{"/is_paused", "", http.StatusUnauthorized},
		{"/health", "", http.StatusUnauthorized},
		{"/is_paused", "wrong", http.StatusUnauthorized},
		{"/is_paused", key, http.StatusOK},
		{"/v1/models", key, http.StatusOK},
	} {
		req, err := http.NewRequest("GET", guard+tc.path, nil)
		require.NoError(t, err)
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, tc.want, resp.StatusCode, "GET %s key=%q", tc.path, tc.key)
	}
	cancel()
	select {
	case code := <-codeCh:
		assert.Equal(t, ExitOK, code, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("serve-vllm did not stop on interrupt")
	}
	_, err = http.Get(guard + "/health")
	assert.Error(t, err, "the guard still answers after stop")
}

func TestServeVLLMWithoutVLLMSaysWhatToDo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	p, _ := model.PresetByName("tiny")
	require.NoError(t, model.InitOverwrite(dir, p, 1))
	t.Setenv("PATH", t.TempDir()) // no vllm on it
	tests := []struct {
		args []string
		msgs []string
	}{
		{[]string{"serve-vllm", "--model", dir}, []string{"vllm is not installed", "pip install vllm", `--command "ortrain serve-engine"`}},
		{[]string{"serve-vllm", "--model", dir, "--command", "no-such-server --flag"}, []string{`--command program "no-such-server" cannot be run`}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, _, errOut := execCLI(t, nil, tt.args...)
			assert.Equal(t, ExitUsage, code, errOut, "as in run: installing vLLM or naming another server is the user's fix")
			for _, m := range tt.msgs {
				assert.Contains(t, errOut, m)
			}
		})
	}
}
