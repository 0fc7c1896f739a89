package engineserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/vllm"
)

// This file is the control side of the server: the dev routes (pause,
// weight reload, cache reset) and the runtime LoRA routes, attached only
// where the imitated vLLM attaches them.

// controlRoutes registers the routes vLLM attaches only with dev mode or
// runtime LoRA updating; an absent route answers FastAPI's 404.
func (s *Server) controlRoutes() {
	if s.opts.DevMode || !s.profile.PauseNeedsDevMode {
		s.mux.HandleFunc("POST /pause", s.handlePause)
		s.mux.HandleFunc("POST /resume", s.handleResume)
		s.mux.HandleFunc("GET /is_paused", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, vllm.IsPausedResponse{IsPaused: s.gate.Paused()})
		})
	}
	if s.opts.DevMode {
		s.mux.HandleFunc("POST /collective_rpc", s.handleCollectiveRPC)
		s.mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) {
			// The builtin engine keeps no KV cache across requests: nothing
			// computed with old weights survives a reload.
			w.WriteHeader(http.StatusOK)
		})
	}
	if s.opts.LoRA && s.opts.RuntimeLoRA {
		s.mux.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLoRA)
		s.mux.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLoRA)
	}
}

func (s *Server) handlePause(w http.ResponseWriter, r *http.Request) {
	mode, err := s.pauseMode(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// clear_cache (on by default, always on without modes) has nothing to
	// clear: the builtin engine keeps no KV cache across requests.
	if err := s.gate.Pause(r.Context(), mode); err != nil {
		writeError(w, http.StatusInternalServerError, "pause: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, vllm.PauseResponse{Status: "paused"})
}

// pauseMode is the pause mode a request asks for, as the imitated version
// reads it: ?mode=, or (before modes) only wait_for_inflight_requests.
func (s *Server) pauseMode(r *http.Request) (string, error) {
	q := r.URL.Query()
	if !s.profile.PauseModes {
		if queryBool(q.Get("wait_for_inflight_requests")) {
			return vllm.PauseWait, nil
		}
		return vllm.PauseAbort, nil
	}
	mode := q.Get("mode")
	switch mode {
	case "":
		return vllm.PauseAbort, nil
	case vllm.PauseAbort, vllm.PauseWait, vllm.PauseKeep:
		return mode, nil
	}
	return "", fmt.Errorf("mode %q: want abort, wait or keep", mode)
}

// queryBool reads a query flag the way FastAPI parses a bool.
func queryBool(v string) bool {
	switch strings.ToLower(v) {
	case "1", "true", "on", "yes":
		return true
	}
	return false
}

func (s *Server) handleResume(w http.ResponseWriter, r *http.Request) {
	s.gate.Resume()
	writeJSON(w, http.StatusOK, vllm.PauseResponse{Status: "resumed"})
}

func (s *Server) handleCollectiveRPC(w http.ResponseWriter, r *http.Request) {
	var req vllm.CollectiveRPCRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if req.Method != "reload_weights" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("method %q: serve-engine implements only reload_weights", req.Method))
		return
	}
	dir, err := s.reloadDir(&req)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	ok := vllm.CollectiveRPCResponse{Results: []json.RawMessage{json.RawMessage("null")}}
	if s.opts.Faults.ReloadNoop {
		writeJSON(w, http.StatusOK, ok) // silent, as a broken server would be
		return
	}
	ctx := r.Context()
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.Timeout*float64(time.Second)))
		defer cancel()
	}
	start := time.Now()
	if err := s.backend.ReloadWeights(ctx, dir); err != nil {
		writeError(w, http.StatusInternalServerError, "reload_weights: "+err.Error())
		return
	}
	if s.profile.ReloadTakesPath {
		s.mu.Lock()
		s.weightsPath = dir // the runner keeps weights_path as its model
		s.mu.Unlock()
	}
	s.opts.Logger.Info().Str("dir", dir).Float64("took_s", time.Since(start).Round(time.Millisecond).Seconds()).Msg("reloaded weights")
	writeJSON(w, http.StatusOK, ok)
}

// reloadDir is the directory a reload_weights call reads, or the TypeError
// the imitated version's Python raises for the call's arguments.
func (s *Server) reloadDir(req *vllm.CollectiveRPCRequest) (string, error) {
	s.mu.Lock()
	dir := s.weightsPath
	s.mu.Unlock()
	names := make([]string, 0, len(req.Kwargs))
	for k := range req.Kwargs {
		names = append(names, k)
	}
	slices.Sort(names)
	if !s.profile.ReloadTakesPath {
		// Worker.reload_weights(self) re-reads the model it started with.
		switch {
		case len(names) > 0:
			return "", fmt.Errorf("TypeError: Worker.reload_weights() got an unexpected keyword argument '%s'", names[0])
		case len(req.Args) > 0:
			return "", fmt.Errorf("TypeError: Worker.reload_weights() takes 1 positional argument but %d were given", len(req.Args)+1)
		}
		return dir, nil
	}
	if len(req.Args) > 0 {
		return "", fmt.Errorf("reload_weights: serve-engine takes weights_path as a keyword argument only, got %d positional", len(req.Args))
	}
	for _, k := range names {
		if k != "weights_path" && k != "is_checkpoint_format" {
			return "", fmt.Errorf("TypeError: GPUModelRunner.reload_weights() got an unexpected keyword argument '%s'", k)
		}
	}
	if p, ok := req.Kwargs["weights_path"].(string); ok && p != "" {
		dir = p
	}
	return dir, nil
}

func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req vllm.LoadLoRARequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.LoRAName == "" || req.LoRAPath == "" {
		writeError(w, http.StatusBadRequest, "Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	s.mu.Lock()
	_, exists := s.adapters[req.LoRAName]
	s.mu.Unlock()
	if exists && !req.LoadInplace {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", req.LoRAName))
		return
	}
	if !s.opts.Faults.ReloadNoop {
		if err := s.backend.LoadAdapter(r.Context(), req.LoRAName, req.LoRAPath); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	s.mu.Lock()
	s.adapters[req.LoRAName] = req.LoRAPath
	s.mu.Unlock()
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.LoRAName))
}

func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req vllm.UnloadLoRARequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.LoRAName == "" {
		writeError(w, http.StatusBadRequest, "'lora_name' must be provided.")
		return
	}
	s.mu.Lock()
	_, ok := s.adapters[req.LoRAName]
	delete(s.adapters, req.LoRAName)
	b := s.batchers[req.LoRAName]
	delete(s.batchers, req.LoRAName)
	s.forgetGateway(req.LoRAName)
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoRAName))
		return
	}
	if b != nil {
		b.Close()
	}
	if err := s.backend.UnloadAdapter(r.Context(), req.LoRAName); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.LoRAName))
}
