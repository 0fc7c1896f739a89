package gateway

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
)

type versionKey struct{}

// contextSampler passes requests to the fake sampler and keeps the value
// each generation's context carries under versionKey.
type contextSampler struct {
	*fakeSampler
	mu   sync.Mutex
	seen []any
}

func (c *contextSampler) Generate(ctx context.Context, req engine.Request) (engine.Result, error) {
	c.mu.Lock()
	c.seen = append(c.seen, ctx.Value(versionKey{}))
	c.mu.Unlock()
	return c.fakeSampler.Generate(ctx, req)
}

// TestOpenForServesOneVersion: a rollout opened with OpenFor stamps its
// calls with its own version (not Options.WeightVersion), and its
// generations see the values of the context it was opened with (the
// trainer's sampler version) though not its cancellation.
func TestOpenForServesOneVersion(t *testing.T) {
	var cs *contextSampler
	h := newHarness(t, func(o *Options) {
		cs = &contextSampler{fakeSampler: o.Sampler.(*fakeSampler)}
		o.Sampler = cs
	})
	h.version.Store(9)
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), versionKey{}, 4))
	key, rec, err := h.gw.OpenFor(parent, "v4", Tenant{Version: 4})
	require.NoError(t, err)
	t.Cleanup(func() { h.gw.Close("v4") })
	cancel() // the round's cancellation is the trainer's business, not the calls'
	plainKey, plainRec := h.open(t, "plain")

	h.sampler.script("Hi.", true)
	body := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "Hello"}}}
	status, out := h.post(t, chatPath("v4"), key, body)
	require.Equal(t, 200, status, string(out))
	status, out = h.post(t, chatPath("plain"), plainKey, body)
	require.Equal(t, 200, status, string(out))

	require.Len(t, rec.Calls(), 1)
	assert.Equal(t, 4, rec.Calls()[0].WeightVersion)
	require.Len(t, plainRec.Calls(), 1)
	assert.Equal(t, 9, plainRec.Calls()[0].WeightVersion)
	assert.Equal(t, []any{4, nil}, cs.seen)
}
