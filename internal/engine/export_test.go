package engine

// Hooks for the external tests (package engine_test). They serve the vLLM
// backend from serve-engine's server, and serve imports engine, so they
// cannot be in this package.

// SyncPaused reports whether a weight sync holds new requests.
func (v *VLLM) SyncPaused() bool { return v.gate.Paused() }

// SyncDir is the root of the policy-vN directories.
func (v *VLLM) SyncDir() string { return v.opts.SyncDir }
