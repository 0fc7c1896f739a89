package engine_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver"
	"github.com/ortrain/ortrain/internal/engineserver/servetest"
	"github.com/ortrain/ortrain/internal/vllm"
)

// sessionLog records, per X-Session-ID, the replicas that served its
// completions.
type sessionLog struct {
	mu   sync.Mutex
	seen map[string][]int
}

func (l *sessionLog) add(session string, replica int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen[session] = append(l.seen[session], replica)
}

// keyedReplica is an in-process serve-engine over the toy backend that
// logs which sessions it served; Kill closes it like a dead process.
type keyedReplica struct {
	*httptest.Server
	backend *servetest.Backend
	served  atomic.Int64
}

func (r *keyedReplica) URL() string { return r.Server.URL }
func (r *keyedReplica) Ready() bool { return true } // a URL someone else runs

func startKeyedReplicas(t *testing.T, n int, apiKey string, log *sessionLog) []*keyedReplica {
	var out []*keyedReplica
	for i := range n {
		backend := servetest.NewBackend(0.3)
		backend.Delay = 5 * time.Millisecond
		srv := engineserver.NewServer(backend, engineserver.Options{ModelName: "toy", ModelRoot: "/models/toy", MaxModelLen: 256, APIKey: apiKey,
			DevMode: true, Batch: engine.BuiltinOptions{MaxBatch: 16, Linger: time.Millisecond}})
		r := &keyedReplica{backend: backend}
		r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path == "/v1/completions" {
				r.served.Add(1)
				if id := req.Header.Get("X-Session-ID"); id != "" && log != nil {
					log.add(id, i)
				}
			}
			srv.ServeHTTP(w, req)
		}))
		t.Cleanup(func() { r.Server.Close(); srv.Close() })
		out = append(out, r)
	}
	return out
}

func endpoints(rs []*keyedReplica) []vllm.Endpoint {
	eps := make([]vllm.Endpoint, len(rs))
	for i, r := range rs {
		eps[i] = r
	}
	return eps
}

// playSessions runs sessions rollouts of turns sequential turns each,
// concurrently; between turns it calls between(turn).
func playSessions(t *testing.T, v *engine.VLLM, sessions, turns int, between func(turn int)) {
	var wg sync.WaitGroup
	var turnDone sync.WaitGroup
	for turn := range turns {
		turnDone.Add(sessions)
		for s := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer turnDone.Done()
				req := toyRequest(int64(s*10 + turn + 1))
				req.SessionKey = fmt.Sprintf("rollout-%d", s)
				_, err := v.Generate(context.Background(), req)
				assert.NoError(t, err, "session %d turn %d", s, turn)
			}()
		}
		turnDone.Wait()
		if between != nil {
			between(turn)
		}
	}
	wg.Wait()
}

// TestRouterKeepsSessionsOnOneReplica: every turn of a rollout goes to the
// same one of three replicas, and the rollouts spread over all three.
func TestRouterKeepsSessionsOnOneReplica(t *testing.T) {
	log := &sessionLog{seen: map[string][]int{}}
	rs := startKeyedReplicas(t, 3, "", log)
	v := newTestVLLM(t, engine.SyncNone, nil, endpoints(rs)...)
	playSessions(t, v, 24, 3, nil)

	perReplica := map[int]int{}
	require.Len(t, log.seen, 24)
	for s, replicas := range log.seen {
		require.Len(t, replicas, 3, s)
		assert.Equal(t, []int{replicas[0], replicas[0], replicas[0]}, replicas, "%s stayed on one replica", s)
		perReplica[replicas[0]]++
	}
	assert.Len(t, perReplica, 3, "sessions spread over every replica: %v", perReplica)
	st := v.RouterStats()
	assert.Zero(t, st.Moved)
	assert.Equal(t, int64(72), st.Requests[0]+st.Requests[1]+st.Requests[2])
}

// TestRouterMovesSessionsOffAKilledReplica: one of three replicas dies
// between turns; no request fails, its sessions move (counted) and stay on
// their new replica, the others never move.
func TestRouterMovesSessionsOffAKilledReplica(t *testing.T) {
	log := &sessionLog{seen: map[string][]int{}}
	rs := startKeyedReplicas(t, 3, "", log)
	v := newTestVLLM(t, engine.SyncNone, nil, endpoints(rs)...)
	playSessions(t, v, 24, 4, func(turn int) {
		if turn == 1 {
			rs[1].CloseClientConnections()
			rs[1].Close()
		}
	})
	var moved int
	for s, replicas := range log.seen {
		first := replicas[0]
		switch {
		case first != 1:
			assert.Equal(t, []int{first, first, first, first}, replicas, "%s was not on the dead replica and stayed", s)
		default:
			moved++
			require.Len(t, replicas, 4, s)
			assert.Equal(t, []int{1, 1}, replicas[:2], s)
			assert.NotEqual(t, 1, replicas[2], s)
			assert.Equal(t, replicas[2], replicas[3], "%s stays on its new replica", s)
		}
	}
	require.Positive(t, moved, "some sessions were on replica 1")
	assert.Equal(t, int64(moved), v.RouterStats().Moved)
}

// TestRouterSyncReachesEveryReplica: a full-weight sync reloads all three
// replicas, and every replica then samples with the new weights.
func TestRouterSyncReachesEveryReplica(t *testing.T) {
	rs := startKeyedReplicas(t, 3, "", nil)
	export, _ := exportSlope(nil)
	v := newTestVLLM(t, engine.SyncFull, export, endpoints(rs)...)
	require.NoError(t, v.SyncWeights(context.Background(), 1))
	st := v.LastSync()
	for i, r := range rs {
		assert.Equal(t, []string{filepath.Join(v.SyncDir(), "policy-v0"), st.Dir}, r.backend.Reloads(), "replica %d reloaded at start and at step 1", i)
	}
	playSessions(t, v, 12, 1, nil)
	for i, r := range rs {
		assert.Positive(t, r.served.Load(), "replica %d served", i)
	}
	got, err := v.Generate(context.Background(), toyRequest(3))
	require.NoError(t, err)
	assert.Equal(t, servetest.Sample(toyRequest(3), 1), got)
}

// TestVLLMSendsAPIKey: replicas that require a key serve a backend that
// has it, refuse one that does not (naming the status), and guard their
// control routes.
func TestVLLMSendsAPIKey(t *testing.T) {
	rs := startKeyedReplicas(t, 2, "s3cret-key", nil)
	v, err := engine.NewVLLM(context.Background(), engine.VLLMOptions{Endpoints: endpoints(rs), SyncMode: engine.SyncNone,
		APIKey: "s3cret-key", Timeout: 10 * time.Second, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	require.NoError(t, err)
	t.Cleanup(func() { v.Close() })
	_, err = v.Generate(context.Background(), toyRequest(1))
	require.NoError(t, err)

	_, err = engine.NewVLLM(context.Background(), engine.VLLMOptions{Endpoints: endpoints(rs), SyncMode: engine.SyncNone,
		Timeout: 10 * time.Second, Logger: zerolog.Nop()})
	var se *vllm.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, http.StatusUnauthorized, se.Code)

	// As in vLLM, the key guards /v1 only: the dev routes answer without
	// it, and OpenRoutes (harmless probes) says so.
	c, err := vllm.NewClient(rs[0].URL(), nil)
	require.NoError(t, err)
	open, err := vllm.OpenRoutes(context.Background(), c)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"/is_paused", "/pause", "/resume", "/collective_rpc", "/reset_prefix_cache"}, open)
}
