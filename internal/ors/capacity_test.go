package ors_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

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

// Issue 23 item 4: busy answers (429, 503) that the client waits out are
// counted, and logged once at info level rather than once per retry.
func TestCapacityWaitsAreCounted(t *testing.T) {
	var busy atomic.Int32
	busy.Store(4)
	k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/create_session") && !strings.HasSuffix(r.URL.Path, "/splits") {
			return false
		}
		switch n := busy.Add(-1); {
		case n >= 2:
			http.Error(w, `{"detail":"at capacity"}`, http.StatusServiceUnavailable)
		case n >= 0:
			http.Error(w, `{"detail":"slow down"}`, http.StatusTooManyRequests)
		default:
			return false
		}
		return true
	})
	logs := &lockedBuffer{}
	c, err := ors.NewClient(k.url, ors.Options{
		Logger: zerolog.New(logs).Level(zerolog.InfoLevel), RequestAttempts: 5, CreateRetries: 5,
		Sleep: func(context.Context, time.Duration) error { return nil },
	})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = c.Splits(ctx)
	require.NoError(t, err)
	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 0})
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
	assert.Equal(t, int64(4), c.CapacityWaits(), "every busy answer was waited out and counted")
	assert.Equal(t, 1, strings.Count(logs.String(), "server busy"), logs.String())
	assert.Contains(t, logs.String(), `"level":"info"`)
}
