package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/backoff"
	"github.com/ortrain/ortrain/internal/vllm"
)

// SyncMode says how new weights reach the vLLM servers.
type SyncMode int

const (
	// SyncFull writes HF safetensors and reloads them on every server
	// (/pause → /collective_rpc reload_weights → /reset_prefix_cache → /resume).
	SyncFull SyncMode = iota
	// SyncLoRA writes a PEFT adapter and loads it as policy-vN.
	SyncLoRA
	// SyncNone never pushes weights (a frozen sampler, e.g. evaluation).
	SyncNone
)

// WeightExporter writes the trainer's current weights into dir (which
// exists and is empty): HF-named safetensors for SyncFull, a PEFT adapter
// directory (adapter_config.json + adapter_model.safetensors) for SyncLoRA.
type WeightExporter func(ctx context.Context, dir string) error

// SyncStats describe the last weight sync (its duration is a run metric).
type SyncStats struct {
	Step     int
	Version  int
	Dir      string
	Model    string // the name requests use now (base model or adapter)
	Duration time.Duration
	// ProbeDiff is the largest mean |Δ log p| of the sync probe between a
	// server and the trainer (Probed: the push was verified).
	ProbeDiff float64
	Probed    bool
}

// VLLMOptions describe one vLLM setup: which servers generate (endpoints
// given as they are, URLs of servers someone else runs, or replicas to
// launch and supervise) and how weights reach them. train builds it from
// the config (engine.*).
type VLLMOptions struct {
	// Endpoints are used as they are, with their own readiness.
	Endpoints []vllm.Endpoint
	// URLs of servers someone else runs (engine.vllm_urls).
	URLs []string
	// Launch, GPUs and the rest describe supervised replicas, launched when
	// neither Endpoints nor URLs is given.
	Launch         vllm.LaunchConfig
	GPUs           vllm.GPUPlan
	BasePort       int // 0: free ports
	LogDir         string
	StartupTimeout time.Duration
	MaxRestarts    int
	StopGrace      time.Duration
	OnEvent        func(vllm.Event)

	// SyncMode, SyncDir (root of policy-vN directories; /dev/shm is a good
	// place) and Export say how SyncWeights pushes weights.
	SyncMode SyncMode
	SyncDir  string
	Export   WeightExporter
	// SyncTimeout bounds one SyncWeights (default 10 minutes).
	SyncTimeout time.Duration
	// KeepVersions is how many policy-vN directories stay on disk (default 2).
	KeepVersions int
	// Follower: another process (rank 0 of a data-parallel run) pushes
	// the weights to these replicas; SyncWeights only moves this backend
	// to the version that process pushed (the LoRA adapter's name), and
	// must run after it.
	Follower bool
	// Timeout bounds one Generate, retries included, when ctx has no
	// earlier deadline (default 5 minutes).
	Timeout time.Duration
	// RetryBase and RetryCap shape retries after 5xx, connection loss or a
	// restarting replica (defaults 100ms, 2s).
	RetryBase, RetryCap time.Duration
	HTTPClient          *http.Client
	// APIKey is sent as a Bearer token to every server (launched replicas
	// get it as VLLM_API_KEY through Launch.APIKey). Never logged.
	APIKey string
	// Router shapes session affinity and failover.
	Router RouterOptions
	// Check verifies every push against the trainer's log-probs (nil: not
	// verified; followers never verify, the leader does).
	Check  *SyncCheck
	Logger zerolog.Logger
}

// VLLM generates through vLLM's /v1/completions with token ids in and out.
// All turns of a rollout (Request.SessionKey) go to one replica, chosen by
// rendezvous hash among the healthy, not overloaded ones, so its prefix
// cache is reused; requests are retried elsewhere on 5xx or connection
// loss, so a replica restart or death does not fail a step. SyncWeights holds new requests until the new weights are
// live everywhere.
type VLLM struct {
	opts       VLLMOptions
	router     *router
	gate       *vllm.PauseGate
	stopSup    func()
	supervisor *vllm.Supervisor

	// serial admits one SyncWeights at a time; syncMu orders the pushes of
	// SyncWeights and of the restart hook.
	serial  sync.Mutex
	syncMu  sync.Mutex
	version int
	latest  string // newest exported directory ("" until the first sync)
	adapter string // the adapter requests use now (SyncLoRA)

	// noise is the largest mean |Δ log p| between a server and the trainer
	// holding the same (initial) weights; serverVersions are the servers'
	// /version answers by URL, for messages.
	noise          float64
	serverVersions map[string]string

	mu    sync.Mutex
	model string
	stats SyncStats
}

// NewVLLM connects to opts.Endpoints or opts.URLs, or launches the replicas
// opts.Launch describes (validating the GPU assignment first); probes every
// server (a one-token completion with token ids and log-probs, and the
// routes SyncMode needs) and returns the backend. Close stops launched
// replicas. ctx bounds startup only.
func NewVLLM(ctx context.Context, opts VLLMOptions) (*VLLM, error) {
	v, err := newVLLM(opts)
	if err != nil {
		return nil, err
	}
	switch {
	case len(opts.Endpoints) > 0 && len(opts.URLs) > 0:
		return nil, errors.New("vllm backend: give endpoints or URLs, not both")
	case len(opts.Endpoints) > 0:
		v.setEndpoints(opts.Endpoints)
	case len(opts.URLs) > 0:
		eps := make([]vllm.Endpoint, len(opts.URLs))
		for i, u := range opts.URLs {
			if _, err := vllm.NewClient(u, nil); err != nil {
				return nil, fmt.Errorf("engine.vllm_urls[%d]: %w", i, err)
			}
			eps[i] = vllm.StaticEndpoint(u)
		}
		v.setEndpoints(eps)
	default:
		if err := v.launch(ctx); err != nil {
			return nil, err
		}
	}
	if err := v.probe(ctx); err != nil {
		v.Close()
		return nil, err
	}
	if err := v.firstPush(ctx); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

// launch starts the supervised replicas; their restart hook is AfterStart.
func (v *VLLM) launch(ctx context.Context) error {
	o := v.opts
	assign, err := o.GPUs.Assign()
	if err != nil {
		return err
	}
	sup, err := vllm.Start(ctx, vllm.Options{Launch: o.Launch, GPUs: assign, BasePort: o.BasePort, LogDir: o.LogDir,
		StartupTimeout: o.StartupTimeout, MaxRestarts: o.MaxRestarts, StopGrace: o.StopGrace,
		AfterStart: v.AfterStart, OnEvent: o.OnEvent, HTTPClient: o.HTTPClient, Logger: o.Logger})
	if err != nil {
		return err
	}
	eps := make([]vllm.Endpoint, 0, len(sup.Replicas()))
	for _, r := range sup.Replicas() {
		eps = append(eps, r)
	}
	v.setEndpoints(eps)
	v.stopSup = sup.Stop
	v.supervisor = sup
	return nil
}

func newVLLM(opts VLLMOptions) (*VLLM, error) {
	if opts.SyncMode != SyncNone && (opts.SyncDir == "" || opts.Export == nil) {
		return nil, errors.New("vllm backend: weight sync needs SyncDir and Export (or SyncMode SyncNone)")
	}
	def := func(d *time.Duration, val time.Duration) {
		if *d <= 0 {
			*d = val
		}
	}
	def(&opts.SyncTimeout, 10*time.Minute)
	def(&opts.Timeout, 5*time.Minute)
	def(&opts.RetryBase, 100*time.Millisecond)
	def(&opts.RetryCap, 2*time.Second)
	if opts.KeepVersions < 1 {
		opts.KeepVersions = 2
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}}
	}
	return &VLLM{opts: opts, gate: vllm.NewPauseGate(), serverVersions: map[string]string{}}, nil
}

// URLs are the base URLs of the replicas this backend uses.
func (v *VLLM) URLs() []string {
	out := make([]string, len(v.opts.Endpoints))
	for i, ep := range v.opts.Endpoints {
		out[i] = ep.URL()
	}
	return out
}

func (v *VLLM) setEndpoints(eps []vllm.Endpoint) {
	v.opts.Endpoints = eps
	v.router = newRouter(eps, v.opts.Router)
}

// client is the API client of endpoint ep, carrying the API key.
func (v *VLLM) client(ep vllm.Endpoint) (*vllm.Client, error) {
	c, err := vllm.NewClient(ep.URL(), v.opts.HTTPClient)
	if err != nil {
		return nil, err
	}
	return c.WithAPIKey(v.opts.APIKey), nil
}

// RouterStats counts requests per replica and sessions moved off a failed
// replica.
func (v *VLLM) RouterStats() RouterStats { return v.router.stats() }

func (v *VLLM) probe(ctx context.Context) error {
	if len(v.opts.Endpoints) == 0 {
		return errors.New("vllm backend: no endpoints")
	}
	needs := vllm.Needs{FullSync: v.opts.SyncMode == SyncFull, LoRA: v.opts.SyncMode == SyncLoRA}
	for _, ep := range v.opts.Endpoints {
		c, err := v.client(ep)
		if err != nil {
			return err
		}
		card, err := vllm.Probe(ctx, c, needs)
		if err != nil {
			return err
		}
		if ver, err := c.Version(ctx); err == nil {
			v.serverVersions[ep.URL()] = ver
		}
		if _, shared := ep.(vllm.StaticEndpoint); shared {
			v.warnShared(ctx, c)
		}
		v.mu.Lock()
		if v.model == "" {
			v.model = card.ID
		} else if v.model != card.ID {
			v.mu.Unlock()
			return fmt.Errorf("vllm servers serve different models: %q and %q (%s); give every replica the same model", v.model, card.ID, ep.URL())
		}
		v.mu.Unlock()
	}
	return nil
}

// Model is the name requests are sent under (the base model or policy-vN).
func (v *VLLM) Model() string { v.mu.Lock(); defer v.mu.Unlock(); return v.model }

// LastSync describes the most recent weight sync.
func (v *VLLM) LastSync() SyncStats { v.mu.Lock(); defer v.mu.Unlock(); return v.stats }

// Generate samples one completion.
func (v *VLLM) Generate(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, v.opts.Timeout)
	defer cancel()
	ctx, leave, err := v.gate.Enter(ctx) // waits while weights are pushed
	if err != nil {
		return Result{}, fmt.Errorf("generate: waiting for weight sync: %w", err)
	}
	defer leave()
	body := v.completionRequest(req)
	b := &backoff.Backoff{Base: v.opts.RetryBase, Cap: v.opts.RetryCap, Factor: 2, Jitter: 0.2,
		Name: "vllm generate", Logger: v.opts.Logger, LogOver: time.Second}
	var lastErr error
	for {
		res, err := v.attempt(ctx, body, req.SessionKey)
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil && lastErr != nil {
			// The deadline ended an attempt: the error worth reading is
			// the one that made the run retry.
			return Result{}, fmt.Errorf("generate: gave up after %d attempts: %w (last error: %v)", b.Attempts()+1, ctx.Err(), lastErr)
		}
		if !vllm.Retryable(err) {
			return Result{}, err
		}
		lastErr = err
		v.opts.Logger.Debug().Err(err).Int("attempt", b.Attempts()+1).Msg("retrying completion")
		if werr := b.Wait(ctx); werr != nil {
			return Result{}, fmt.Errorf("generate: gave up after %d attempts: %w (last error: %v)", b.Attempts(), werr, lastErr)
		}
	}
}

func (v *VLLM) completionRequest(req Request) *vllm.CompletionRequest {
	zero := 0
	topK := req.Sampling.TopK
	if topK <= 0 {
		topK = -1 // off, in every vLLM version
	}
	body := &vllm.CompletionRequest{
		Model: v.Model(), Prompt: req.PromptIDs, MaxTokens: req.MaxTokens, N: 1,
		Temperature: req.Sampling.Temperature, TopP: req.Sampling.TopP, TopK: topK, MinP: req.Sampling.MinP,
		RepetitionPenalty: 1, StopTokenIDs: req.StopIDs, Stop: []string{},
		// Only the request's stop ids end a completion, as in the builtin engine.
		IgnoreEOS: true, Logprobs: &zero, ReturnTokenIDs: true,
	}
	if body.StopTokenIDs == nil {
		body.StopTokenIDs = []int32{}
	}
	if req.Seed != 0 {
		s := req.Seed
		body.Seed = &s
	}
	return body
}

// attempt sends body to the session's replica (see router). A replica whose
// connection fails is passed over for a cooldown, so the retry goes
// elsewhere; a 5xx answer is retried without that (the server is alive).
func (v *VLLM) attempt(ctx context.Context, body *vllm.CompletionRequest, session string) (Result, error) {
	i, done, err := v.router.pick(session)
	if err != nil {
		return Result{}, err
	}
	defer done()
	c, err := v.client(v.opts.Endpoints[i])
	if err != nil {
		return Result{}, err
	}
	resp, err := c.WithSessionID(session).Complete(ctx, body)
	if err != nil {
		var se *vllm.StatusError
		if vllm.Retryable(err) && !errors.As(err, &se) && ctx.Err() == nil {
			v.router.failed(i) // the connection failed: the replica is down or restarting
		}
		return Result{}, err
	}
	if err := resp.Validate(1); err != nil {
		return Result{}, &InvalidResultError{Server: c.URL(), Request: describeRequest(body, session), Err: err}
	}
	ch := resp.Choices[0]
	res := Result{IDs: ch.TokenIDs, Logprobs: make([]float32, len(ch.TokenIDs)), StopReason: StopLength}
	for j, lp := range ch.Logprobs.TokenLogprobs {
		res.Logprobs[j] = float32(*lp)
	}
	switch *ch.FinishReason {
	case vllm.FinishStop:
		res.StopReason = StopToken
	case vllm.FinishAbort:
		// The server aborted it (a pause in abort mode); sample it again.
		return Result{}, &vllm.StatusError{URL: c.URL(), Code: http.StatusServiceUnavailable, Message: "request aborted by the server"}
	}
	return res, nil
}

// errNoReplica is retryable: replicas come back after a restart.
var errNoReplica = &vllm.StatusError{Code: http.StatusServiceUnavailable, Message: "no vLLM replica is ready (restarting)"}

// SyncWeights exports the trainer's weights and makes every server use
// them. New Generate calls wait meanwhile; in-flight ones finish first.
func (v *VLLM) SyncWeights(ctx context.Context, step int) error {
	if v.opts.SyncMode == SyncNone {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, v.opts.SyncTimeout)
	defer cancel()
	start := time.Now()
	v.serial.Lock()
	defer v.serial.Unlock()
	// Drain without holding syncMu: an in-flight request may be waiting for
	// a restarting replica, whose restart hook needs syncMu.
	if err := v.gate.Pause(ctx, vllm.PauseWait); err != nil {
		v.gate.Resume()
		return fmt.Errorf("sync weights for step %d: drain requests: %w", step, err)
	}
	defer v.gate.Resume()
	v.syncMu.Lock()
	defer v.syncMu.Unlock()
	version := v.version + 1
	if v.opts.Follower {
		return v.follow(step, version, start)
	}
	dir, err := v.export(ctx, version)
	if err != nil {
		return fmt.Errorf("sync weights for step %d: %w", step, err)
	}
	v.version, v.latest = version, dir
	model, err := v.push(ctx, dir, version)
	if err != nil {
		return fmt.Errorf("sync weights for step %d (version %d, %s): %w", step, version, dir, err)
	}
	st := SyncStats{Step: step, Version: version, Dir: dir, Model: model}
	if v.opts.Check != nil {
		diff, err := v.verifyPush(ctx, step, version, model)
		if err != nil {
			return fmt.Errorf("sync weights for step %d: %w", step, err)
		}
		st.ProbeDiff, st.Probed = diff, true
	}
	v.prune(version)
	st.Duration = time.Since(start)
	v.mu.Lock()
	v.model, v.stats = model, st
	v.mu.Unlock()
	ev := v.opts.Logger.Info().Int("step", step).Int("version", version).Str("model", model).Float64("took_s", st.Duration.Round(time.Millisecond).Seconds())
	if st.Probed {
		ev = ev.Float64("probe_logp_difference", st.ProbeDiff)
	}
	ev.Msg("synced weights to vLLM")
	return nil
}

// follow moves a follower to the version the leader pushed: requests name
// its adapter from now on (full weights keep the model's name).
func (v *VLLM) follow(step, version int, start time.Time) error {
	v.version = version
	model := v.Model()
	if v.opts.SyncMode == SyncLoRA {
		model = "policy-v" + strconv.Itoa(version)
		v.adapter = model
	}
	v.mu.Lock()
	v.model, v.stats = model, SyncStats{Step: step, Version: version, Model: model, Duration: time.Since(start)}
	v.mu.Unlock()
	return nil
}

// export writes version's weights to SyncDir/policy-vN atomically: into a
// temporary directory, synced, then renamed, so no server ever reads a
// half-written one.
func (v *VLLM) export(ctx context.Context, version int) (string, error) {
	dir := filepath.Join(v.opts.SyncDir, "policy-v"+strconv.Itoa(version))
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", fmt.Errorf("create sync dir: %w", err)
	}
	if err := v.opts.Export(ctx, tmp); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("export weights to %s: %w", tmp, err)
	}
	if err := syncTree(tmp); err != nil {
		return "", err
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("publish %s: %w", dir, err)
	}
	return dir, nil
}

// syncTree fsyncs every file of dir and dir itself.
func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			return fmt.Errorf("fsync %s: %w", p, err)
		}
		return nil
	})
}

// push applies dir on every endpoint and returns the model name to use. An
// endpoint that is restarting (not ready, or lost mid-push) is skipped: its
// restart hook loads the newest weights before it serves again.
func (v *VLLM) push(ctx context.Context, dir string, version int) (string, error) {
	name := v.Model()
	if v.opts.SyncMode == SyncLoRA {
		name = "policy-v" + strconv.Itoa(version)
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, ep := range v.opts.Endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := v.client(ep)
			if err == nil {
				err = v.apply(ctx, c, name, dir)
			}
			if err != nil && !ep.Ready() && vllm.Retryable(err) {
				v.opts.Logger.Warn().Err(err).Str("url", ep.URL()).Msg("replica restarting during weight sync; it loads the new weights when it comes back")
				return
			}
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	if prev := v.adapter; v.opts.SyncMode == SyncLoRA && prev != "" {
		for _, ep := range v.opts.Endpoints {
			if c, err := v.client(ep); err == nil {
				if err := vllm.UnloadAdapter(ctx, c, prev); err != nil {
					v.opts.Logger.Warn().Err(err).Str("adapter", prev).Msg("could not unload the previous adapter")
				}
			}
		}
	}
	if v.opts.SyncMode == SyncLoRA {
		v.adapter = name
	}
	return name, nil
}

// apply pushes one version to one server.
func (v *VLLM) apply(ctx context.Context, c *vllm.Client, name, dir string) error {
	if v.opts.SyncMode == SyncLoRA {
		return vllm.LoadAdapter(ctx, c, name, dir)
	}
	return vllm.ReloadFull(ctx, c, dir, v.opts.SyncTimeout)
}

// AfterStart is the supervisor's restart hook: a replica that comes back
// starts from the original model, so it gets the newest weights before it
// is marked ready.
func (v *VLLM) AfterStart(ctx context.Context, replica int, c *vllm.Client) error {
	v.syncMu.Lock()
	defer v.syncMu.Unlock()
	if v.latest == "" || v.opts.SyncMode == SyncNone {
		return nil
	}
	v.opts.Logger.Info().Int("replica", replica).Str("dir", v.latest).Msg("pushing the newest weights to a restarted replica")
	return v.apply(ctx, c, v.adapter, v.latest)
}

// prune removes policy-vN directories older than KeepVersions.
func (v *VLLM) prune(version int) {
	entries, err := os.ReadDir(v.opts.SyncDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), "policy-v")
		k, err := strconv.Atoi(n)
		if ok && err == nil && k <= version-v.opts.KeepVersions {
			os.RemoveAll(filepath.Join(v.opts.SyncDir, e.Name()))
		}
	}
}

// Close stops launched replicas (if this backend started them).
func (v *VLLM) Close() error {
	if v.stopSup != nil {
		v.stopSup()
	}
	return nil
}

// Supervisor is the supervisor of launched replicas (nil for URLs).
func (v *VLLM) Supervisor() *vllm.Supervisor { return v.supervisor }
