package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNextGrowsAndCaps(t *testing.T) {
	tests := []struct {
		name string
		b    *Backoff
		want []time.Duration
	}{
		{"ors sse policy", New(500*time.Millisecond, 10*time.Second), []time.Duration{
			500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}},
		{"plain request policy", New(time.Second, 10*time.Second), []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
		{"factor 3 no cap", &Backoff{Base: time.Millisecond, Factor: 3}, []time.Duration{time.Millisecond, 3 * time.Millisecond, 9 * time.Millisecond}},
		{"zero factor means 2", &Backoff{Base: time.Millisecond}, []time.Duration{time.Millisecond, 2 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []time.Duration
			for range tt.want {
				got = append(got, tt.b.Next())
			}
			assert.Equal(t, tt.want, got)
			assert.Equal(t, len(tt.want), tt.b.Attempts())
			tt.b.Reset()
			assert.Equal(t, tt.want[0], tt.b.Next())
		})
	}
}

func TestJitterStaysInBandAndUnderCap(t *testing.T) {
	for _, r := range []float64{0, 0.25, 0.5, 0.999} {
		b := &Backoff{Base: time.Second, Cap: 1500 * time.Millisecond, Jitter: 0.5, Rand: func() float64 { return r }}
		d1 := b.Next()
		assert.InDelta(t, float64(time.Second)*(0.5+r), float64(d1), 1, "r=%v", r)
		d2 := b.Next() // 2s before jitter, capped
		assert.LessOrEqual(t, d2, 1500*time.Millisecond)
	}
}

func TestWaitUsesInjectedSleepAndStopsOnCancel(t *testing.T) {
	var slept []time.Duration
	b := New(10*time.Millisecond, 0)
	b.Sleep = func(ctx context.Context, d time.Duration) error { slept = append(slept, d); return ctx.Err() }
	require.NoError(t, b.Wait(context.Background()))
	require.NoError(t, b.Wait(context.Background()))
	assert.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}, slept)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	real := New(time.Hour, 0)
	start := time.Now()
	require.ErrorIs(t, real.Wait(ctx), context.Canceled)
	assert.Less(t, time.Since(start), time.Second)
}

func TestSleepContext(t *testing.T) {
	require.NoError(t, SleepContext(context.Background(), 0))
	require.NoError(t, SleepContext(context.Background(), time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, SleepContext(ctx, time.Hour), context.DeadlineExceeded)
}
