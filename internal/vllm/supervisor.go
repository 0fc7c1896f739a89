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
	"strings"
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
	Replica int
	State   State
	// URL is where the replica's vLLM listens, the address ortrain uses;
	// PublicURL is the one other machines use (the guard's beyond
	// loopback, else URL).
	URL       string
	PublicURL string
	GPUs      []int
	Restarts  int
	Err       error // why it is restarting or failed
	LogPath   string
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

// Replica is one supervised server. Its URLs can change when a restart has
// to move to a new free port.
type Replica struct {
	index   int
	gpus    []int
	logPath string

	mu        sync.Mutex
	url       string // where vLLM listens (loopback when guarded)
	publicURL string // the guard's URL beyond loopback, else url
	port      int    // the requested port: vLLM's, or the guard's beyond loopback
	upPort    int    // vLLM's loopback port behind the guard
	state     State
	restarts  int
	pid       int
}

// Index is the replica's position.
func (r *Replica) Index() int { return r.index }

// GPUs are the replica's physical GPUs.
func (r *Replica) GPUs() []int { return r.gpus }

// LogPath is the replica's log file.
func (r *Replica) LogPath() string { return r.logPath }

// URL is the replica's current base URL as ortrain reaches it: beyond
// loopback that is vLLM itself on 127.0.0.1, behind no guard.
func (r *Replica) URL() string { r.mu.Lock(); defer r.mu.Unlock(); return r.url }

// PublicURL is the base URL for other machines: beyond loopback the
// guard's, which requires the API key on every route (a wildcard bind is
// named by this machine's hostname, see PublicHost); on loopback it is URL.
func (r *Replica) PublicURL() string { r.mu.Lock(); defer r.mu.Unlock(); return r.publicURL }

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

// PublicURLs are the replicas' current URLs for other machines.
func (s *Supervisor) PublicURLs() []string {
	out := make([]string, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = r.PublicURL()
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
	ev := Event{Replica: r.index, State: st, URL: r.url, PublicURL: r.publicURL, GPUs: r.gpus, Restarts: r.restarts, Err: err, LogPath: r.logPath}
	r.mu.Unlock()
	l := s.opts.Logger.Info()
	if err != nil {
		l = s.opts.Logger.Warn().Err(err)
	}
	if ev.PublicURL != ev.URL {
		l = l.Str("public_url", ev.PublicURL)
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
		p, g, err := s.launch(stopCtx, r)
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
			err = s.watch(stopCtx, r, p, g)
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

// launch starts the process (behind a guard beyond loopback) and waits
// until it is ready and AfterStart succeeded. On failure both are stopped.
func (s *Supervisor) launch(ctx context.Context, r *Replica) (*childproc.Process, *replicaGuard, error) {
	host, port, g, err := s.bind(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	url := "http://" + net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(port))
	public := url
	if g != nil {
		public = g.url
	}
	p, err := childproc.Start(childproc.Options{Argv: s.opts.Launch.Argv(port), Env: s.opts.Launch.Env(r.gpus), LogPath: r.logPath})
	if err != nil {
		if g != nil {
			g.stop()
		}
		return nil, nil, err
	}
	r.mu.Lock()
	r.url, r.publicURL, r.pid = url, public, p.PGID()
	r.mu.Unlock()
	s.emit(r, StateStarting, nil)
	c, err := NewClient(url, s.opts.HTTPClient)
	if err == nil {
		c = c.WithAPIKey(s.opts.Launch.APIKey)
		_, err = waitReady(ctx, p, c, s.opts.StartupTimeout, s.opts.PollInterval)
	}
	if err == nil && s.opts.AfterStart != nil {
		err = s.opts.AfterStart(ctx, r.index, c)
	}
	if err != nil {
		if g != nil {
			g.beginStop()
		}
		if ctx.Err() != nil {
			p.Stop(s.opts.StopGrace)
		} else {
			p.Kill()
		}
		if g != nil {
			g.stop()
		}
		return nil, nil, err
	}
	return p, g, nil
}

// bind picks where vLLM listens. On loopback that is the requested host and
// port. Beyond loopback vLLM gets a free port on 127.0.0.1 and a guard takes
// the requested address, since vLLM's own key leaves its control routes
// open. A fixed port (BasePort) must be free; a free-port replica keeps the
// previous start's port when it still can.
func (s *Supervisor) bind(ctx context.Context, r *Replica) (string, int, *replicaGuard, error) {
	host, bindHost := s.opts.Launch.host(), s.opts.Launch.bindHost()
	fixed := s.opts.BasePort > 0
	r.mu.Lock()
	port, upPort := r.port, r.upPort
	r.mu.Unlock()
	if host == bindHost {
		port, err := pickPort(host, port, fixed)
		if err != nil {
			return "", 0, nil, err
		}
		r.mu.Lock()
		r.port = port
		r.mu.Unlock()
		return host, port, nil, nil
	}
	upPort, err := pickPort(bindHost, upPort, false)
	if err != nil {
		return "", 0, nil, err
	}
	upstream := "http://" + net.JoinHostPort(bindHost, strconv.Itoa(upPort))
	g, err := startGuard(ctx, host, port, fixed, upstream, s.opts.Launch.APIKey,
		s.opts.Logger.With().Str("component", "vllmguard").Int("replica", r.index).Logger())
	if err != nil {
		return "", 0, nil, fmt.Errorf("guard for replica %d on %s: %w", r.index, host, err)
	}
	r.mu.Lock()
	r.port, r.upPort = g.port, upPort
	r.mu.Unlock()
	return bindHost, upPort, g, nil
}

// pickPort: a fixed port must be free now; otherwise prev when it is still
// free, else a free one.
func pickPort(host string, prev int, fixed bool) (int, error) {
	if fixed {
		return prev, CheckPort(host, prev)
	}
	if prev != 0 && CheckPort(host, prev) == nil {
		return prev, nil
	}
	return FreePort(host)
}

// watch returns when the process exits, stops answering /health, its guard
// stops serving, or Stop is called (then it stops both gracefully and
// returns nil). The guard (nil on loopback) is stopped on every return.
func (s *Supervisor) watch(ctx context.Context, r *Replica, p *childproc.Process, g *replicaGuard) error {
	var guardDone <-chan struct{} // nil on loopback: never ready
	if g != nil {
		defer g.stop()
		guardDone = g.exited()
	}
	c, _ := NewClient(r.URL(), s.opts.HTTPClient)
	c = c.WithAPIKey(s.opts.Launch.APIKey)
	tick := time.NewTicker(s.opts.HealthInterval)
	defer tick.Stop()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			if g != nil {
				g.beginStop() // no new requests while vLLM drains
			}
			p.Stop(s.opts.StopGrace)
			return nil
		case <-p.Done():
			p.Kill() // reap what the leader left behind
			return fmt.Errorf("replica %d crashed: %w", r.index, p.ExitError())
		case <-guardDone:
			p.Kill()
			return fmt.Errorf("replica %d: the guard on %s stopped: %w", r.index, g.url, g.failure())
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
