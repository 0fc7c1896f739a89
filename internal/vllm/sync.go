package vllm

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ReloadFull pushes the HF safetensors in dir to one server: pause (draining
// in-flight requests so every sample comes from one version), reload on
// every worker, drop the prefix cache computed with the old weights, resume.
// A failure leaves the server paused: it must not serve stale weights; the
// supervisor or the caller restarts it.
func ReloadFull(ctx context.Context, c *Client, dir string, rpcTimeout time.Duration) error {
	steps := []struct {
		name string
		do   func() error
	}{
		{"pause", func() error { return c.Pause(ctx, PauseWait) }},
		{"reload_weights", func() error { return c.ReloadWeights(ctx, dir, rpcTimeout) }},
		{"reset_prefix_cache", func() error { return c.ResetPrefixCache(ctx) }},
		{"resume", func() error { return c.Resume(ctx) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("sync weights to %s: %s: %w", c.URL(), s.name, err)
		}
	}
	return nil
}

// LoadAdapter loads the PEFT adapter in dir under name on one server; the
// caller then sends requests with model=name.
func LoadAdapter(ctx context.Context, c *Client, name, dir string) error {
	if err := c.LoadLoRAAdapter(ctx, name, dir); err != nil {
		return fmt.Errorf("load adapter %s from %s into %s: %w", name, dir, c.URL(), err)
	}
	return nil
}

// UnloadAdapter drops an adapter; an adapter the server no longer has (it
// restarted) is not an error.
func UnloadAdapter(ctx context.Context, c *Client, name string) error {
	err := c.UnloadLoRAAdapter(ctx, name)
	var se *StatusError
	if errors.As(err, &se) && se.Code == 404 && !se.RouteMissing {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unload adapter %s from %s: %w", name, c.URL(), err)
	}
	return nil
}
