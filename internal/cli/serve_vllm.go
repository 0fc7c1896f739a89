package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/vllm"
)

// ServeVLLMOptions are the inputs of `ortrain serve-vllm`.
type ServeVLLMOptions struct {
	IO         *IOStreams
	Logger     zerolog.Logger
	Getenv     func(string) string
	Environ    func() []string
	Executable func() (string, error)

	Model          string
	GPUs           string
	TensorParallel int
	Replicas       int
	Port           int
	Host           string
	Command        string
	GPUMemoryUtil  float64
	MaxModelLen    int
	EnableLoRA     bool
	MaxLoRARank    int
	MaxLoRAs       int
	LogDir         string
	StartupTimeout time.Duration
	MaxRestarts    int
	StopGrace      time.Duration
	ExtraArgs      []string
}

func newServeVLLMCmd(deps *Deps, runF func(context.Context, *ServeVLLMOptions) error) *cobra.Command {
	opts := &ServeVLLMOptions{}
	cmd := &cobra.Command{
		Use:   "serve-vllm --model M --gpus 2,3 [flags] [-- extra vllm serve args]",
		Short: "Launch and supervise vLLM servers on assigned GPUs",
		Long: `Launch one ` + "`vllm serve`" + ` per replica on its assigned GPUs and supervise them until
interrupted: each replica gets CUDA_VISIBLE_DEVICES from --gpus (split into
--replicas groups of --tensor-parallel-size), its own process group, a log file
under --log-dir, the RL flags ortrain needs (--logprobs-mode processed_logprobs,
--generation-config vllm, VLLM_SERVER_DEV_MODE=1 for weight reloads), and a
restart with backoff when it crashes (up to --max-restarts). Readiness is /health
then /v1/models; a start that shows no progress for --startup-timeout fails.
Interrupting (Ctrl-C, SIGTERM) stops every replica: SIGTERM to its whole group,
SIGKILL after --stop-grace.

Each replica's URL and every state change are printed on stdout, one line each:
  replica 0 ready http://127.0.0.1:8000 gpus=2 restarts=0

With --host beyond loopback (0.0.0.0, a node address) VLLM_API_KEY must be set.
vLLM's own --api-key guards only /v1, leaving /pause, /resume, /is_paused,
/collective_rpc and /reset_prefix_cache open, so each vLLM then listens on
127.0.0.1 and ortrain's proxy serves --host:--port in front of it, requiring
"Authorization: Bearer $VLLM_API_KEY" on every route, /health included. The
printed URLs are the proxy's (for 0.0.0.0 named by this machine's hostname).
Arguments after -- are passed to vllm serve unchanged.`,
		Example: `  # two replicas, one GPU each, on GPUs 2 and 3
  ortrain serve-vllm --model Qwen/Qwen3-4B --gpus 2,3

  # one replica sharded over two GPUs, with extra vLLM flags
  ortrain serve-vllm --model /models/qwen3-8b --gpus 2,3 --tensor-parallel-size 2 -- --enforce-eager

  # reachable from other machines: every route behind ortrain's key-checking proxy
  VLLM_API_KEY=$(openssl rand -hex 16) ortrain serve-vllm --model Qwen/Qwen3-4B --gpus 2,3 --host 0.0.0.0

  # the same supervision over ortrain's own engine (no vLLM, no GPU)
  # ("ortrain" as the program means this very binary)
  ortrain serve-vllm --model models/tiny --replicas 2 --command "ortrain serve-engine"`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n := cmd.ArgsLenAtDash(); n > 0 {
				return usageErrorf("unexpected argument %q before --; extra vllm serve args go after --", args[0])
			} else if n == 0 {
				opts.ExtraArgs = args
			} else if len(args) > 0 {
				return usageErrorf("unexpected argument %q; extra vllm serve args go after --", args[0])
			}
			opts.IO, opts.Getenv, opts.Environ, opts.Executable = deps.IO, deps.Getenv, deps.Environ, deps.Executable
			opts.Logger = deps.Logger.With().Str("command", "serve-vllm").Logger()
			if opts.Model == "" {
				return usageErrorf("--model is required (a model directory or a cached Org/Name)")
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runServeVLLM(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Model, "model", "", "model directory or Hugging Face repo id in the local cache (required)")
	f.StringVar(&opts.GPUs, "gpus", "", "GPUs for vLLM, comma-separated (empty: no GPU, e.g. for serve-engine)")
	f.IntVar(&opts.TensorParallel, "tensor-parallel-size", 1, "GPUs per replica")
	f.IntVar(&opts.Replicas, "replicas", 0, "number of servers (0: GPUs / tensor-parallel-size, at least 1)")
	f.IntVar(&opts.Port, "port", 8000, "port of replica 0; replica i gets port+i (0: free ports)")
	f.StringVar(&opts.Host, "host", "127.0.0.1", "address the servers are reached at (beyond loopback, VLLM_API_KEY must be set: vLLM then listens on 127.0.0.1 and ortrain's proxy here requires the key as a Bearer token on every route)")
	f.StringVar(&opts.Command, "command", "vllm serve", "program and leading args of each server, split on spaces")
	f.Float64Var(&opts.GPUMemoryUtil, "gpu-memory-utilization", 0, "fraction of each GPU's memory vLLM may use (0: vLLM's default)")
	f.IntVar(&opts.MaxModelLen, "max-model-len", 0, "prompt + completion cap (0: the model's)")
	f.BoolVar(&opts.EnableLoRA, "enable-lora", false, "allow runtime LoRA adapter loading")
	f.IntVar(&opts.MaxLoRARank, "max-lora-rank", 16, "largest adapter rank (with --enable-lora)")
	f.IntVar(&opts.MaxLoRAs, "max-loras", 2, "adapters resident at once (with --enable-lora)")
	f.StringVar(&opts.LogDir, "log-dir", "", "directory for replica-<i>.log (default: a new ortrain-vllm-* directory under the system temp dir)")
	f.DurationVar(&opts.StartupTimeout, "startup-timeout", 5*time.Minute, "fail a start that shows no progress for this long")
	f.IntVar(&opts.MaxRestarts, "max-restarts", 5, "restarts per replica before giving up")
	f.DurationVar(&opts.StopGrace, "stop-grace", 30*time.Second, "time between SIGTERM and SIGKILL on stop")
	return cmd
}

func runServeVLLM(ctx context.Context, opts *ServeVLLMOptions) error {
	gpus, err := vllm.ParseGPUs(opts.GPUs)
	if err != nil {
		return usageErrorf("--gpus: %v", err)
	}
	assign, err := vllm.GPUPlan{GPUs: gpus, Replicas: opts.Replicas, TensorParallelSize: opts.TensorParallel}.Assign()
	if err != nil {
		return &UsageError{Err: err}
	}
	dir, _, err := model.Resolve(opts.Model, opts.Getenv)
	if err != nil {
		return usageErrorf("--model: %v", err)
	}
	command := strings.Fields(opts.Command)
	if len(command) == 0 {
		return usageErrorf("--command is empty")
	}
	self, _ := opts.Executable()
	launch := vllm.LaunchConfig{Command: command, Self: self, Model: dir, Host: opts.Host, TensorParallelSize: opts.TensorParallel,
		GPUMemoryUtilization: opts.GPUMemoryUtil, MaxModelLen: opts.MaxModelLen, ExtraArgs: opts.ExtraArgs, Environ: opts.Environ()}
	launch.APIKey = opts.Getenv("VLLM_API_KEY")
	if err := launch.CheckExposure(); err != nil {
		return &UsageError{Err: err}
	}
	if opts.EnableLoRA && !slices.Contains([]int{1, 8, 16, 32, 64, 128, 256, 320, 512}, opts.MaxLoRARank) {
		return usageErrorf("--max-lora-rank %d: vLLM accepts 1, 8, 16, 32, 64, 128, 256, 320 or 512", opts.MaxLoRARank)
	}
	if opts.EnableLoRA {
		launch.LoRA = &vllm.LoRALaunch{MaxRank: opts.MaxLoRARank, MaxLoras: opts.MaxLoRAs}
	}
	if err := findServerProgram(command[0], self); err != nil {
		return err
	}
	if opts.LogDir == "" {
		// Not the cwd: a fresh directory per invocation, printed below.
		if opts.LogDir, err = os.MkdirTemp("", "ortrain-vllm-"); err != nil {
			return fmt.Errorf("create log directory: %w", err)
		}
	}
	fmt.Fprintf(opts.IO.ErrOut, "replica logs in %s\n", opts.LogDir)
	events := &eventPrinter{w: opts.IO.Out}
	sup, err := vllm.Start(ctx, vllm.Options{Launch: launch, GPUs: assign, BasePort: opts.Port, LogDir: opts.LogDir,
		StartupTimeout: opts.StartupTimeout, MaxRestarts: opts.MaxRestarts, StopGrace: opts.StopGrace,
		OnEvent: events.print, Logger: opts.Logger})
	if err != nil {
		return fmt.Errorf("start vLLM: %w", err)
	}
	defer sup.Stop()
	if urls := sup.PublicURLs(); !slices.Equal(urls, sup.URLs()) { // beyond loopback: guarded
		fmt.Fprintf(opts.IO.ErrOut, "replicas serve other machines at %s through ortrain's proxy, which requires VLLM_API_KEY as "+
			"'Authorization: Bearer' on every route (/health and the control routes /pause, /resume, /is_paused, /collective_rpc, "+
			"/reset_prefix_cache included); vLLM itself listens on 127.0.0.1\n", strings.Join(urls, ", "))
		opts.Logger.Info().Strs("urls", urls).Msg("control routes guarded by ortrain's proxy; vLLM listens on 127.0.0.1")
	}
	select {
	case <-ctx.Done():
		return nil
	case <-sup.Failed():
		return sup.Err()
	}
}

// findServerProgram checks that the server program can be started, and
// says how to get it when it cannot. "ortrain" is this binary (self).
func findServerProgram(program, self string) error {
	if program == "ortrain" && self != "" {
		return nil
	}
	if _, err := exec.LookPath(program); err != nil {
		if program == "vllm" {
			return usageErrorf("vllm is not installed (not on PATH): install it with `pip install vllm` "+
				"in the Python environment on your PATH, or pass --command with the server to run, "+
				"e.g. --command \"ortrain serve-engine\" for ortrain's own engine (no vLLM, no GPU): %w", err)
		}
		return usageErrorf("--command program %q cannot be run: %w", program, err)
	}
	return nil
}

// eventPrinter writes one stdout line per replica state change.
type eventPrinter struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *eventPrinter) print(ev vllm.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The URL others use: beyond loopback the guard's, not vLLM's own.
	url := ev.PublicURL
	if url == "" {
		url = ev.URL
	}
	line := fmt.Sprintf("replica %d %s %s gpus=%s restarts=%d", ev.Replica, ev.State, url, vllm.JoinGPUs(ev.GPUs), ev.Restarts)
	if ev.Err != nil {
		line += " error=" + strings.ReplaceAll(ev.Err.Error(), "\n", " | ")
	}
	fmt.Fprintln(p.w, line)
}
