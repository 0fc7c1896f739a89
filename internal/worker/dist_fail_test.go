package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// How a data-parallel call fails: a dead peer, a stalled one, a rendezvous
// nobody else comes to. The tests assert on the error's type, never on
// which of two clocks fired, and bound times loosely: go test -race may
// share its cores with other busy processes.

// failSlack is how much later than its deadline a failing call may return
// on a busy machine (a c10d connect attempt alone can take 3.5 s).
const failSlack = 10 * time.Second

// joinWithParkedPeer starts the other rank of two parked and joins as rank
// with timeout; after one all-reduce together both are known connected.
func joinWithParkedPeer(t *testing.T, rank int, timeout time.Duration) (*Model, *Group, *rankProcess) {
	t.Helper()
	opts := distModel{Dir: tinyDir(t, 1)}
	port := freePort(t)
	peer := startRank(t, distJob{Role: "park", Opts: opts, Port: port, Rank: 1 - rank, World: 2, TimeoutMS: timeout.Milliseconds()})
	peer.joining(t)
	m := loadTiny(t, opts.options())
	g, err := m.JoinGroup(context.Background(), DistOptions{Addr: "127.0.0.1", Port: port, Rank: rank, WorldSize: 2, Timeout: timeout})
	require.NoError(t, err)
	t.Cleanup(func() { g.Close() })
	sum, err := g.AllReduceSum(context.Background(), []float64{1})
	require.NoError(t, err)
	require.Equal(t, []float64{2}, sum)
	return m, g, peer
}

// leave kills the parked peer and closes g: with the peer gone the
// backend's pending operation ends at once, where with it alive Close
// would wait out the backend's timeout.
func leave(t *testing.T, g *Group, peer *rankProcess) {
	t.Helper()
	require.NoError(t, peer.cmd.Process.Kill())
	start := time.Now()
	require.NoError(t, g.Close())
	assert.Less(t, time.Since(start), failSlack, "leaving a broken group")
}

// TestAllReduceFailsWhenPeerDies kills the other rank with SIGKILL while
// this one waits in the gradient all-reduce: the call must fail with the
// backend's error long before the collective timeout (so not as a
// timeout), the group must refuse further collectives, and leaving it
// must not hang. The dead rank is a worker, or the master that served the
// rendezvous.
func TestAllReduceFailsWhenPeerDies(t *testing.T) {
	requireGloo(t)
	for _, tc := range []struct {
		name string
		rank int // this process's rank; the peer has the other
	}{
		{"worker_dies", 0},
		{"master_dies", 1},
	} {
		t.Run(tc.name, func(t *testing.T) { testPeerDies(t, tc.rank) })
	}
}

func testPeerDies(t *testing.T, rank int) {
	const timeout, killAfter = 30 * time.Second, 300 * time.Millisecond
	m, g, peer := joinWithParkedPeer(t, rank, timeout)
	ctx := context.Background()
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	_, err := m.ForwardBackward(ctx, nllBatch(), cfg)
	require.NoError(t, err)
	start := time.Now() // before the kill is scheduled, so elapsed >= killAfter
	kill := time.AfterFunc(killAfter, func() { _ = peer.cmd.Process.Kill() })
	defer kill.Stop()
	_, err = g.ReduceGrads(ctx)
	elapsed := time.Since(start)
	require.Error(t, err)
	t.Logf("all-reduce failed after %v: %v", elapsed, err)
	assert.NotErrorIs(t, err, ErrTimeout, "the peer's death, not the timeout, ended the call")
	assert.Less(t, elapsed, timeout)
	assert.GreaterOrEqual(t, elapsed, killAfter, "the call waited for the peer until it died")

	_, err = g.AllReduceSum(ctx, []float64{1})
	require.ErrorContains(t, err, "broken")
	assert.NotErrorIs(t, err, ErrTimeout, "a broken group fails at once")
	start = time.Now()
	require.NoError(t, g.Close())
	assert.Less(t, time.Since(start), timeout, "leaving a broken group")
	_, err = g.AllReduceSum(ctx, []float64{1})
	require.ErrorIs(t, err, ErrClosed)
}

// TestCollectiveStalledPeer: a peer that stays alive but never joins the
// next collective makes it fail with a *TimeoutError after the group's
// timeout, or with the context's error as soon as the caller's context
// ends. The context case gives the group a long timeout, so the two
// deadlines are far apart.
func TestCollectiveStalledPeer(t *testing.T) {
	requireGloo(t)
	for _, tc := range []struct {
		name     string
		timeout  time.Duration // the group's
		ctx      time.Duration // the context's deadline; 0 = none
		min, max time.Duration
		wantCtx  error // nil: a *TimeoutError
	}{
		{"group_timeout", 2 * time.Second, 0, 2 * time.Second, 2*time.Second + failSlack, nil},
		{"context_deadline", time.Minute, 300 * time.Millisecond, 300 * time.Millisecond, 300*time.Millisecond + failSlack,
			context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, g, peer := joinWithParkedPeer(t, 0, tc.timeout)
			start := time.Now() // before the context, so elapsed >= its deadline
			ctx, cancel := context.WithCancel(context.Background())
			if tc.ctx > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tc.ctx)
			}
			defer cancel()
			_, err := g.AllReduceSum(ctx, []float64{1, 2, 3})
			elapsed := time.Since(start)
			require.Error(t, err)
			t.Logf("failed after %v: %v", elapsed, err)
			if tc.wantCtx != nil {
				assert.ErrorIs(t, err, tc.wantCtx)
				assert.NotErrorIs(t, err, ErrTimeout)
			} else {
				assert.ErrorIs(t, err, ErrTimeout)
				var te *TimeoutError
				require.ErrorAs(t, err, &te)
				assert.Equal(t, "all-reduce sum", te.Op)
				assert.Equal(t, tc.timeout, te.Timeout)
				assert.NotErrorIs(t, err, context.DeadlineExceeded)
			}
			assert.GreaterOrEqual(t, elapsed, tc.min)
			assert.Less(t, elapsed, tc.max)
			_, err = g.AllReduceSum(context.Background(), []float64{1})
			require.ErrorContains(t, err, "broken")
			leave(t, g, peer)
		})
	}
}

// TestJoinGroupWithoutPeers: a rendezvous that never completes fails with
// a *TimeoutError after the timeout, naming how far it got, or with the
// context's error when the context ends first (the context case gives the
// join a long timeout, so the two deadlines are far apart).
func TestJoinGroupWithoutPeers(t *testing.T) {
	requireGloo(t)
	m := loadTiny(t, ModelOptions{Threads: 1})
	for _, tc := range []struct {
		name    string
		rank    int
		timeout time.Duration
		ctx     time.Duration // 0 = no deadline
		wantCtx error         // nil: a *TimeoutError
		state   string        // in the *TimeoutError's detail
	}{
		{"master_waits_for_workers", 0, time.Second, 0, nil, "1 of 2 ranks joined"},
		// Connect attempts fail until the deadline; the one under way then
		// runs to its end, for up to a few seconds on libtorch 2.x.
		{"worker_finds_no_master", 1, time.Second, 0, nil, "connecting"},
		{"context_deadline", 0, time.Minute, 300 * time.Millisecond, context.DeadlineExceeded, ""},
		{"worker_context_deadline", 1, time.Minute, 300 * time.Millisecond, context.DeadlineExceeded, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			ctx, cancel := context.WithCancel(context.Background())
			limit := tc.timeout
			if tc.ctx > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tc.ctx)
				limit = tc.ctx
			}
			defer cancel()
			g, err := m.JoinGroup(ctx, DistOptions{Addr: "127.0.0.1", Port: freePort(t), Rank: tc.rank, WorldSize: 2, Timeout: tc.timeout})
			elapsed := time.Since(start)
			require.Error(t, err)
			require.Nil(t, g)
			t.Logf("failed after %v: %v", elapsed, err)
			if tc.wantCtx != nil {
				assert.ErrorIs(t, err, tc.wantCtx)
				assert.NotErrorIs(t, err, ErrTimeout)
			} else {
				var te *TimeoutError
				require.ErrorAs(t, err, &te)
				assert.ErrorIs(t, err, ErrTimeout)
				assert.Equal(t, tc.timeout, te.Timeout)
				assert.Contains(t, te.Detail, tc.state)
			}
			assert.GreaterOrEqual(t, elapsed, limit)
			assert.Less(t, elapsed, limit+failSlack)
		})
	}
}

// TestGroupErr: a timeout from the worker matches ErrTimeout and learns the
// group's timeout, unless the context ended, whose error then wins.
func TestGroupErr(t *testing.T) {
	live := context.Background()
	done, cancel := context.WithCancel(live)
	cancel()
	timeout := func() error { return &TimeoutError{Op: "all-reduce sum", Detail: "timed out after 1000 ms"} }
	for _, tc := range []struct {
		name        string
		ctx         context.Context
		err         error
		wantTimeout bool
		wantCtx     error
	}{
		{"timeout", live, timeout(), true, nil},
		{"wrapped_timeout", live, fmt.Errorf("all-gather sizes: %w", timeout()), true, nil},
		{"cancelled_during_timeout", done, timeout(), false, context.Canceled},
		{"other_error", live, errors.New("all-reduce sum: connection closed by peer"), false, nil},
		{"none", live, nil, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := groupErr(tc.ctx, tc.err, time.Second)
			assert.Equal(t, tc.wantTimeout, errors.Is(err, ErrTimeout), "%v", err)
			if tc.wantCtx != nil {
				assert.ErrorIs(t, err, tc.wantCtx)
			}
			if tc.wantTimeout {
				var te *TimeoutError
				require.ErrorAs(t, err, &te)
				assert.Equal(t, time.Second, te.Timeout)
				assert.Equal(t, "all-reduce sum: timed out after 1000 ms", te.Error())
			}
		})
	}
}
