//go:build cgo

package worker

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCandidates(t *testing.T) {
	lib := func(dir string) string { return filepath.Join(dir, "build", "worker", LibraryName) }
	for _, tc := range []struct {
		name       string
		exeDir, wd string
		want       []string
	}{
		{"shared_parents", "/a/b/bin", "/a/b/src/x", []string{
			"/a/b/bin/" + LibraryName,
			lib("/a/b/bin"), lib("/a/b"), lib("/a"), lib("/"),
			lib("/a/b/src/x"), lib("/a/b/src"),
		}},
		{"same_dir", "/a/b", "/a/b", []string{"/a/b/" + LibraryName, lib("/a/b"), lib("/a"), lib("/")}},
		{"wd_above_binary", "/a/b", "/a", []string{"/a/b/" + LibraryName, lib("/a/b"), lib("/a"), lib("/")}},
		{"unclean_wd", "/a/b", "/a/./c/", []string{"/a/b/" + LibraryName, lib("/a/b"), lib("/a"), lib("/"), lib("/a/c")}},
		{"no_binary", "", "/a/b", []string{lib("/a/b"), lib("/a"), lib("/")}},
		{"no_wd", "/a", "", []string{"/a/" + LibraryName, lib("/a"), lib("/")}},
		{"neither", "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, candidates(tc.exeDir, tc.wd))
		})
	}
}

// TestNotFoundSearchedOnce: the test binary's directory and a temporary
// working directory share their parents, which the search lists once.
func TestNotFoundSearchedOnce(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	_, searched, err := FindLibrary("", func(string) string { return "" })
	seen := map[string]bool{}
	for _, p := range searched {
		assert.False(t, seen[p], "%s searched twice", p)
		seen[p] = true
	}
	if err == nil {
		t.Skipf("a worker library sits on the search path (%s)", searched[len(searched)-1])
	}
	var nf *NotFoundError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, searched, nf.Searched)
	assert.Contains(t, searched, filepath.Join(wd, "build", "worker", LibraryName))
	exe, err := os.Executable()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(filepath.Dir(exe), LibraryName), searched[0])
}
