package envmcp_test

import (
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/peercred"
)

// TestOwnedEpisode: an episode bound to a process tree serves its key only
// from that tree; from anywhere else the key gets a wrong key's answer,
// counted on the server and never reaching the session, also when it is
// sent to another rollout's path or to one that is not attached.
func TestOwnedEpisode(t *testing.T) {
	if !peercred.Supported() {
		t.Skip("no peer process lookup on this platform")
	}
	other := exec.Command("sleep", "60")
	require.NoError(t, other.Start())
	t.Cleanup(func() {
		_ = other.Process.Kill()
		_ = other.Wait()
	})
	srv, base := serve(t, envmcp.Options{})
	victimSess, mineSess := &stubSession{}, &stubSession{}
	tools := []envtarget.ToolSpec{{Name: "echo", Description: "Echo."}}
	victim := srv.AttachOwned("victim", "key-v", victimSess, tools)
	require.NoError(t, victim.BindOwner(other.Process.Pid))
	mine := srv.AttachOwned("mine", "key-m", mineSess, tools)
	require.Error(t, srv.Attach("plain", "key-p", &stubSession{}, tools).BindOwner(os.Getpid()), "not attached with an owner")

	wrong := newClient(t, base, "victim", "key-wrong").do(http.MethodPost, []byte(`{}`), nil)
	require.Equal(t, http.StatusUnauthorized, wrong.Status)

	// A call made before BindOwner waits for it.
	bound := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		bound <- mine.BindOwner(os.Getpid())
	}()
	own := newClient(t, base, "mine", "key-m")
	own.initialize("2025-06-18")
	require.NoError(t, <-bound)
	require.Error(t, mine.BindOwner(os.Getpid()), "bound once")
	assert.False(t, own.callTool("echo", nil).IsError)
	assert.Zero(t, srv.ForeignProcess())

	for _, id := range []string{"victim", "mine", "gone"} {
		r := newClient(t, base, id, "key-v").do(http.MethodPost,
			[]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}`), nil)
		assert.Equal(t, wrong.Status, r.Status, id)
		assert.Equal(t, string(wrong.Body), string(r.Body), "the same answer as a wrong key")
		assert.Equal(t, `Bearer realm="ortrain"`, r.Header.Get("WWW-Authenticate"))
	}
	// Counted where the key is its owner's (the victim's path, a path no
	// longer attached); at another rollout's path it is a wrong key.
	assert.EqualValues(t, 2, srv.ForeignProcess())
	assert.Empty(t, victim.Calls())
	assert.Zero(t, victimSess.maxSeen.Load(), "nothing reached the victim's session")
	assert.Len(t, mine.Calls(), 1)
}
