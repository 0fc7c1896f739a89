package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/require"
)

// testLib opens the built worker library. Without one, or in a build
// without cgo (ErrNoCGO), the test is skipped, unless ORTRAIN_REQUIRE_WORKER
// is set (CI), where that is a failure.
func testLib(t testing.TB) *Library {
	t.Helper()
	path, searched, err := FindLibrary("", os.Getenv)
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_WORKER is set but the worker library is missing: %v (searched %v)", err, searched)
		}
		t.Skipf("worker library not built (run scripts/build-worker.sh): %v", err)
	}
	lib, err := Open(path)
	if errors.Is(err, ErrNoCGO) && os.Getenv("ORTRAIN_REQUIRE_WORKER") == "" {
		t.Skipf("worker library unusable: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { lib.Close() }) // runs after the cleanups of models loaded from it
	return lib
}

// Test fixtures shared by the tests of one run: the tiny model directories
// are written once under fixtureRoot, removed by TestMain.
var (
	fixtureRoot string
	tinyDirs    sync.Map // seed -> dir
)

func TestMain(m *testing.M) {
	root, err := os.MkdirTemp("", "ortrain-worker-test-")
	if err != nil {
		panic(err)
	}
	fixtureRoot = root
	code := m.Run()
	os.RemoveAll(root)
	os.Exit(code)
}

// tinyDir writes the tiny Qwen3-style preset (2 layers, 64 hidden, byte
// vocabulary) with random weights from seed.
func tinyDir(t testing.TB, seed int64) string {
	t.Helper()
	if d, ok := tinyDirs.Load(seed); ok {
		return d.(string)
	}
	p, ok := model.PresetByName("tiny")
	require.True(t, ok)
	dir := filepath.Join(fixtureRoot, fmt.Sprintf("tiny-%d", seed))
	require.NoError(t, model.Init(dir, p, seed))
	tinyDirs.Store(seed, dir)
	return dir
}

func loadTiny(t testing.TB, o ModelOptions) *Model {
	t.Helper()
	lib := testLib(t)
	if o.Dir == "" {
		o.Dir = tinyDir(t, 1)
	}
	if o.Threads == 0 {
		o.Threads = 2
	}
	m, err := lib.LoadModel(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

// randomRows makes rows of random tokens: prompt lengths and completion
// lengths vary, loss masks have a zero in the middle of some rows.
func randomRows(rng *rand.Rand, n, vocab int) []grpo.Row {
	rows := make([]grpo.Row, n)
	for i := range rows {
		P, T := 1+rng.IntN(4), 1+rng.IntN(5)
		toks := make([]int32, P+T)
		for j := range toks {
			toks[j] = int32(rng.IntN(vocab))
		}
		mask := make([]uint8, T)
		for j := range mask {
			mask[j] = 1
		}
		if T > 2 && i%2 == 1 {
			mask[1] = 0 // a tool token
		}
		rows[i] = grpo.Row{Tokens: toks, PromptLen: P, LossMask: mask, Advantage: float32(rng.NormFloat64())}
	}
	return rows
}
