package vllm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/backoff"
	"github.com/ortrain/ortrain/internal/childproc"
)

// State is where a replica is in its life.
type State int

const (
	StateStarting   State = iota // launched, waiting for /health and /v1/models
	StateReady                   // serving
	StateRestarting              // crashed or unhealthy; waiting to start again
	StateStopped                 // stopped on request
	StateFailed                  // gave up after MaxRestarts
)

func (s State) String() string {
	return [...]string{"starting", "ready", "restarting", "stopped", "failed"}[s]
}

// Event reports a replica's state change.
type Event struct {
	Replica  int
	State    State
	URL      string
	GPUs     []int
	Restarts int
	Err      error // why it is restarting or failed
	LogPath  string
}

// Options configure a Supervisor.
type Options struct {
	Launch LaunchConfig
	// GPUs holds each replica's GPUs (from GPUPlan.Assign); its length is
	// the replica count.
	GPUs [][]int
	// BasePort > 0 gives replica i port BasePort+i; 0 picks free ports.
	BasePort int
	// LogDir receives replica-<i>.log (appended across restarts).
	LogDir string
	// StartupTimeout is a stall deadline: a start fails when the child is
	// neither ready nor printing anything for this long. Default 5 minutes.
	StartupTimeout time.Duration
	// PollInterval paces readiness polls (default 200ms).
	PollInterval time.Duration
	// HealthInterval paces /health checks of a ready replica (default 5s);
	// HealthFailures consecutive failures count as a crash (default 3).
	HealthInterval time.Duration
	HealthFailures int
	// MaxRestarts bounds restarts per replica (default 5; negative: none).
	MaxRestarts int
	// RestartBase and RestartCap shape the restart backoff (defaults 1s, 30s).
	RestartBase, RestartCap time.Duration
	// StopGrace is how long SIGTERM may take before SIGKILL (default 30s).
	StopGrace time.Duration
	// AfterStart runs on every (re)start before the replica is marked ready;
	// the generation backend uses it to push the newest weights to a
	// restarted replica.
	AfterStart func(ctx context.Context, replica int, c *Client) error
	// OnEvent receives every state change (it must not block).
	OnEvent    func(Event)
	HTTPClient *http.Client
	Logger     zerolog.Logger
}

func (o *Options) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.StartupTimeout, 5*time.Minute)
	def(&o.PollInterval, 200*time.Millisecond)
	def(&o.HealthInterval, 5*time.Second)
	def(&o.RestartBase, time.Second)
	def(&o.RestartCap, 30*time.Second)
	def(&o.StopGrace, 30*time.Second)
	if o.HealthFailures <= 0 {
		o.HealthFailures = 3
	}
	if o.MaxRestarts == 0 {
		o.MaxRestarts = 5
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	}
}

// Supervisor runs and watches the replicas.
type Supervisor struct {
	opts     Options
	replicas []*Replica
	stopping chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	failOnce sync.Once
	failed   chan struct{}
	failErr  error
}

// Replica is one supervised server. Its URL can change when a restart has
// to move to a new free port.
type Replica struct {
	index   int
	gpus    []int
	logPath string

	mu       sync.Mutex
	url      string
	port     int
	state    State
	restarts int
	pid      int
}

// Index is the replica's position.
func (r *Replica) Index() int { return r.index }

// GPUs are the replica's physical GPUs.
func (r *Replica) GPUs() []int { return r.gpus }

// LogPath is the replica's log file.
func (r *Replica) LogPath() string { return r.logPath }

// URL is the replica's current base URL.
func (r *Replica) URL() string { r.mu.Lock(); defer r.mu.Unlock(); return r.url }

// Ready reports whether the replica is serving.
func (r *Replica) Ready() bool { return r.State() == StateReady }

// State is the replica's current state.
func (r *Replica) State() State { r.mu.Lock(); defer r.mu.Unlock(); return r.state }

// Restarts counts restarts so far.
func (r *Replica) Restarts() int { r.mu.Lock(); defer r.mu.Unlock(); return r.restarts }

// PID is the current process's id (also its process group id).
func (r *Replica) PID() int { r.mu.Lock(); defer r.mu.Unlock(); return r.pid }

// Start launches every replica and returns once all are ready. ctx bounds
// startup only; the replicas run until Stop. If any replica cannot start,
// all are stopped and the error names the replica and its log file.
func Start(ctx context.Context, opts Options) (*Supervisor, error) {
	opts.defaults()
	if len(opts.GPUs) == 0 {
		return nil, errors.New("supervisor: no replicas (GPUs holds one entry per replica)")
	}
	if opts.LogDir == "" {
		return nil, errors.New("supervisor: LogDir is required (replica logs go there)")
	}
	if err := opts.Launch.CheckExposure(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("create replica log dir: %w", err)
	}
	s := &Supervisor{opts: opts, stopping: make(chan struct{}), failed: make(chan struct{})}
	for i, g := range opts.GPUs {
		r := &Replica{index: i, gpus: g, logPath: filepath.Join(opts.LogDir, fmt.Sprintf("replica-%d.log", i))}
		if opts.BasePort > 0 {
			r.port = opts.BasePort + i
			if err := CheckPort(opts.Launch.host(), r.port); err != nil {
				return nil, fmt.Errorf("replica %d: %w", i, err)
			}
		}
		s.replicas = append(s.replicas, r)
	}
	firsts := make([]chan error, len(s.replicas))
	for i, r := range s.replicas {
		firsts[i] = make(chan error, 1)
		s.wg.Add(1)
		go s.supervise(r, firsts[i])
	}
	var errs []error
	for i, ch := range firsts {
		select {
		case err := <-ch:
			if err != nil {
				errs = append(errs, fmt.Errorf("replica %d (gpus %q, log %s): %w", i, JoinGPUs(s.replicas[i].gpus), s.replicas[i].logPath, err))
			}
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("replica %d: startup interrupted: %w", i, ctx.Err()))
		}
		if len(errs) > 0 {
			break
		}
	}
	if len(errs) > 0 {
		s.Stop()
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// Replicas are the supervised servers, in order.
func (s *Supervisor) Replicas() []*Replica { return s.replicas }

// URLs are the replicas' current base URLs.
func (s *Supervisor) URLs() []string {
	out := make([]string, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = r.URL()
	}
	return out
}

// Failed is closed when a replica has given up after MaxRestarts; Err says why.
func (s *Supervisor) Failed() <-chan struct{} { return s.failed }

// Err is the permanent failure, if any.
func (s *Supervisor) Err() error {
	select {
	case <-s.failed:
		return s.failErr
	default:
		return nil
	}
}

// Stop stops every replica (SIGTERM to its group, SIGKILL after StopGrace)
// and returns when all are gone. It is safe to call more than once.
func (s *Supervisor) Stop() {
	s.stopOnce.Do(func() { close(s.stopping) })
	s.wg.Wait()
}

func (s *Supervisor) emit(r *Replica, st State, err error) {
	r.mu.Lock()
	r.state = st
	ev := Event{Replica: r.index, State: st, URL: r.url, GPUs: r.gpus, Restarts: r.restarts, Err: err, LogPath: r.logPath}
	r.mu.Unlock()
	l := s.opts.Logger.Info()
	if err != nil {
		l = s.opts.Logger.Warn().Err(err)
	}
	l.Int("replica", r.index).Str("state", st.String()).Str("url", ev.URL).Str("gpus", JoinGPUs(r.gpus)).Int("restarts", ev.Restarts).Msg("vllm replica")
	if s.opts.OnEvent != nil {
		s.opts.OnEvent(ev)
	}
}

// supervise runs one replica until Stop, restarting it when it crashes.
func (s *Supervisor) supervise(r *Replica, first chan<- error) {
	defer s.wg.Done()
	b := &backoff.Backoff{Base: s.opts.RestartBase, Cap: s.opts.RestartCap, Factor: 2, Jitter: 0.2,
		Name: fmt.Sprintf("vllm replica %d", r.index), Logger: s.opts.Logger, LogOver: 5 * time.Second}
	// stopCtx ends waits when Stop is called.
	stopCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stopping:
			cancel()
		case <-stopCtx.Done():
		}
	}()
	for {
		p, err := s.launch(stopCtx, r)
		if err == nil {
			// Before Start hears: whoever it returns to sees ready replicas.
			s.emit(r, StateReady, nil)
		}
		if first != nil {
			// Read before reporting: Start stops everything once it hears.
			stopped := stopCtx.Err() != nil
			if err != nil {
				if stopped {
					s.emit(r, StateStopped, nil) // stopped because another replica failed
				} else {
					s.emit(r, StateFailed, err)
				}
				first <- err
				return
			}
			first <- nil
			first = nil
		}
		if err == nil {
			b.Reset()
			err = s.watch(stopCtx, r, p)
		}
		if stopCtx.Err() != nil {
			s.emit(r, StateStopped, nil)
			return
		}
		r.mu.Lock()
		r.restarts++
		n := r.restarts
		r.mu.Unlock()
		if s.opts.MaxRestarts < 0 || n > s.opts.MaxRestarts {
			err = fmt.Errorf("replica %d gave up after %d restarts (log %s): %w", r.index, n-1, r.logPath, err)
			s.emit(r, StateFailed, err)
			s.failOnce.Do(func() { s.failErr = err; close(s.failed) })
			return
		}
		s.emit(r, StateRestarting, err)
		if b.Wait(stopCtx) != nil {
			s.emit(r, StateStopped, nil)
			return
		}
	}
}

// launch starts the process and waits until it is ready (and AfterStart
// succeeded). On failure the process is killed.
func (s *Supervisor) launch(ctx context.Context, r *Replica) (*childproc.Process, error) {
	host := s.opts.Launch.host()
	port := r.port
	if s.opts.BasePort > 0 {
		if err := CheckPort(host, port); err != nil {
			return nil, err
		}
	} else if port == 0 || CheckPort(host, port) != nil {
		var err error
		if port, err = FreePort(host); err != nil {
			return nil, err
		}
	}
	url := "http://" + net.JoinHostPort(ClientHost(host), strconv.Itoa(port))
	p, err := childproc.Start(childproc.Options{Argv: s.opts.Launch.Argv(port), Env: s.opts.Launch.Env(r.gpus), LogPath: r.logPath})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.port, r.url, r.pid = port, url, p.PGID()
	r.mu.Unlock()
	s.emit(r, StateStarting, nil)
	c, err := NewClient(url, s.opts.HTTPClient)
	if err == nil {
		c = c.WithAPIKey(s.opts.Launch.APIKey)
		_, err = waitReady(ctx, p, c, s.opts.StartupTimeout, s.opts.PollInterval)
	}
	if err == nil && !IsLoopback(host) {
		err = checkGuarded(ctx, c)
	}
	if err == nil && s.opts.AfterStart != nil {
		err = s.opts.AfterStart(ctx, r.index, c)
	}
	if err != nil {
		if ctx.Err() != nil {
			p.Stop(s.opts.StopGrace)
		} else {
			p.Kill()
		}
		return nil, err
	}
	return p, nil
}

// watch returns when the process exits, stops answering /health, or Stop is
// called (then it stops the process gracefully and returns nil).
func (s *Supervisor) watch(ctx context.Context, r *Replica, p *childproc.Process) error {
	c, _ := NewClient(r.URL(), s.opts.HTTPClient)
	c = c.WithAPIKey(s.opts.Launch.APIKey)
	tick := time.NewTicker(s.opts.HealthInterval)
	defer tick.Stop()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			p.Stop(s.opts.StopGrace)
			return nil
		case <-p.Done():
			p.Kill() // reap what the leader left behind
			return fmt.Errorf("replica %d crashed: %w", r.index, p.ExitError())
		case <-tick.C:
			hctx, cancel := context.WithTimeout(ctx, max(s.opts.HealthInterval, 2*time.Second))
			err := c.Health(hctx)
			cancel()
			if err == nil || ctx.Err() != nil {
				fails = 0
				continue
			}
			if fails++; fails >= s.opts.HealthFailures {
				p.Kill()
				return fmt.Errorf("replica %d unhealthy after %d failed health checks: %w", r.index, fails, err)
			}
		}
	}
}

// checkGuarded refuses a replica reachable beyond loopback whose control
// routes answer without the API key.
func checkGuarded(ctx context.Context, c *Client) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	guarded, err := c.Guarded(ctx)
	if err != nil {
		return fmt.Errorf("check that %s guards its control routes: %w", c.URL(), err)
	}
	if !guarded {
		return fmt.Errorf("%s answers GET /is_paused without the API key: this server guards only /v1/* with --api-key, "+
			"so its pause and weight routes would be open to the network; use a vLLM whose --api-key guards every route, or bind to 127.0.0.1", c.URL())
	}
	return nil
}
