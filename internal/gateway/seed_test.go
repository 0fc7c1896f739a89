package gateway

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEveryCallHasItsOwnSeed: a rollout's calls sample with seeds derived
// from the rollout's seed and the call's number, whatever the agent sends
// while training (ForceSampling: its own seed is replaced and counted), so
// the rollouts of a group differ and a rerun with the same seeds samples
// the same; without ForceSampling (serve-engine) an agent's seed is kept.
func TestEveryCallHasItsOwnSeed(t *testing.T) {
	body := func(seed *int64) map[string]any {
		b := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "hi"}}}
		if seed != nil {
			b["seed"] = *seed
		}
		return b
	}
	fixed := int64(7)
	for _, tc := range []struct {
		name      string
		force     bool
		seed      *int64
		overrides int
	}{
		{"no seed sent, training", true, nil, 0},
		{"the same seed every time, training", true, &fixed, 2},
		{"no seed sent, serving", false, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.Defaults.ForceSampling = tc.force })
			seedsOf := func(id string, base int64) ([]int64, *Recorder) {
				key, rec, err := h.gw.OpenFor(context.Background(), id, Tenant{Seed: base})
				require.NoError(t, err)
				t.Cleanup(func() { h.gw.Close(id) })
				var seeds []int64
				for range 2 {
					status, out := h.post(t, RolloutPath(id)+"/chat/completions", key, body(tc.seed))
					require.Equal(t, http.StatusOK, status, "%s", out)
					seeds = append(seeds, h.sampler.lastRequest(t).Seed)
				}
				return seeds, rec
			}
			a, recA := seedsOf("a", 11)
			b, _ := seedsOf("b", 12)
			again, _ := seedsOf("a-again", 11)
			for _, s := range append(append([]int64{}, a...), b...) {
				assert.NotZero(t, s, "every call carries a seed")
			}
			assert.NotEqual(t, a[0], a[1], "each call of a rollout samples with its own seed")
			assert.NotEqual(t, a[0], b[0], "two rollouts of a group sample differently")
			assert.Equal(t, a, again, "the same rollout seed samples the same")
			overridden := 0
			for _, c := range recA.Calls() {
				if c.SeedOverridden {
					overridden++
				}
				assert.NotZero(t, c.Seed)
			}
			assert.Equal(t, tc.overrides, overridden)
		})
	}

	t.Run("serving keeps the agent's seed", func(t *testing.T) {
		h := newHarness(t, nil)
		key, _ := h.open(t, "s")
		status, out := h.post(t, RolloutPath("s")+"/chat/completions", key, body(&fixed))
		require.Equal(t, http.StatusOK, status, "%s", out)
		assert.Equal(t, fixed, h.sampler.lastRequest(t).Seed)
	})
}

// TestUnknownRouteIsTheRolloutsBadRequest: a tenant's call to a route the
// gateway does not serve is refused with 404 and counted against its
// rollout, naming the route (so the rollout ends agent_bad_request with
// the reason); without the key it is only a 401.
func TestUnknownRouteIsTheRolloutsBadRequest(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "u")
	status, out := h.post(t, RolloutPath("u")+"/embeddings", key, map[string]any{"input": "x"})
	assert.Equal(t, http.StatusNotFound, status, "%s", out)
	status, _ = h.get(t, RolloutPath("u")+"/chat/completions", key)
	assert.Equal(t, http.StatusNotFound, status, "a wrong method")
	require.Equal(t, 2, rec.Rejected())
	rej := rec.Rejections()
	assert.Equal(t, "POST "+RolloutPath("u")+"/embeddings", rej[0].Route)
	assert.Equal(t, "GET "+RolloutPath("u")+"/chat/completions", rej[1].Route)

	status, _ = h.post(t, RolloutPath("u")+"/embeddings", "", map[string]any{})
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Equal(t, 2, rec.Rejected(), "a request without the key is not the rollout's")
}
