package vllm_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/vllm"
)

const replicaKey = "sk-guarded-replica"

// TestSupervisorGuardsBeyondLoopback: a replica asked to serve 0.0.0.0
// listens on 127.0.0.1 only, with ortrain's guard on the requested address
// requiring the key on every route; the trainer's own URL is the loopback
// one. The guard follows the replica through a restart and stops with it.
func TestSupervisorGuardsBeyondLoopback(t *testing.T) {
	fixed, err := vllm.FreePort("0.0.0.0")
	require.NoError(t, err)
	tests := []struct {
		name     string
		basePort int
	}{
		{"free ports", 0},
		{"fixed port", fixed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, log := supervisorOptions(t, childKind{name: "toy", command: []string{toyServer}, model: "toy-model"}, 1)
			opts.Launch.Host, opts.Launch.APIKey, opts.BasePort = "0.0.0.0", replicaKey, tt.basePort
			ctx := testContext(t, 2*time.Minute)
			sup, err := vllm.Start(ctx, opts)
			require.NoError(t, err)
			stopped := false
			t.Cleanup(func() {
				if !stopped {
					sup.Stop()
				}
			})
			r := sup.Replicas()[0]
			require.True(t, r.Ready())
			require.True(t, strings.HasPrefix(r.URL(), "http://127.0.0.1:"), r.URL())
			pub, err := url.Parse(r.PublicURL())
			require.NoError(t, err)
			assert.Equal(t, vllm.PublicHost("0.0.0.0"), pub.Hostname(), "a wildcard bind is named by this machine's hostname")
			if tt.basePort > 0 {
				assert.Equal(t, strconv.Itoa(tt.basePort), pub.Port())
			}
			assert.Equal(t, []string{r.PublicURL()}, sup.PublicURLs())
			assert.Equal(t, []string{"starting", "ready"}, log.states(0))
			assert.Equal(t, r.PublicURL(), log.last(0).PublicURL)

			// The guard answers on every address of the machine; dial it over loopback.
			guardURL := "http://127.0.0.1:" + pub.Port()
			assertKeyOnEveryRoute(t, guardURL)
			assertListensOnLoopbackOnly(t, portOf(t, r.URL()))
			complete(t, ctx, r.URL(), "toy-model", replicaKey) // ortrain's own path: loopback, with the key

			// A crash restarts vLLM behind a new guard on the same public port.
			oldPID := r.PID()
			require.NoError(t, syscall.Kill(oldPID, syscall.SIGKILL))
			require.Eventually(t, func() bool { return r.Restarts() == 1 && r.Ready() }, time.Minute, 20*time.Millisecond)
			assert.Equal(t, guardURL, "http://127.0.0.1:"+portOf(t, r.PublicURL()), "the restart kept the public port")
			assertKeyOnEveryRoute(t, guardURL)
			assertListensOnLoopbackOnly(t, portOf(t, r.URL()))

			sup.Stop()
			stopped = true
			_, err = net.DialTimeout("tcp", "127.0.0.1:"+pub.Port(), time.Second)
			assert.Error(t, err, "the guard still listens after Stop")
		})
	}
}

// assertKeyOnEveryRoute: without the key (or with a wrong one) every route is
// refused, health included; with it the control routes answer.
func assertKeyOnEveryRoute(t *testing.T, base string) {
	t.Helper()
	tests := []struct {
		method, path, key string
		want              int
	}{
		{"GET", "/is_paused", "", http.StatusUnauthorized},
		{"GET", "/is_paused", "wrong", http.StatusUnauthorized},
		{"GET", "/health", "", http.StatusUnauthorized},
		{"POST", "/collective_rpc", "", http.StatusUnauthorized},
		{"GET", "/v1/models", "", http.StatusUnauthorized},
		{"GET", "/is_paused", replicaKey, http.StatusOK},
		{"GET", "/health", replicaKey, http.StatusOK},
		{"GET", "/v1/models", replicaKey, http.StatusOK},
	}
	for _, tt := range tests {
		req, err := http.NewRequest(tt.method, base+tt.path, nil)
		require.NoError(t, err)
		if tt.key != "" {
			req.Header.Set("Authorization", "Bearer "+tt.key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, tt.want, resp.StatusCode, "%s %s key=%q", tt.method, tt.path, tt.key)
	}
}

func portOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	return p.Port()
}

// assertListensOnLoopbackOnly reads the kernel's socket tables: every
// listening socket on port is bound to 127.0.0.1.
func assertListensOnLoopbackOnly(t *testing.T, port string) {
	t.Helper()
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	want := fmt.Sprintf(":%04X", n)
	var found []string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// sl local_address rem_address st ...; st 0A is LISTEN.
			if len(fields) > 3 && fields[3] == "0A" && strings.HasSuffix(fields[1], want) {
				found = append(found, fields[1])
			}
		}
		f.Close()
	}
	if len(found) == 0 {
		t.Skip("no /proc/net/tcp: cannot read what the replica binds")
	}
	assert.Equal(t, []string{"0100007F" + want}, found, "the replica behind the guard must listen on 127.0.0.1 only")
}

func TestPublicHost(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	tests := []struct{ in, want string }{
		{"0.0.0.0", host},
		{"::", host},
		{"[::]", host},
		{"10.0.0.5", "10.0.0.5"},
		{"node-7.cluster", "node-7.cluster"},
		{"[fd00::1]", "fd00::1"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, vllm.PublicHost(tt.in), tt.in)
	}
}
