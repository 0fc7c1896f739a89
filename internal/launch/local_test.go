package launch

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The test binary doubles as a rank: with LAUNCH_TEST_RANK_MODE set it
// behaves as the mode says instead of running tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("LAUNCH_TEST_RANK_MODE"); mode != "" {
		os.Exit(rankMain(mode))
	}
	os.Exit(m.Run())
}

func rankMain(mode string) int {
	w, err := FromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return 1
	}
	fmt.Printf("rank %d of %d local %d/%d master %s:%d\n", w.Rank, w.WorldSize, w.LocalRank, w.LocalWorldSize, w.MasterAddr, w.MasterPort)
	if err := os.WriteFile(filepath.Join(os.Getenv("LAUNCH_TEST_DIR"), fmt.Sprintf("pid-%d", w.Rank)), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return 1
	}
	ints := make(chan os.Signal, 1)
	signal.Notify(ints, syscall.SIGINT)
	switch {
	case mode == "ok":
		return 0
	case mode == "fail-rank-1" && w.Rank == 1:
		time.Sleep(100 * time.Millisecond)
		fmt.Fprintln(os.Stderr, "RuntimeError: rank 1 lost its mind")
		return 3
	case mode == "fail-rank-1", mode == "wait-interrupt":
		select {
		case <-ints:
			if w.Rank == 0 {
				fmt.Println("saved checkpoint")
			}
			return 2
		case <-time.After(time.Minute):
			return 0
		}
	case mode == "ignore-interrupt":
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
		time.Sleep(time.Minute)
		return 0
	}
	return 1
}

func runRanks(t *testing.T, ctx context.Context, mode string, n int, o LocalOptions) (*strings.Builder, string, error) {
	dir := t.TempDir()
	var echo strings.Builder
	o.NProc, o.Argv, o.LogDir, o.Echo = n, []string{os.Args[0], "-test.run=^$"}, dir, &echo
	o.Env = append(os.Environ(), "LAUNCH_TEST_RANK_MODE="+mode, "LAUNCH_TEST_DIR="+dir, "RANK=7", "WORLD_SIZE=99")
	err := RunLocal(ctx, o)
	return &echo, dir, err
}

func assertNoRankLeft(t *testing.T, dir string, n int) {
	for i := range n {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("pid-%d", i)))
		require.NoError(t, err, "rank %d started", i)
		pid, _ := strconv.Atoi(string(b))
		assert.Error(t, syscall.Kill(pid, 0), "rank %d (pid %d) is gone", i, pid)
	}
}

func TestRunLocalSetsEveryRanksVariables(t *testing.T) {
	echo, dir, err := runRanks(t, context.Background(), "ok", 3, LocalOptions{MasterPort: 29999})
	require.NoError(t, err)
	assert.Contains(t, echo.String(), "rank 0 of 3 local 0/3 master 127.0.0.1:29999", "rank 0's output is echoed; inherited RANK/WORLD_SIZE are replaced")
	assert.NotContains(t, echo.String(), "rank 1")
	for i := range 3 {
		log, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.log", i)))
		require.NoError(t, err)
		assert.Contains(t, string(log), fmt.Sprintf("rank %d of 3 local %d/3 master 127.0.0.1:29999", i, i))
	}
	assertNoRankLeft(t, dir, 3)
}

func TestRunLocalOneRankFailingStopsAll(t *testing.T) {
	start := time.Now()
	_, dir, err := runRanks(t, context.Background(), "fail-rank-1", 3, LocalOptions{FailGrace: 2 * time.Second})
	var re *RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Rank)
	assert.Equal(t, 3, re.Code)
	assert.Contains(t, err.Error(), "RuntimeError: rank 1 lost its mind", "the failing rank's error lines come back")
	assert.Less(t, time.Since(start), 20*time.Second, "the others did not wait for their minute")
	assertNoRankLeft(t, dir, 3)
}

func TestRunLocalInterruptReachesEveryRank(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(time.Second); cancel() }()
	echo, dir, err := runRanks(t, ctx, "wait-interrupt", 2, LocalOptions{InterruptGrace: 10 * time.Second})
	require.ErrorIs(t, err, ErrInterrupted)
	assert.Contains(t, echo.String(), "saved checkpoint")
	assertNoRankLeft(t, dir, 2)
}

func TestRunLocalKillsRanksThatIgnoreInterrupts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(time.Second); cancel() }()
	start := time.Now()
	_, dir, err := runRanks(t, ctx, "ignore-interrupt", 2, LocalOptions{InterruptGrace: 500 * time.Millisecond})
	require.ErrorIs(t, err, ErrInterrupted)
	assert.Less(t, time.Since(start), 15*time.Second)
	assertNoRankLeft(t, dir, 2)
}

// Issue 23: run --overwrite starts the rank logs afresh: an earlier launch's
// lines and the logs of ranks this launch does not have are gone.
func TestRunLocalFreshLogs(t *testing.T) {
	dir := t.TempDir()
	for i := range 3 {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("rank-%d.log", i)), []byte("earlier launch\n"), 0o644))
	}
	var echo strings.Builder
	o := LocalOptions{NProc: 2, Argv: []string{os.Args[0], "-test.run=^$"}, LogDir: dir, Echo: &echo, FreshLogs: true, MasterPort: 29998}
	o.Env = append(os.Environ(), "LAUNCH_TEST_RANK_MODE=ok", "LAUNCH_TEST_DIR="+dir)
	require.NoError(t, RunLocal(context.Background(), o))
	for i := range 2 {
		log, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.log", i)))
		require.NoError(t, err)
		assert.NotContains(t, string(log), "earlier launch")
		assert.Contains(t, string(log), fmt.Sprintf("rank %d of 2", i))
	}
	assert.NoFileExists(t, filepath.Join(dir, "rank-2.log"))
}
