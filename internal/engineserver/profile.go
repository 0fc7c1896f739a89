package engineserver

import (
	"fmt"
	"strconv"
	"strings"
)

// This file is the table of vLLM versions serve-engine imitates. Every row
// comes from ../shared/docs/vllm-contract.md (the audit of what each vLLM
// version's routes accept); a behaviour that differs between versions is a
// field here, and a version is one more row. Rows are newest first.

// CurrentVLLM is the vLLM version serve-engine imitates unless told
// otherwise (Options.Version, --emulate-vllm).
const CurrentVLLM = "0.33.0"

// Profile is how one vLLM version answers where ortrain's calls depend on
// the version.
type Profile struct {
	Version string
	// Summary says how this version answers, for --help.
	Summary string
	// GuardedPrefixes are the paths --api-key guards (vLLM's
	// AuthenticationMiddleware); every other path answers without the key.
	GuardedPrefixes []string
	// PauseModes: /pause reads ?mode=abort|wait|keep. Without it /pause
	// reads only wait_for_inflight_requests (default false: abort in-flight
	// requests) and always clears the cache.
	PauseModes bool
	// PauseNeedsDevMode: /pause, /resume and /is_paused are dev routes
	// (VLLM_SERVER_DEV_MODE=1). Without it they are always attached, while
	// /collective_rpc and /reset_prefix_cache still need dev mode.
	PauseNeedsDevMode bool
	// ReloadTakesPath: Worker.reload_weights forwards kwargs (weights_path)
	// to the model runner, which then keeps that path as its model. Without
	// it reload_weights takes no argument: one is a Python TypeError (HTTP
	// 500), and a call re-reads the model the server started with.
	ReloadTakesPath bool
}

var profiles = []Profile{
	// Current: the stable serve/middleware/authenticate.py GUARDED_PREFIX;
	// the dev rlhf router (@0100a212) with PauseMode; layerwise
	// reload_weights(weights_path=...).
	{Version: "0.33.0", Summary: "/pause takes mode=abort|wait|keep; reload_weights takes weights_path; every dev route needs dev mode",
		GuardedPrefixes: []string{"/v1", "/v2", "/inference", "/cohere"},
		PauseModes:      true, PauseNeedsDevMode: true, ReloadTakesPath: true},
	// v0.14.0 docs: the auth middleware skips paths outside /v1; the rlhf
	// router is attached without dev mode and its /pause has no mode;
	// gpu_worker.py @35d5cda1 defines reload_weights(self).
	{Version: "0.14.0", Summary: "/pause ignores mode and aborts; /pause, /resume, /is_paused need no dev mode; " +
		"reload_weights takes no arguments (weights_path: HTTP 500) and re-reads the model it started with; the key guards /v1 only",
		GuardedPrefixes: []string{"/v1"}},
}

// Versions are the vLLM versions serve-engine can imitate, newest first.
func Versions() []string {
	out := make([]string, len(profiles))
	for i, p := range profiles {
		out[i] = p.Version
	}
	return out
}

// ProfileHelp is one line per version (its summary), for --help.
func ProfileHelp() string {
	var sb strings.Builder
	for _, p := range profiles {
		fmt.Fprintf(&sb, "  %-10s %s\n", p.Version, p.Summary)
	}
	return sb.String()
}

// LookupProfile returns the profile of version ("" is CurrentVLLM).
func LookupProfile(version string) (Profile, error) {
	if version == "" {
		version = CurrentVLLM
	}
	for _, p := range profiles {
		if p.Version == version {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("vLLM version %q is not one serve-engine imitates: want one of %s", version, strings.Join(Versions(), ", "))
}

// guards reports whether the API key is required on path.
func (p Profile) guards(path string) bool {
	for _, prefix := range p.GuardedPrefixes {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}
	return false
}

// ReadVLLMEnv sets DevMode, RuntimeLoRA and (when empty) APIKey from the
// variables vLLM reads, parsed as vLLM's envs.py parses them, so a launch
// environment means the same to serve-engine as to vLLM.
func (o *Options) ReadVLLMEnv(getenv func(string) string) error {
	if v := strings.TrimSpace(getenv("VLLM_SERVER_DEV_MODE")); v != "" {
		n, err := strconv.Atoi(v) // bool(int(...)): "true" is an error there too
		if err != nil {
			return fmt.Errorf("VLLM_SERVER_DEV_MODE=%q: want an integer (1: dev routes on, 0: off)", v)
		}
		o.DevMode = n != 0
	}
	switch strings.ToLower(strings.TrimSpace(getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))) {
	case "1", "true":
		o.RuntimeLoRA = true
	}
	if o.APIKey == "" {
		o.APIKey = getenv("VLLM_API_KEY")
	}
	return nil
}
