package gateway

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/peercred"
)

// openOwned opens a rollout that requires an owner, closed on cleanup.
func (h *harness) openOwned(tb testing.TB, id string) (string, *Recorder) {
	tb.Helper()
	key, rec, err := h.gw.OpenFor(context.Background(), id, Tenant{RequireOwner: true})
	require.NoError(tb, err)
	tb.Cleanup(func() { h.gw.Close(id) })
	return key, rec
}

// otherProcess is a live process the test process does not descend from
// (its own child), to bind a tenant to.
func otherProcess(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

// TestOwnerRefusesAnotherProcessTree: a tenant bound to a process tree
// answers its own key from anywhere else exactly as a wrong key, and the
// refusal is the gateway's count, not the rollout's (the thief must not
// get its victim masked), also when the key is sent to another rollout.
func TestOwnerRefusesAnotherProcessTree(t *testing.T) {
	if !peercred.Supported() {
		t.Skip("no peer process lookup on this platform")
	}
	h := newHarness(t, nil)
	key, rec := h.openOwned(t, "victim")
	require.NoError(t, h.gw.BindOwner("victim", otherProcess(t)))
	_, plainRec := h.open(t, "plain")
	body := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "Hello"}}}

	wrongStatus, wrongBody := h.post(t, chatPath("victim"), "sk-ortrain-wrong", body)
	require.Equal(t, 401, wrongStatus)
	unauthorized := h.gw.Unauthorized()

	cases := []struct{ name, path string }{
		{"its own URL", chatPath("victim")},
		{"another rollout's URL", chatPath("plain")},
		{"a closed rollout's URL", chatPath("gone")},
		{"an unknown route", RolloutPath("victim") + "/nowhere"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, out := h.post(t, c.path, key, body)
			assert.Equal(t, 401, status)
			assert.JSONEq(t, string(wrongBody), string(out), "the same answer as a wrong key")
			assert.EqualValues(t, i+1, h.gw.ForeignProcess())
		})
	}
	assert.Equal(t, 0, rec.Rejected(), "nothing counted against the victim")
	assert.Empty(t, rec.Rejections())
	assert.Equal(t, 0, plainRec.Rejected())
	assert.Equal(t, unauthorized, h.gw.Unauthorized())
	h.sampler.mu.Lock()
	defer h.sampler.mu.Unlock()
	assert.Empty(t, h.sampler.requests, "nothing reached the engine")
}

// TestOwnerAdmitsItsTree: the owner's own calls are served, also those
// sent before it was bound (they wait for BindOwner).
func TestOwnerAdmitsItsTree(t *testing.T) {
	if !peercred.Supported() {
		t.Skip("no peer process lookup on this platform")
	}
	h := newHarness(t, nil)
	key, rec := h.openOwned(t, "mine")
	h.sampler.script("Hi.", true)
	body := `{"model":"m","messages":[{"role":"user","content":"Hello"}]}`
	early := h.postAsync(chatPath("mine"), key, body)
	time.Sleep(100 * time.Millisecond) // the call waits for its owner
	require.NoError(t, h.gw.BindOwner("mine", os.Getpid()))
	res := <-early
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status, string(res.body))
	status, out := h.post(t, chatPath("mine"), key, body)
	require.Equal(t, 200, status, string(out))
	assert.Len(t, rec.Calls(), 2)
	assert.Zero(t, h.gw.ForeignProcess())
}

// TestOwnerNeverBound: a call to a tenant whose owner is not bound in time
// is refused as a wrong key, and counted on the gateway.
func TestOwnerNeverBound(t *testing.T) {
	if !peercred.Supported() {
		t.Skip("no peer process lookup on this platform")
	}
	h := newHarness(t, nil)
	key, rec := h.openOwned(t, "late")
	res := h.postAsync(chatPath("late"), key, `{"model":"m","messages":[{"role":"user","content":"Hello"}]}`)
	time.Sleep(100 * time.Millisecond)
	h.gw.Close("late") // closing ends the wait at once
	select {
	case r := <-res:
		require.NoError(t, r.err)
		assert.Equal(t, 401, r.status)
	case <-time.After(ownerWait - time.Second):
		t.Fatal("the wait for an owner outlived its rollout")
	}
	assert.Equal(t, 0, rec.Rejected())
	assert.EqualValues(t, 1, h.gw.ForeignProcess())
}

func TestBindOwnerErrors(t *testing.T) {
	h := newHarness(t, nil)
	h.open(t, "plain")
	h.openOwned(t, "owned")
	require.ErrorIs(t, h.gw.BindOwner("nope", 1), ErrRolloutNotOpen)
	require.ErrorContains(t, h.gw.BindOwner("plain", 1), "RequireOwner")
	require.Error(t, h.gw.BindOwner("owned", 0))
	require.NoError(t, h.gw.BindOwner("owned", os.Getpid()))
	require.Error(t, h.gw.BindOwner("owned", os.Getpid()), "bound once")
}
