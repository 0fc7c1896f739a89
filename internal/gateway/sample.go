package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
)

// samplingFields are the request fields both endpoints share; pointers
// tell "absent" (the default applies) from zero.
type samplingFields struct {
	MaxTokens   *int            `json:"max_tokens"`
	Temperature *float64        `json:"temperature"`
	TopP        *float64        `json:"top_p"`
	TopK        *int            `json:"top_k"` // vLLM extension
	MinP        *float64        `json:"min_p"` // vLLM extension
	Stop        json.RawMessage `json:"stop"`
	N           *int            `json:"n"`
	Seed        *int64          `json:"seed"`
}

// sampleSpec is one generation, checked and with defaults applied.
type sampleSpec struct {
	kind      CallKind
	promptIDs []int32
	maxTokens int
	sampling  engine.SamplingParams
	// overridden: ForceSampling replaced what the request asked for.
	overridden bool
	// seed is the request's own seed (0: none); seedOverridden:
	// ForceSampling replaced it with the rollout's (callSeed).
	seed           int64
	seedOverridden bool
	stops          []string
	// skipSpecial: decode without special tokens (text completions, as
	// vLLM returns them); chat keeps them so tool-call tags can be parsed.
	skipSpecial bool
}

// maxStops bounds the stop strings of one request.
const maxStops = 16

// resolve checks the shared fields and fills a spec for promptIDs.
// maxTokens is the requested budget (nil: the default) read from the field
// maxParam; promptParam names the field a too-long prompt is blamed on.
func (g *Gateway) resolve(f *samplingFields, maxTokens *int, maxParam string, promptIDs []int32, promptParam string) (sampleSpec, *apiError) {
	spec := sampleSpec{promptIDs: promptIDs, maxTokens: g.opts.Defaults.MaxTokens, sampling: g.opts.Defaults.Sampling}
	if f.N != nil && *f.N != 1 {
		return spec, badRequest("n", "n=%d: this server samples one choice per request (n=1); send %d requests instead", *f.N, *f.N)
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return spec, badRequest(maxParam, "%s must be at least 1, got %d", maxParam, *maxTokens)
		}
		spec.maxTokens = *maxTokens
	}
	if c := g.opts.Defaults.MaxTokensCap; c > 0 && spec.maxTokens > c {
		spec.maxTokens = c
	}
	if m := g.opts.MaxModelLen; m > 0 {
		if len(promptIDs) >= m {
			e := badRequest(promptParam, "the prompt is %d tokens, which leaves no room for a completion in this model's %d-token context",
				len(promptIDs), m)
			e.code = "context_length_exceeded"
			return spec, e
		}
		spec.maxTokens = min(spec.maxTokens, m-len(promptIDs))
	}
	if v := f.Temperature; v != nil {
		if math.IsNaN(*v) || *v < 0 || math.IsInf(*v, 0) {
			return spec, badRequest("temperature", "temperature must be a finite number >= 0, got %v", *v)
		}
		spec.sampling.Temperature = *v
	}
	if v := f.TopP; v != nil {
		if !(*v > 0 && *v <= 1) {
			return spec, badRequest("top_p", "top_p must be in (0, 1], got %v", *v)
		}
		spec.sampling.TopP = *v
	}
	if v := f.TopK; v != nil {
		if *v < -1 {
			return spec, badRequest("top_k", "top_k must be -1 or 0 (off) or at least 1, got %d", *v)
		}
		spec.sampling.TopK = max(*v, 0)
	}
	if v := f.MinP; v != nil {
		if !(*v >= 0 && *v <= 1) {
			return spec, badRequest("min_p", "min_p must be in [0, 1], got %v", *v)
		}
		spec.sampling.MinP = *v
	}
	if g.opts.Defaults.ForceSampling {
		spec.overridden = spec.sampling != g.opts.Defaults.Sampling
		spec.sampling = g.opts.Defaults.Sampling
	}
	if f.Seed != nil {
		if g.opts.Defaults.ForceSampling {
			// A trainer's rollouts of one task must differ: an agent that
			// sends one seed every time would make a group identical.
			spec.seedOverridden = true
		} else {
			spec.seed = *f.Seed
		}
	}
	stops, err := parseStop(f.Stop)
	if err != nil {
		return spec, err
	}
	spec.stops = stops
	return spec, nil
}

// parseStop reads "stop": absent, null, a string, or a list of strings.
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("stop", "stop must be a string or a list of strings")
	}
	if len(list) > maxStops {
		return nil, badRequest("stop", "stop has %d strings; at most %d are allowed", len(list), maxStops)
	}
	for i, s := range list {
		if s == "" {
			return nil, badRequest("stop", "stop[%d] is empty", i)
		}
	}
	return list, nil
}

// sampled is a completion after stop strings were applied, with what its
// record needs.
type sampled struct {
	ids      []int32
	logprobs []float32
	text     string // decoded; ends before a stop string that cut it
	finish   string // "stop" or "length"

	seq        int // dispatch position in the recorder
	seed       int64
	version    int
	start, end time.Time
}

// sample runs one generation for a tenant. The caller records it with
// record once the reply is parsed (the finish reason "tool_calls" is known
// only then).
func (g *Gateway) sample(ctx context.Context, ro *rollout, spec sampleSpec) (sampled, *apiError) {
	var out sampled
	if ro.rec != nil {
		out.seq = ro.rec.dispatch()
	}
	out.version = g.weightVersion()
	if ro.version != nil {
		out.version = *ro.version
	}
	out.start = g.opts.Now()
	seed := spec.seed
	if seed == 0 {
		seed = callSeed(ro.seed, out.seq)
	}
	out.seed = seed
	genCtx, cancel := context.WithTimeout(ro.generationContext(ctx), g.opts.CallTimeout)
	defer cancel()
	res, err := g.opts.Sampler.Generate(genCtx, engine.Request{
		PromptIDs: spec.promptIDs, MaxTokens: spec.maxTokens, Sampling: spec.sampling,
		StopIDs: g.endIDs, Seed: seed, SessionKey: ro.id,
	})
	out.end = g.opts.Now()
	if err != nil {
		return out, generateError(ctx, genCtx, err)
	}
	if len(res.Logprobs) != len(res.IDs) {
		return out, serverError("the engine returned %d log-probs for %d tokens", len(res.Logprobs), len(res.IDs))
	}
	out.ids, out.logprobs, out.finish = res.IDs, res.Logprobs, res.StopReason.String()
	if keep, text, cut := cutAtStop(g.opts.Tokenizer, res.IDs, spec.stops, spec.skipSpecial); cut {
		out.ids, out.logprobs, out.text, out.finish = res.IDs[:keep], res.Logprobs[:keep], text, "stop"
	} else {
		out.text = text
	}
	return out, nil
}

// record stores a served call in the tenant's recorder and logs it.
func (g *Gateway) record(ro *rollout, spec sampleSpec, s sampled, finish string, malformed int) {
	g.log.Debug().Str("rollout", ro.id).Str("kind", string(spec.kind)).Int("prompt_tokens", len(spec.promptIDs)).
		Int("completion_tokens", len(s.ids)).Str("finish", finish).Int("weight_version", s.version).
		Float64("took_s", s.end.Sub(s.start).Round(time.Millisecond).Seconds()).Msg("served")
	if ro.rec == nil {
		return
	}
	ro.rec.add(s.seq, Call{Kind: spec.kind, PromptIDs: spec.promptIDs, CompletionIDs: s.ids, Logprobs: s.logprobs,
		WeightVersion: s.version, FinishReason: finish, MalformedToolCalls: malformed, Sampling: spec.sampling,
		SamplingOverridden: spec.overridden, Seed: s.seed, SeedOverridden: spec.seedOverridden, Start: s.start, End: s.end})
}

// callSeed is the seed of a tenant's call number seq (from 1): a mix of the
// rollout's base seed and seq (splitmix64's finalizer), never 0, so every
// call of every rollout samples with its own seed and a rerun with the same
// base samples the same. base 0 (the single tenant) gives 0: the backend
// draws a seed, as vLLM does for a request without one.
func callSeed(base int64, seq int) int64 {
	if base == 0 {
		return 0
	}
	z := uint64(base) + uint64(seq)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	s := int64(z &^ (1 << 63)) // non-negative: every backend takes it
	if s == 0 {
		s = 1
	}
	return s
}

// generateError classifies a failed generation: the rollout was closed
// (404), the client went away (499, nginx's "client closed request"; the
// agent's doing, so it counts as a rejection), the generation ran out of
// time (504), or the engine failed (500).
func generateError(reqCtx, genCtx context.Context, err error) *apiError {
	switch {
	case errors.Is(context.Cause(reqCtx), ErrRolloutClosed):
		return notFound("rollout_not_found", "the rollout was closed while this call ran")
	case reqCtx.Err() != nil:
		return &apiError{status: statusClientClosed, typ: "invalid_request_error", message: "the client closed the request before the completion was ready"}
	case errors.Is(genCtx.Err(), context.DeadlineExceeded):
		return &apiError{status: http.StatusGatewayTimeout, typ: "server_error", message: "generation timed out: " + err.Error()}
	}
	var invalid *engine.InvalidResultError
	if errors.As(err, &invalid) {
		return &apiError{status: http.StatusBadGateway, typ: "server_error", code: codeGenerationInvalid, message: "generation failed: " + err.Error()}
	}
	return serverError("generation failed: %v", err)
}

// codeGenerationInvalid marks a call whose completion the generation server
// left without log-probs or token ids (engine.InvalidResultError): the
// recorder counts it apart, so the rollout ends generation_invalid.
const codeGenerationInvalid = "generation_invalid"

// statusClientClosed is nginx's status for a request its client abandoned.
const statusClientClosed = 499

// cutAtStop finds the first token at which one of stops appears in the
// decoded completion. It returns how many ids to keep (through the token
// completing the stop string) and the text before the stop string; without
// a stop it returns every id and the whole text.
func cutAtStop(tok *chat.Tokenizer, ids []int32, stops []string, skipSpecial bool) (keep int, text string, cut bool) {
	if len(stops) == 0 {
		return len(ids), tok.Decode(ids, skipSpecial), false
	}
	longest := 0
	for _, s := range stops {
		longest = max(longest, len(s))
	}
	dec := tok.NewStreamDecoder(skipSpecial)
	var acc strings.Builder
	for i, id := range ids {
		before := acc.Len()
		acc.WriteString(dec.Next(id))
		if acc.Len() == before {
			continue
		}
		// Only a match ending in the new text is new.
		text := acc.String()
		from := max(0, before-longest+1)
		best := -1
		for _, s := range stops {
			if j := strings.Index(text[from:], s); j >= 0 && (best < 0 || from+j < best) {
				best = from + j
			}
		}
		if best >= 0 {
			return i + 1, text[:best], true
		}
	}
	return len(ids), tok.Decode(ids, skipSpecial), false
}
