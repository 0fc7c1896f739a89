package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/vllm"
)

// SyncCheck verifies weight pushes: after each one, every server samples
// a short completion of a fixed prompt and its log-probs are compared with
// the trainer's for the same tokens. A server that answered the reload
// with success but kept the old weights (an older vLLM, a broken loader)
// would otherwise go on sampling from a stale policy, with nothing but a
// metric to show it.
type SyncCheck struct {
	// Prompt is the probe's prompt: token ids of the model's vocabulary.
	Prompt []int32
	// Tokens is how many tokens the probe samples (default 16).
	Tokens int
	// Score returns the trainer's log-probs of completion after prompt with
	// its current weights, at temperature 1.
	Score func(ctx context.Context, prompt, completion []int32) ([]float32, error)
}

// The sync check's tolerance is learnt from the first push, when server
// and trainer hold the same weights: servers that then agree to 1e-5
// (same dtype and kernels) are held to a tight bound, half-precision
// servers that differ by a few hundredths to a looser one.
const (
	minTolerance   = 2e-3 // float32 kernels differ by ~1e-5; a training step moves more
	halfTolerance  = 5e-2 // what bfloat16 or float16 inference alone can differ by
	noiseScale     = 50   // a bound of 50× the initial noise, between the two
	noiseAllowance = 4    // plus 4× the initial noise itself
)

// probeSeed fixes the probe's sample, so its answers are comparable run to
// run.
const probeSeed = 0x5eed

// ProbeResult is one server's answer to the sync probe.
type ProbeResult struct {
	URL      string
	Tokens   int
	MeanDiff float64 // mean |server − trainer| log-prob over the probe's tokens
	MaxDiff  float64
}

// StaleWeightsError: after a push that the server acknowledged, its
// log-probs are not the trainer's: it is still serving older weights (or
// never loaded these).
type StaleWeightsError struct {
	URL           string
	ServerVersion string // vLLM's /version ("" when it has none)
	Step, Version int
	Model         string
	MeanDiff      float64
	Tolerance     float64
	LoRA          bool
}

func (e *StaleWeightsError) Error() string {
	what := "reload_weights"
	if e.LoRA {
		what = "load_lora_adapter " + e.Model
	}
	return fmt.Sprintf("%s%s is still serving older weights than step %d's (policy-v%d): it answered %s with success, "+
		"but its log-probs of a fixed probe differ from the trainer's by %.3g on average (tolerance %.3g). "+
		"Training on its samples would train the wrong policy, so the run stops. Check that this vLLM re-reads the weights it is given "+
		"(see the README's vLLM version table), or use a version ortrain supports",
		e.URL, versionSuffix(e.ServerVersion), e.Step, e.Version, what, e.MeanDiff, e.Tolerance)
}

func versionSuffix(v string) string {
	if v == "" {
		return ""
	}
	return " (vLLM " + v + ")"
}

// probeServer samples the probe on one server under model and compares its
// log-probs with the trainer's.
func probeServer(ctx context.Context, c *vllm.Client, model string, chk *SyncCheck) (ProbeResult, error) {
	zero, seed := 0, int64(probeSeed)
	tokens := chk.Tokens
	if tokens <= 0 {
		tokens = 16
	}
	req := &vllm.CompletionRequest{Model: model, Prompt: chk.Prompt, MaxTokens: tokens, N: 1, Temperature: 1, TopP: 1, TopK: -1,
		RepetitionPenalty: 1, Seed: &seed, StopTokenIDs: []int32{}, Stop: []string{}, IgnoreEOS: true, Logprobs: &zero, ReturnTokenIDs: true}
	resp, err := c.Complete(ctx, req)
	if err != nil {
		return ProbeResult{}, fmt.Errorf("sync probe on %s: %w", c.URL(), err)
	}
	if err := resp.Validate(1); err != nil {
		return ProbeResult{}, &InvalidResultError{Server: c.URL(), Request: describeRequest(req, "") + " (the sync probe)", Err: err}
	}
	ch := resp.Choices[0]
	trainer, err := chk.Score(ctx, chk.Prompt, ch.TokenIDs)
	if err != nil {
		return ProbeResult{}, fmt.Errorf("sync probe: the trainer's log-probs: %w", err)
	}
	server := make([]float64, len(ch.TokenIDs))
	for i, lp := range ch.Logprobs.TokenLogprobs {
		server[i] = *lp
	}
	mean, mx, err := logpDiff(server, trainer)
	if err != nil {
		return ProbeResult{}, fmt.Errorf("sync probe on %s: %w", c.URL(), err)
	}
	return ProbeResult{URL: c.URL(), Tokens: len(server), MeanDiff: mean, MaxDiff: mx}, nil
}

// logpDiff is the mean and max |a−b| over two log-prob sequences.
func logpDiff(server []float64, trainer []float32) (mean, mx float64, err error) {
	if len(server) != len(trainer) {
		return 0, 0, fmt.Errorf("the server scored %d tokens, the trainer %d", len(server), len(trainer))
	}
	if len(server) == 0 {
		return 0, 0, errors.New("the server sampled no tokens")
	}
	for i := range server {
		d := math.Abs(server[i] - float64(trainer[i]))
		if math.IsNaN(d) {
			return 0, 0, fmt.Errorf("token %d: log-prob NaN (server %v, trainer %v)", i, server[i], trainer[i])
		}
		mean += d
		mx = max(mx, d)
	}
	return mean / float64(len(server)), mx, nil
}

// syncTolerance is the mean |Δ log p| a server may show after a push,
// given what it showed with the same weights (noise).
func syncTolerance(noise float64) float64 {
	return max(minTolerance, min(halfTolerance, noiseScale*noise)) + noiseAllowance*noise
}

// verifyPush probes every ready server after version's push; the first
// one that does not serve the trainer's weights fails the sync.
func (v *VLLM) verifyPush(ctx context.Context, step, version int, model string) (float64, error) {
	chk := v.opts.Check
	worst := 0.0
	tol := syncTolerance(v.noise)
	for _, ep := range v.opts.Endpoints {
		if !ep.Ready() {
			continue // restarting: its restart hook pushes the newest weights
		}
		c, err := v.client(ep)
		if err != nil {
			return worst, err
		}
		res, err := probeServer(ctx, c, model, chk)
		if err != nil {
			return worst, err
		}
		worst = max(worst, res.MeanDiff)
		if res.MeanDiff > tol {
			return worst, &StaleWeightsError{URL: c.URL(), ServerVersion: v.serverVersions[ep.URL()], Step: step, Version: version, Model: model,
				MeanDiff: res.MeanDiff, Tolerance: tol, LoRA: v.opts.SyncMode == SyncLoRA}
		}
	}
	return worst, nil
}

// maxInitialDiff: with the same weights, a server whose log-probs differ
// from the trainer's by more than this on average serves another model
// (a different checkpoint, tokenizer or revision), whatever its dtype.
const maxInitialDiff = 0.5

// firstPush exercises the whole weight-sync path once, with the trainer's
// initial weights, before any rollout: a server that cannot take weights
// (dev routes missing, an older vLLM's reload_weights without weights_path,
// runtime LoRA off) fails the start with the fix, not after a round and a
// step were spent. Its probe measures how far server and trainer differ
// when they hold the same weights, the noise later checks allow for.
func (v *VLLM) firstPush(ctx context.Context) error {
	if v.opts.SyncMode == SyncNone || v.opts.Follower {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, v.opts.SyncTimeout)
	defer cancel()
	v.syncMu.Lock()
	defer v.syncMu.Unlock()
	dir, err := v.export(ctx, 0)
	if err != nil {
		return fmt.Errorf("push the initial weights: %w", err)
	}
	name := v.Model()
	if v.opts.SyncMode == SyncLoRA {
		name = "policy-v0"
	}
	for _, ep := range v.opts.Endpoints {
		c, err := v.client(ep)
		if err != nil {
			return err
		}
		if err := v.apply(ctx, c, name, dir); err != nil {
			if v.opts.SyncMode == SyncFull {
				// Still the weights it started with: a server shared with
				// others must not stay paused because this run cannot use it.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				_ = c.Resume(rctx)
				cancel()
			}
			return v.explainSyncFailure(ep.URL(), err)
		}
	}
	v.latest = dir
	if v.opts.SyncMode == SyncLoRA {
		v.adapter = name
	}
	v.mu.Lock()
	v.model = name
	v.mu.Unlock()
	if v.opts.Check == nil {
		return nil
	}
	for _, ep := range v.opts.Endpoints {
		c, err := v.client(ep)
		if err != nil {
			return err
		}
		res, err := probeServer(ctx, c, name, v.opts.Check)
		if err != nil {
			return fmt.Errorf("check the initial weights: %w", err)
		}
		if res.MeanDiff > maxInitialDiff {
			return fmt.Errorf("%s%s does not serve the trainer's model: with the same weights its log-probs of a fixed probe differ from the trainer's by %.3g on average "+
				"(at most %.3g is a dtype difference); give vLLM the same model directory (and revision) as the trainer",
				c.URL(), versionSuffix(v.serverVersions[ep.URL()]), res.MeanDiff, maxInitialDiff)
		}
		v.noise = max(v.noise, res.MeanDiff)
	}
	v.opts.Logger.Info().Float64("logp_difference", v.noise).Float64("tolerance", syncTolerance(v.noise)).
		Msg("weight sync checked with the initial weights: every push is verified against the trainer's log-probs")
	return nil
}

// explainSyncFailure names what a server lacks when the first push fails,
// with its version and the fix.
func (v *VLLM) explainSyncFailure(url string, err error) error {
	version := v.serverVersions[url]
	var se *vllm.StatusError
	errors.As(err, &se)
	switch {
	case se != nil && se.RouteMissing:
		return &vllm.CapabilityError{URL: url, Missing: "the route " + routeOf(se.URL) + versionSuffix(version) + " (" + err.Error() + ")",
			Fix: "full-weight sync needs the dev routes: start vLLM with VLLM_SERVER_DEV_MODE=1 (ortrain sets it for replicas it launches); " +
				"LoRA needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1; see the README's vLLM version table"}
	case se != nil && strings.Contains(se.Message, "weights_path"):
		return &vllm.CapabilityError{URL: url, Missing: "reload_weights(weights_path=...)" + versionSuffix(version) + " (" + err.Error() + ")",
			Fix: "this vLLM reloads only the weights it started with; use a vLLM whose reload_weights takes weights_path (see the README's vLLM version table), " +
				"or train a LoRA adapter (grpo.lora.enabled: true), which loads through /v1/load_lora_adapter"}
	}
	return fmt.Errorf("push the initial weights to %s%s: %w", url, versionSuffix(version), err)
}

// routeOf is the path of a request URL (a StatusError's URL).
func routeOf(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		u = u[i+3:]
	}
	if i := strings.Index(u, "/"); i >= 0 {
		return u[i:]
	}
	return u
}
