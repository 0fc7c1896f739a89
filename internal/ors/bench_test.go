package ors_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// BenchmarkToolCallRoundTrip measures client + kit over loopback HTTP with
// N concurrent sessions: how fast N sessions open (sessions/s), and tool-call
// round trips (calls/s) with b.N calls spread over the N sessions.
func BenchmarkToolCallRoundTrip(b *testing.B) {
	for _, n := range []int{1, 64, 1024} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			k := startKit(b, orsserver.Options{}, nil, envs.Echo())
			c := newClient(b, k.url+"/echoenvironment", ors.Options{})
			sessions := make([]*ors.Session, n)
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := c.OpenSession(context.Background(), ors.SessionSpec{Split: "train", Index: i % 4})
					if err != nil {
						errs <- err
						return
					}
					sessions[i] = s
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(b, err)
			}
			openRate := float64(n) / time.Since(start).Seconds()
			b.Cleanup(func() {
				for _, s := range sessions {
					_ = s.Close(context.Background())
				}
			})

			input := json.RawMessage(`{"text":"hello"}`)
			var next atomic.Int64
			var failures atomic.Int64
			b.ResetTimer()
			start = time.Now()
			for _, s := range sessions {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						if _, err := s.CallTool(context.Background(), "echo", input); err != nil {
							failures.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			require.Zero(b, failures.Load())
			b.ReportMetric(openRate, "sessions/s")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
			require.Equal(b, int64(n), k.srv.Stats().Live)
		})
	}
}

// TestThousandConcurrentSessions opens 1024 sessions at once through one
// client, calls a tool in each, and closes them all.
func TestThousandConcurrentSessions(t *testing.T) {
	k := startKit(t, orsserver.Options{}, nil, envs.Echo())
	c := newClient(t, k.url+"/echoenvironment", ors.Options{})
	const n = 1024
	var wg sync.WaitGroup
	var rewards atomic.Int64
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.OpenSession(context.Background(), ors.SessionSpec{Split: "train", Index: i % 4})
			if err != nil {
				errs <- err
				return
			}
			defer func() {
				if err := s.Close(context.Background()); err != nil {
					errs <- err
				}
			}()
			target := []string{"hello", "world", "trl", "openreward"}[i%4]
			out, err := s.CallTool(context.Background(), "echo", json.RawMessage(`{"text":"`+target+`"}`))
			if err != nil {
				errs <- err
				return
			}
			rewards.Add(int64(*out.Reward))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(n), rewards.Load())
	require.Equal(t, orsserver.Stats{Live: 0, Created: n, Deleted: n, ToolCalls: n}, k.srv.Stats())
}
