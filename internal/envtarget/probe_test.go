package envtarget_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/ors"
)

// serveHandler runs h on 127.0.0.1:0 until the test ends.
func serveHandler(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	return "http://" + l.Addr().String()
}

const nginx404 = "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx/1.27.0</center>\r\n</body>\r\n</html>\r\n"

// page answers every request with one HTML page.
func page(status int, body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	})
}

func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	return u
}

// Issue 23 item 2: a URL target's protocol is detected unless pinned; a
// server that speaks neither (or not the pinned one) is a *ProtocolError
// whatever protocol says, naming both probes without dumping the page.
func TestURLProtocolDetection(t *testing.T) {
	openenvURL, _ := serveOpenEnv(t, shoutEnv(), openenvserver.Options{})
	orsURL, _ := serveEcho(t)
	nginx := serveHandler(t, page(http.StatusNotFound, nginx404))
	spa := serveHandler(t, page(http.StatusOK, "<!doctype html><html><body>"+strings.Repeat("<div>app</div>", 500)+"</body></html>"))
	// An OpenEnv server that also serves ORS's task routes (as OpenEnv's
	// ORS import adds) is OpenEnv.
	srv, err := openenvserver.New(openenvserver.Options{}, shoutEnv())
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	both := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/list_environments" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`["shoutenvironment"]`))
			return
		}
		srv.ServeHTTP(w, r)
	}))

	tests := []struct {
		name, target, protocol string
		want                   envtarget.Protocol
		check                  func(t *testing.T, err error)
	}{
		{name: "openenv detected", target: openenvURL, want: envtarget.OpenEnv},
		{name: "ors detected", target: orsURL, want: envtarget.ORS},
		{name: "auto is detection", target: openenvURL, protocol: "auto", want: envtarget.OpenEnv},
		{name: "both answer: openenv", target: both, want: envtarget.OpenEnv},
		{name: "pinned openenv", target: openenvURL, protocol: "openenv", want: envtarget.OpenEnv},
		{name: "pinned ors", target: orsURL, protocol: "ors", want: envtarget.ORS},
		{name: "pinned ors on openenv", target: openenvURL, protocol: "ors", check: func(t *testing.T, err error) {
			var pe *envtarget.ProtocolError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, envtarget.ORS, pe.Pinned)
			assert.Equal(t, envtarget.OpenEnv, pe.Speaks)
			assert.ErrorContains(t, err, "speaks OpenEnv, not ORS: set protocol openenv, or leave protocol unset")
		}},
		{name: "pinned openenv on ors", target: orsURL, protocol: "openenv", check: func(t *testing.T, err error) {
			var pe *envtarget.ProtocolError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, envtarget.ORS, pe.Speaks)
			assert.ErrorContains(t, err, `GET /health answered HTTP 200, application/json, first line "{\"status\":\"ok\"}"`)
		}},
	}
	for _, proto := range []string{"", "ors", "openenv"} {
		tests = append(tests, struct {
			name, target, protocol string
			want                   envtarget.Protocol
			check                  func(t *testing.T, err error)
		}{name: "nginx, protocol " + proto, target: nginx, protocol: proto, check: func(t *testing.T, err error) {
			var pe *envtarget.ProtocolError
			require.ErrorAs(t, err, &pe, "one error type whatever protocol says")
			require.Len(t, pe.Probes, 2, "both probes are named")
			assert.Equal(t, http.StatusNotFound, pe.Probes[0].Status)
			assert.Empty(t, pe.Speaks)
			msg := err.Error()
			assert.Contains(t, msg, `GET /health answered HTTP 404, text/html, first line "404 Not Found"; want 200 and {"status":"healthy"}`)
			assert.Contains(t, msg, `GET /list_environments answered HTTP 404, text/html, first line "404 Not Found"; want 200 and a JSON list of environment names`)
			assert.NotContains(t, msg, "nginx/1.27.0", "the page is not dumped")
		}}, struct {
			name, target, protocol string
			want                   envtarget.Protocol
			check                  func(t *testing.T, err error)
		}{name: "html app, protocol " + proto, target: spa, protocol: proto, check: func(t *testing.T, err error) {
			var pe *envtarget.ProtocolError
			require.ErrorAs(t, err, &pe)
			assert.Contains(t, err.Error(), "HTTP 200, text/html")
			assert.Less(t, len(err.Error()), 1000, "a long page is cut to its first line: %s", err)
		}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := resolveWith(t, tt.target, envtarget.Options{Protocol: tt.protocol, OpenEnv: envtarget.OpenEnvOptions{NumTasks: 1}})
			if tt.check != nil {
				require.Error(t, err)
				tt.check(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, e.Protocol())
		})
	}
}

// Unreachable and silent servers fail fast and typed, whatever protocol
// says; detection names both probes.
func TestURLProbeFailures(t *testing.T) {
	dead := deadURL(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	for _, target := range []string{dead, "http://" + silent.Addr().String()} {
		for _, proto := range []string{"", "ors", "openenv"} {
			t.Run(target+" "+proto, func(t *testing.T) {
				start := time.Now()
				_, err := resolveWith(t, target, envtarget.Options{Protocol: proto, ProbeTimeout: 300 * time.Millisecond})
				var ue *envtarget.UnreachableError
				require.ErrorAs(t, err, &ue)
				assert.Less(t, time.Since(start), 3*time.Second, "probes are bounded")
				if proto == "" {
					assert.ErrorContains(t, err, "probed OpenEnv GET /health and ORS GET /list_environments")
				}
			})
		}
	}
}

// Issue 23 item 4: a secured OpenEnv server gets the token of the variable
// the config names on every request and upgrade; without it the error says
// which variable to set.
func TestOpenEnvBearerToken(t *testing.T) {
	srv, err := openenvserver.New(openenvserver.Options{}, envs.MCPEcho())
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	url := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer hf_secret" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"detail":"Invalid credentials"}`))
			return
		}
		srv.ServeHTTP(w, r)
	}))
	env := map[string]string{"SPACE_TOKEN": "hf_secret"}
	getenv := func(k string) string { return env[k] }
	for _, proto := range []string{"", "openenv"} {
		e, err := resolveWith(t, url, envtarget.Options{Protocol: proto, TokenEnv: "SPACE_TOKEN", Getenv: getenv, OpenEnv: envtarget.OpenEnvOptions{NumTasks: 1}})
		require.NoError(t, err)
		assert.Equal(t, envtarget.OpenEnv, e.Protocol())
		ctx := context.Background()
		s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train"})
		require.NoError(t, err, "the /ws upgrade carries the token")
		out, err := s.CallTool(ctx, "echo_message", []byte(`{"message":"hi"}`))
		require.NoError(t, err)
		assert.Equal(t, "hi", out.Text)
		require.NoError(t, s.Close(ctx))
	}

	tests := []struct {
		name, tokenEnv string
		env            map[string]string
		want           string
		sent           bool
	}{
		{"variable not set", "SPACE_TOKEN", nil, "set SPACE_TOKEN (it is not set)", false},
		{"wrong token", "SPACE_TOKEN", map[string]string{"SPACE_TOKEN": "hf_wrong"}, "refused the token in SPACE_TOKEN (it is set)", true},
	}
	for _, tt := range tests {
		for _, proto := range []string{"", "openenv"} {
			t.Run(tt.name+" "+proto, func(t *testing.T) {
				_, err := resolveWith(t, url, envtarget.Options{Protocol: proto, TokenEnv: tt.tokenEnv, Getenv: func(k string) string { return tt.env[k] }})
				var ae *openenv.AuthError
				require.ErrorAs(t, err, &ae)
				assert.Equal(t, tt.sent, ae.TokenSent)
				assert.ErrorContains(t, err, tt.want)
				assert.NotContains(t, err.Error(), "hf_wrong")
			})
		}
	}
	// No token variable applies: a server refusing everything is an ORS
	// auth failure (its API key), as before detection existed.
	_, err = resolveWith(t, url, envtarget.Options{})
	var oa *ors.AuthError
	require.ErrorAs(t, err, &oa)
	assert.ErrorContains(t, err, "Invalid credentials")
}

func TestHFSpaceTokenDefault(t *testing.T) {
	var asked []string
	getenv := func(k string) string { asked = append(asked, k); return "" }
	_, err := envtarget.Resolve(context.Background(), "https://owner-env.hf.space.invalid", envtarget.Options{Getenv: getenv, ProbeTimeout: 100 * time.Millisecond})
	require.Error(t, err)
	assert.NotContains(t, asked, "HF_TOKEN", "only *.hf.space hosts default to HF_TOKEN")

	asked = nil
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no network: only which variable is read matters
	_, err = envtarget.Resolve(ctx, "https://owner-env.hf.space", envtarget.Options{Getenv: getenv})
	require.Error(t, err)
	assert.Contains(t, asked, "HF_TOKEN")
	asked = nil
	_, _ = envtarget.Resolve(ctx, "https://owner-env.hf.space", envtarget.Options{Getenv: getenv, TokenEnv: "MY_HF"})
	assert.Contains(t, asked, "MY_HF", "token_env wins")
	assert.NotContains(t, asked, "HF_TOKEN")
}

func TestURLTargetSyntax(t *testing.T) {
	for _, target := range []string{"http://", "ftp://host/x", "http://%zz"} {
		_, err := envtarget.Resolve(context.Background(), target, envtarget.Options{})
		var te *envtarget.TargetError
		require.ErrorAs(t, err, &te, target)
	}
}

func TestTokenEnvMustBeAName(t *testing.T) {
	for _, name := range []string{"hf_abcdefGHIJ0123456789", "1X", "A-B"} {
		_, err := envtarget.Resolve(context.Background(), "https://owner-env.hf.space", envtarget.Options{TokenEnv: name})
		var te *envtarget.TargetError
		require.ErrorAs(t, err, &te, name)
		assert.NotContains(t, err.Error(), name)
	}
}

// A private HF Space may answer a plain 404 page to a request without a
// token: the error says which variable would have carried one.
func TestProtocolErrorNamesAnUnsentToken(t *testing.T) {
	nginx := serveHandler(t, page(http.StatusNotFound, nginx404))
	_, err := resolveWith(t, nginx, envtarget.Options{TokenEnv: "SPACE_TOKEN"})
	var pe *envtarget.ProtocolError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "SPACE_TOKEN", pe.UnsentToken)
	assert.ErrorContains(t, err, "no token was sent: if the server is private, set SPACE_TOKEN")
}
