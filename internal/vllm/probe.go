package vllm

import (
	"context"
	"errors"
	"fmt"
)

// Needs are the server capabilities a run depends on.
type Needs struct {
	// FullSync needs the dev routes (/pause, /resume, /collective_rpc,
	// /reset_prefix_cache): VLLM_SERVER_DEV_MODE=1.
	FullSync bool
	// LoRA needs /v1/load_lora_adapter: --enable-lora and
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=1.
	LoRA bool
}

// CapabilityError says a server lacks something ortrain needs, and how to
// get it.
type CapabilityError struct {
	URL, Missing, Fix string
}

func (e *CapabilityError) Error() string {
	return fmt.Sprintf("server %s lacks %s: %s", e.URL, e.Missing, e.Fix)
}

// Probe checks that the server at c can do what a run needs: it lists the
// model, answers a one-token completion with token ids and log-probs, and
// has the weight-sync routes of needs. It returns the base model's card.
func Probe(ctx context.Context, c *Client, needs Needs) (*ModelCard, error) {
	models, err := c.Models(ctx)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", c.URL(), err)
	}
	card := models.Data[0]
	zero := 0
	seed := int64(0)
	req := &CompletionRequest{Model: card.ID, Prompt: []int32{0}, MaxTokens: 1, N: 1, Temperature: 1, TopP: 1, TopK: -1,
		RepetitionPenalty: 1, Seed: &seed, IgnoreEOS: true, Logprobs: &zero, ReturnTokenIDs: true}
	resp, err := c.Complete(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("probe %s with a one-token completion: %w", c.URL(), err)
	}
	if err := resp.Validate(1); err != nil {
		fix := "use vLLM 0.10.2 or newer, which returns token_ids when return_token_ids is set"
		var re *ResponseError
		if errors.As(err, &re) && re.Field == "logprobs.token_logprobs" {
			fix = "a completion must carry a log-prob for every sampled token (logprobs=0); this server's did not, so its samples cannot be trained on: " +
				"start vLLM with --logprobs-mode processed_logprobs (ortrain does for replicas it launches), or report the server's bug"
		}
		return nil, &CapabilityError{URL: c.URL(), Missing: "token-id completions with log-probs (" + err.Error() + ")", Fix: fix}
	}
	if needs.FullSync {
		_, err := c.IsPaused(ctx)
		if missingRoute(err) {
			return nil, &CapabilityError{URL: c.URL(), Missing: "the dev routes /is_paused, /pause, /collective_rpc",
				Fix: "start it with VLLM_SERVER_DEV_MODE=1 on vLLM 0.11 or newer (ortrain sets this for replicas it launches)"}
		}
		if err != nil {
			return nil, fmt.Errorf("probe %s /is_paused: %w", c.URL(), err)
		}
	}
	if needs.LoRA {
		err := c.UnloadLoRAAdapter(ctx, "ortrain-probe-no-such-adapter")
		if err == nil || missingRoute(err) {
			return nil, &CapabilityError{URL: c.URL(), Missing: "runtime LoRA loading (/v1/load_lora_adapter)",
				Fix: "start it with --enable-lora --max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"}
		}
	}
	return &card, nil
}

func missingRoute(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.RouteMissing || se.Code == 405)
}
