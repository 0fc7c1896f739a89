package engineserver

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Faults make serve-engine misbehave the way a broken or misconfigured vLLM
// does, quietly, so tests can check that ortrain notices. The zero value is
// a healthy server.
type Faults struct {
	// ReloadNoop: reload_weights and load_lora_adapter answer success and
	// load nothing, so the server keeps sampling the weights it started
	// with (an adapter's name samples the base model).
	ReloadNoop bool
	// NullLogprobs is the fraction of token_logprobs entries (token-id
	// completions) answered as JSON null, as vLLM does when a step has no
	// log-prob; 1 is all. Which ones follows from each sample's seed and
	// the token's index, so a test can repeat it.
	NullLogprobs float64
	// NoTokenIDs: choices carry token_ids and prompt_token_ids null even
	// when return_token_ids is set (vLLM before 0.10.2 ignored it).
	NoTokenIDs bool
	// SlowHealth delays every GET /health answer.
	SlowHealth time.Duration
}

// faultSpec is one --fault NAME[=VALUE]: its help and how it sets Faults.
type faultSpec struct {
	name, value, help string // value: "" when the fault takes none
	set               func(f *Faults, value string) error
}

var faultSpecs = []faultSpec{
	{"reload-noop", "", "reload_weights and load_lora_adapter answer success but load nothing: samples keep the start-up weights",
		func(f *Faults, _ string) error { f.ReloadNoop = true; return nil }},
	{"null-logprobs", "FRACTION", "that fraction of token_logprobs entries is null (chosen from the seed and token index; 1 = all)",
		func(f *Faults, v string) error {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x < 0 || x > 1 {
				return fmt.Errorf("want a fraction from 0 to 1, got %q", v)
			}
			f.NullLogprobs = x
			return nil
		}},
	{"no-token-ids", "", "choices carry token_ids null even when return_token_ids is set",
		func(f *Faults, _ string) error { f.NoTokenIDs = true; return nil }},
	{"slow-health", "DURATION", "GET /health answers after DURATION (e.g. 3s)",
		func(f *Faults, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return fmt.Errorf("want a duration such as 3s, got %q", v)
			}
			f.SlowHealth = d
			return nil
		}},
}

// Set turns on the fault spec names: NAME or NAME=VALUE.
func (f *Faults) Set(spec string) error {
	name, value, hasValue := strings.Cut(spec, "=")
	for _, s := range faultSpecs {
		if s.name != name {
			continue
		}
		switch {
		case s.value == "" && hasValue:
			return fmt.Errorf("fault %s takes no value, got %q", name, spec)
		case s.value != "" && !hasValue:
			return fmt.Errorf("fault %s needs a value: %s=%s", name, name, s.value)
		}
		if err := s.set(f, value); err != nil {
			return fmt.Errorf("fault %s: %w", name, err)
		}
		return nil
	}
	return fmt.Errorf("unknown fault %q: want one of %s", name, strings.Join(FaultNames(), ", "))
}

// FaultNames are the faults Set knows.
func FaultNames() []string {
	out := make([]string, len(faultSpecs))
	for i, s := range faultSpecs {
		out[i] = s.name
	}
	return out
}

// FaultHelp is one line per fault (its spelling and what it does), for
// --help.
func FaultHelp() string {
	var sb strings.Builder
	for _, s := range faultSpecs {
		name := s.name
		if s.value != "" {
			name += "=" + s.value
		}
		fmt.Fprintf(&sb, "  %-24s %s\n", name, s.help)
	}
	return sb.String()
}

// nullLogprob reports whether the null-logprobs fault blanks token i of the
// sample drawn with seed: a hash of both (splitmix64) against the fraction.
func (f Faults) nullLogprob(seed int64, i int) bool {
	switch {
	case f.NullLogprobs <= 0:
		return false
	case f.NullLogprobs >= 1:
		return true
	}
	x := uint64(seed)*0x9E3779B97F4A7C15 + uint64(i)
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return float64(x>>11)/(1<<53) < f.NullLogprobs
}

// handleHealth answers 200, after the slow-health delay if set.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if d := s.opts.Faults.SlowHealth; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}
