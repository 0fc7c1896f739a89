package vllm

import (
	"context"
	"fmt"
	"time"

	"github.com/ortrain/ortrain/internal/childproc"
)

// waitReady polls /health until 200, then reads /v1/models. It fails at once
// when the process exits, and after stall without both a healthy answer and
// any output from the child (a slow but progressing load keeps waiting).
func waitReady(ctx context.Context, p *childproc.Process, c *Client, stall, poll time.Duration) (*ModelCard, error) {
	start := time.Now()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, max(poll*5, 2*time.Second))
		err := c.Health(pctx)
		if err == nil {
			var models *ModelList
			models, err = c.Models(pctx)
			if err == nil {
				cancel()
				return &models.Data[0], nil
			}
		}
		cancel()
		last := p.LastOutput()
		if last.Before(start) {
			last = start
		}
		if time.Since(last) > stall {
			return nil, fmt.Errorf("not ready after %s (no progress for %s; last health check: %w)", time.Since(start).Round(time.Millisecond), stall, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.Done():
			return nil, p.ExitError()
		case <-tick.C:
		}
	}
}
