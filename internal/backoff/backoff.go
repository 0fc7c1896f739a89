// Package backoff computes capped, jittered exponential retry delays and
// waits for them without outliving a context. One Backoff serves one retry
// loop (ORS 429/5xx retries, resumed /call streams, restarting a crashed
// vLLM replica); it is not safe for concurrent use.
package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"
)

// Backoff yields delays Base·Factor^(n-1), capped at Cap, each spread by
// ±Jitter (a fraction), for attempts n = 1, 2, ...
type Backoff struct {
	Base   time.Duration // first delay; must be > 0
	Cap    time.Duration // upper bound on any delay (0 = no cap)
	Factor float64       // growth per attempt (0 means 2)
	Jitter float64       // fraction in [0,1]: delay is scaled by a uniform factor in [1-Jitter, 1+Jitter]

	// Name labels log lines ("ors call", "vllm replica 0").
	Name string
	// Logger receives one line for each wait of at least LogOver (0: never).
	Logger  zerolog.Logger
	LogOver time.Duration

	// Sleep waits d or until ctx is done (tests inject an instant or
	// recording sleep). Nil means a real timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a uniform value in [0,1) for jitter; nil means math/rand/v2.
	Rand func() float64

	attempts int
}

// New returns a Backoff with factor 2 and no jitter.
func New(base, capDelay time.Duration) *Backoff {
	return &Backoff{Base: base, Cap: capDelay, Factor: 2, Logger: zerolog.Nop()}
}

// Attempts is the number of delays handed out since the last Reset.
func (b *Backoff) Attempts() int { return b.attempts }

// Reset starts the sequence again (call it after a success).
func (b *Backoff) Reset() { b.attempts = 0 }

// Next returns the delay for the next attempt and advances the sequence.
func (b *Backoff) Next() time.Duration {
	b.attempts++
	factor := b.Factor
	if factor <= 0 {
		factor = 2
	}
	d := float64(b.Base) * math.Pow(factor, float64(b.attempts-1))
	if b.Cap > 0 && d > float64(b.Cap) {
		d = float64(b.Cap)
	}
	if b.Jitter > 0 {
		r := rand.Float64
		if b.Rand != nil {
			r = b.Rand
		}
		d *= 1 - b.Jitter + 2*b.Jitter*r()
		if b.Cap > 0 && d > float64(b.Cap) {
			d = float64(b.Cap)
		}
	}
	if d > math.MaxInt64 {
		d = math.MaxInt64
	}
	return time.Duration(d)
}

// Wait sleeps for Next() and returns ctx's error if ctx ends first.
func (b *Backoff) Wait(ctx context.Context) error {
	d := b.Next()
	if b.LogOver > 0 && d >= b.LogOver {
		b.Logger.Info().Str("backoff", b.Name).Int("attempt", b.attempts).Float64("wait_s", d.Round(time.Millisecond).Seconds()).Msg("retrying after backoff")
	}
	sleep := b.Sleep
	if sleep == nil {
		sleep = SleepContext
	}
	return sleep(ctx, d)
}

// SleepContext waits d, or returns ctx.Err() as soon as ctx is done.
func SleepContext(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
