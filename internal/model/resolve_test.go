package model

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envMap is a getenv over a fixed map.
func envMap(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// fakeHubRepo lays out models--Org--Name the way huggingface_hub does and
// returns the snapshot directory.
func fakeHubRepo(t *testing.T, cache, repo, sha string, writeRef bool) string {
	t.Helper()
	org, name := filepath.Split(repo)
	repoDir := filepath.Join(cache, "models--"+filepath.Clean(org)+"--"+name)
	snap := filepath.Join(repoDir, "snapshots", sha)
	require.NoError(t, os.MkdirAll(snap, 0o755))
	// Snapshot files are symlinks into blobs/ in a real cache.
	blobs := filepath.Join(repoDir, "blobs")
	require.NoError(t, os.MkdirAll(blobs, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(blobs, "abc123"), []byte(qwen3Small), 0o644))
	require.NoError(t, os.Symlink(filepath.Join("..", "..", "blobs", "abc123"), filepath.Join(snap, ConfigFile)))
	if writeRef {
		require.NoError(t, os.MkdirAll(filepath.Join(repoDir, "refs"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(repoDir, "refs", "main"), []byte(sha), 0o644))
	}
	return snap
}

func TestResolve(t *testing.T) {
	const sha = "c1899de289a04d12100db370d81485cdf75e47ca"
	tests := []struct {
		name     string
		setup    func(t *testing.T, root string) (nameOrDir string, env map[string]string, want string)
		searched int
	}{
		{"local dir", func(t *testing.T, root string) (string, map[string]string, string) {
			dir := filepath.Join(root, "local")
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte(qwen3Small), 0o644))
			return dir, nil, dir
		}, 1},
		{"HF_HUB_CACHE", func(t *testing.T, root string) (string, map[string]string, string) {
			cache := filepath.Join(root, "hubcache")
			snap := fakeHubRepo(t, cache, "Qwen/Qwen3-0.6B", sha, true)
			return "Qwen/Qwen3-0.6B", map[string]string{"HF_HUB_CACHE": cache, "HF_HOME": filepath.Join(root, "elsewhere")}, snap
		}, 3},
		{"HF_HOME", func(t *testing.T, root string) (string, map[string]string, string) {
			snap := fakeHubRepo(t, filepath.Join(root, "hfhome", "hub"), "Qwen/Qwen3-0.6B", sha, true)
			return "Qwen/Qwen3-0.6B", map[string]string{"HF_HOME": filepath.Join(root, "hfhome"), "HOME": filepath.Join(root, "home")}, snap
		}, 3},
		{"HOME default", func(t *testing.T, root string) (string, map[string]string, string) {
			home := filepath.Join(root, "home")
			snap := fakeHubRepo(t, filepath.Join(home, ".cache", "huggingface", "hub"), "meta-llama/Llama-3.2-1B", sha, true)
			return "meta-llama/Llama-3.2-1B", map[string]string{"HOME": home}, snap
		}, 3},
		{"no refs, one snapshot", func(t *testing.T, root string) (string, map[string]string, string) {
			cache := filepath.Join(root, "hub")
			snap := fakeHubRepo(t, cache, "Org/Model", sha, false)
			return "Org/Model", map[string]string{"HF_HUB_CACHE": cache}, snap
		}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, env, want := tt.setup(t, t.TempDir())
			dir, searched, err := Resolve(name, envMap(env))
			require.NoError(t, err)
			assert.Equal(t, want, dir)
			assert.Len(t, searched, tt.searched, "searched: %v", searched)
			_, err = LoadConfig(dir)
			require.NoError(t, err, "the snapshot's symlinked config.json is readable")
		})
	}
}

func TestResolveNotFound(t *testing.T) {
	root := t.TempDir()
	cache := filepath.Join(root, "hub")
	emptyDir := filepath.Join(root, "empty")
	require.NoError(t, os.MkdirAll(emptyDir, 0o755))
	incomplete := filepath.Join(cache, "models--Org--Half")
	require.NoError(t, os.MkdirAll(filepath.Join(incomplete, "refs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(incomplete, "refs", "main"), []byte("deadbeef\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(incomplete, "snapshots", "deadbeef"), 0o755))

	tests := []struct {
		name     string
		input    string
		contains []string
	}{
		{"repo not cached", "Qwen/Qwen3-4B", []string{
			"Qwen/Qwen3-4B", filepath.Join(cache, "models--Qwen--Qwen3-4B", "refs", "main"),
			filepath.Join(cache, "models--Qwen--Qwen3-4B", "snapshots"), "hf download Qwen/Qwen3-4B", "local model directory",
		}},
		{"incomplete snapshot", "Org/Half", []string{filepath.Join(incomplete, "snapshots", "deadbeef"), "incomplete download"}},
		{"dir without config", emptyDir, []string{emptyDir, "has no config.json", "init-model"}},
		{"missing relative path", "./nope", []string{"./nope", "does not exist", "init-model --preset tiny --out ./nope"}},
		{"mistyped path under an existing dir", filepath.Join(root, "empty", "nope"), []string{"does not exist", "init-model"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, searched, err := Resolve(tt.input, envMap(map[string]string{"HF_HUB_CACHE": cache}))
			require.Error(t, err)
			assert.Empty(t, dir)
			var nf *NotFoundError
			require.True(t, errors.As(err, &nf))
			assert.Equal(t, searched, nf.Searched)
			for _, s := range searched {
				assert.Contains(t, err.Error(), s, "the error lists every searched path")
			}
			for _, s := range tt.contains {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
	// models/nope is of the Org/Name form, but with a models/ directory here
	// it is a mistyped path: no download hint.
	t.Run("Org/Name form whose first part is a local directory", func(t *testing.T) {
		t.Chdir(root)
		require.NoError(t, os.MkdirAll(filepath.Join(root, "models", "tiny"), 0o755))
		_, _, err := Resolve("models/nope", envMap(map[string]string{"HF_HUB_CACHE": cache}))
		var nf *NotFoundError
		require.ErrorAs(t, err, &nf)
		assert.True(t, nf.Path)
		assert.NotContains(t, err.Error(), "hf download")
		assert.Contains(t, err.Error(), "models/: it holds tiny/")
		assert.Contains(t, err.Error(), "init-model --preset tiny --out models/nope")
	})
	t.Run("existing directory without config.json names what it holds", func(t *testing.T) {
		require.NoError(t, os.WriteFile(filepath.Join(emptyDir, "weights.bin"), nil, 0o644))
		_, _, err := Resolve(emptyDir, envMap(map[string]string{"HF_HUB_CACHE": cache}))
		var nf *NotFoundError
		require.ErrorAs(t, err, &nf)
		assert.True(t, nf.Path)
		assert.Contains(t, err.Error(), "has no config.json; it holds weights.bin")
	})
	_, _, err := Resolve("", envMap(nil))
	require.Error(t, err)
}

func TestHubCacheDir(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"HF_HUB_CACHE": "/a", "HF_HOME": "/b", "HOME": "/h"}, "/a"},
		{map[string]string{"HUGGINGFACE_HUB_CACHE": "/legacy", "HF_HOME": "/b"}, "/legacy"},
		{map[string]string{"HF_HOME": "/b", "HOME": "/h"}, "/b/hub"},
		{map[string]string{"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/huggingface/hub"},
		{map[string]string{"HOME": "/h"}, "/h/.cache/huggingface/hub"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, HubCacheDir(envMap(tt.env)))
	}
}
