package engine_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"sync"
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

// lockedBuffer is a log sink safe for the engine's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startVersionedServer serves the toy backend as a vLLM of version would,
// started by someone else (engine.vllm_urls) with or without dev mode.
func startVersionedServer(t *testing.T, version string, devMode bool) string {
	t.Helper()
	srv := engineserver.NewServer(servetest.NewBackend(0), engineserver.Options{ModelName: "toy", ModelRoot: "/models/toy", MaxModelLen: 256,
		Version: version, DevMode: devMode, Batch: engine.BuiltinOptions{MaxBatch: 4, Linger: time.Millisecond}})
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); srv.Close() })
	return hs.URL
}

// TestVLLMVersionDifferencesFailAtStart: each version difference that would
// break the first weight sync fails the start instead (the whole push runs
// once with the initial weights), naming the version and the fix; a shared
// server whose pause cannot wait, and control routes open without the key,
// are said at start.
func TestVLLMVersionDifferencesFailAtStart(t *testing.T) {
	export, _ := exportSlope(nil)
	start := func(url string, log *lockedBuffer) (*engine.VLLM, error) {
		return engine.NewVLLM(context.Background(), engine.VLLMOptions{URLs: []string{url}, SyncMode: engine.SyncFull, SyncDir: t.TempDir(),
			Export: export, Timeout: 10 * time.Second, Logger: zerolog.New(log)})
	}

	// 0.14 without dev mode: /is_paused answers (its router was ungated),
	// /collective_rpc does not exist.
	var log lockedBuffer
	_, err := start(startVersionedServer(t, "0.14.0", false), &log)
	var ce *vllm.CapabilityError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, ce.Missing, "/collective_rpc")
	assert.Contains(t, ce.Missing, "vLLM 0.14.0")
	assert.Contains(t, ce.Fix, "VLLM_SERVER_DEV_MODE=1")

	// 0.14 with dev mode: reload_weights takes no weights_path. The server
	// is not left paused for its other clients.
	url := startVersionedServer(t, "0.14.0", true)
	_, err = start(url, &log)
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, ce.Missing, "reload_weights(weights_path=...)")
	assert.Contains(t, ce.Fix, "grpo.lora.enabled")
	assert.Contains(t, log.String(), "no /pause?mode=", "a shared 0.14 server's pause aborts other clients' requests: said at start")
	c, err := vllm.NewClient(url, nil)
	require.NoError(t, err)
	paused, err := c.IsPaused(context.Background())
	require.NoError(t, err)
	assert.False(t, paused, "resumed after the failed push")

	// Current vLLM in dev mode, started by someone else: it works, and the
	// control routes its key leaves open are named.
	log = lockedBuffer{}
	v, err := start(startVersionedServer(t, "", true), &log)
	require.NoError(t, err)
	t.Cleanup(func() { v.Close() })
	require.NoError(t, v.SyncWeights(context.Background(), 1))
	assert.Contains(t, log.String(), "without the API key")
	assert.Contains(t, log.String(), "/collective_rpc")
	assert.NotContains(t, log.String(), "no /pause?mode=")
}
