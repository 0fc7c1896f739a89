package reward

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/backoff"
)

func ptr[T any](v T) *T { return &v }

// instantBackoff records its waits instead of sleeping.
func instantBackoff(waits *[]time.Duration) func(string) *backoff.Backoff {
	return func(name string) *backoff.Backoff {
		b := backoff.New(100*time.Millisecond, time.Second)
		b.Name = name
		b.Sleep = func(ctx context.Context, d time.Duration) error {
			if waits != nil {
				*waits = append(*waits, d)
			}
			return ctx.Err()
		}
		return b
	}
}

// serve starts a loopback server closed at the end of the test.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func compile(t *testing.T, specs []Spec, opts Options) *Set {
	t.Helper()
	set, err := Compile(specs, opts)
	require.NoError(t, err)
	return set
}

// assertFloats compares with NaN equal to NaN.
func assertFloats(t *testing.T, want, got []float64, msgAndArgs ...any) {
	t.Helper()
	require.Len(t, got, len(want), msgAndArgs...)
	for i := range want {
		assertFloat(t, want[i], got[i], msgAndArgs...)
	}
}

func assertFloat(t *testing.T, want, got float64, msgAndArgs ...any) {
	t.Helper()
	if math.IsNaN(want) {
		assert.True(t, math.IsNaN(got), "want NaN, got %v %v", got, msgAndArgs)
		return
	}
	assert.InDelta(t, want, got, 1e-12, msgAndArgs...)
}

// tee reads r's body and puts it back for the next handler (handler
// goroutines may only assert, not require).
func tee(t *testing.T, r *http.Request) []byte {
	t.Helper()
	body, err := io.ReadAll(r.Body)
	assert.NoError(t, err)
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body
}

func nan() float64 { return math.NaN() }

func itoa(i int) string { return strconv.Itoa(i) }

type backoffT = backoff.Backoff
