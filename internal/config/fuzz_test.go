package config

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzResolveYAML feeds arbitrary documents to the loader: it never panics,
// a refusal is a typed error or a YAML syntax error, and a config it accepts
// renders to YAML that loads back to the same rendering (what --resume
// relies on when it compares against the saved config.yaml).
func FuzzResolveYAML(f *testing.F) {
	quickstart, err := os.ReadFile("../../configs/quickstart.yaml")
	require.NoError(f, err)
	seeds := []string{
		string(quickstart),
		"grpo:\n  max_steps: 1.5\n",
		"rollout: {call_timeout: 5x, retry_backoff: 2s}\n",
		"envs:\n  - target: a\n    indices: [1, 2.5]\n    chat: {render_tools: true, template_kwargs: {A: 1}}\n",
		"envs:\n  - {target: b, secrets: {K: v}, name: b/train}\nmodle: x\n",
		"grpo: {lora: {enabled: true, modules_to_save: lm_head,norm}}\nseed: 9007199254740993\n",
		"- a\n- b\n",
		"worker: {gpus: 0,1, step_timeout: 0}\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Resolve(Source{Data: data})
		if err != nil {
			var uk *UnknownKeysError
			var te *TypeError
			if !errors.As(err, &uk) && !errors.As(err, &te) {
				assert.Contains(t, err.Error(), "not valid YAML")
			}
			return
		}
		first, err := cfg.YAML()
		require.NoError(t, err)
		back, err := Resolve(Source{Data: first})
		require.NoError(t, err, "rendered config:\n%s", first)
		second, err := back.YAML()
		require.NoError(t, err)
		assert.Equal(t, string(first), string(second))
	})
}

// FuzzParseByteSize: any input either parses to a non-negative size or
// fails with an error; a plain count of bytes parses to itself.
func FuzzParseByteSize(f *testing.F) {
	for _, s := range []string{"2GiB", "512MiB", "1.5GB", "0", "1073741824", "-1", "GiB", "1e400", "NaN", " 3 k "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseByteSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseByteSize(%q) = %d, negative", s, n)
		}
		if v, perr := strconv.ParseInt(strings.TrimSpace(s), 10, 64); perr == nil && v >= 0 && v < 1<<53 && n != v {
			t.Fatalf("ParseByteSize(%q) = %d, want %d", s, n, v)
		}
	})
}
