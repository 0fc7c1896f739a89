package train

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckpointsAreAtomicAndLatestIsComplete(t *testing.T) {
	dir := t.TempDir()
	_, _, err := LatestCheckpoint(dir)
	require.ErrorIs(t, err, ErrNoCheckpoint)

	for _, step := range []int{5, 10} {
		p, err := writeCheckpoint(dir, step, map[string]int{"step": step}, func(tmp string) error {
			return os.WriteFile(filepath.Join(tmp, "weights.bin"), []byte{byte(step)}, 0o644)
		})
		require.NoError(t, err)
		assert.FileExists(t, filepath.Join(p, "DONE"))
	}
	// A failed save leaves nothing behind and does not become "latest".
	_, err = writeCheckpoint(dir, 20, nil, func(tmp string) error { return errors.New("disk full") })
	require.ErrorContains(t, err, "disk full")
	// A directory without the marker (a crash mid-publish) is ignored.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "checkpoints", "step-000030"), 0o755))

	p, step, err := LatestCheckpoint(dir)
	require.NoError(t, err)
	assert.Equal(t, 10, step)
	var st map[string]int
	require.NoError(t, ReadJSON(filepath.Join(p, "trainer_state.json"), &st))
	assert.Equal(t, 10, st["step"])
	entries, _ := os.ReadDir(filepath.Join(dir, "checkpoints"))
	for _, e := range entries {
		assert.NotContains(t, e.Name(), ".tmp-", "temp dirs are cleaned up")
	}
}

func TestJSONLWriterConcurrentLines(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.jsonl")
	w, err := openJSONL(p)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); assert.NoError(t, w.Write(map[string]int{"i": i})) }()
	}
	wg.Wait()
	require.NoError(t, w.Close())
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]int
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		n++
	}
	assert.Equal(t, 50, n)
}

func TestCheckFreshRunDir(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, checkFreshRunDir(dir, RunOptions{}), "an empty dir is fresh")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte("{}\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "checkpoints", "step-000001"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644))

	err := checkFreshRunDir(dir, RunOptions{})
	require.ErrorIs(t, err, ErrRunDirInUse)
	assert.Contains(t, err.Error(), "checkpoints")
	require.NoError(t, checkFreshRunDir(dir, RunOptions{Resume: true}))

	require.NoError(t, checkFreshRunDir(dir, RunOptions{Overwrite: true}))
	assert.FileExists(t, filepath.Join(dir, "metrics.jsonl"), "--overwrite deletes nothing before the run is about to write")
	// Issue 23: what was derived from the earlier run goes too.
	for _, d := range []string{"eval/000001-x", "tb", "ranks"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "report.html"), []byte("<html>"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ranks", "rank-1.log"), []byte("old"), 0o644))
	require.NoError(t, clearEarlierRun(dir, true))
	assert.DirExists(t, filepath.Join(dir, "ranks"), "a rank of a distributed run leaves the launcher's logs")
	require.NoError(t, clearEarlierRun(dir, false))
	for _, f := range []string{"metrics.jsonl", "checkpoints", "eval", "tb", "report.html", "ranks"} {
		assert.NoFileExists(t, filepath.Join(dir, f))
		assert.NoDirExists(t, filepath.Join(dir, f))
	}
	assert.FileExists(t, filepath.Join(dir, "notes.txt"), "files a run does not write are kept")
}

// On resume the logs are cut back to the checkpoint's step: steps logged
// after it by a killed run, and a torn last line, are dropped. Issue 14, bug 2.
func TestTruncateJSONL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	lines := `{"step":1,"loss":0.5}
{"step":2,"loss":0.4}
{"step":3,"loss":0.3}
{"step":2,"reward":1}
{"step":4,"lo`
	require.NoError(t, os.WriteFile(path, []byte(lines), 0o644))
	require.NoError(t, truncateJSONL(path, 2))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "{\"step\":1,\"loss\":0.5}\n{\"step\":2,\"loss\":0.4}\n{\"step\":2,\"reward\":1}\n", string(b))
	require.NoError(t, truncateJSONL(filepath.Join(t.TempDir(), "missing.jsonl"), 3), "a missing log stays missing")
}
