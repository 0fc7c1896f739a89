package cli

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/vllm"
)

// ServeEngineOptions are the inputs of `ortrain serve-engine`. The flags are
// the subset of `vllm serve` flags the supervisor passes, so the same
// launch command works with either program.
type ServeEngineOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger
	Getenv func(string) string

	Model           string
	Host            string
	Port            int
	ServedModelName string
	MaxModelLen     int
	TensorParallel  int
	LogprobsMode    string
	GenerationCfg   string
	GPUMemoryUtil   float64
	EnableLoRA      bool
	MaxLoRARank     int
	MaxLoRAs        int
	DType           string
	Seed            int64
	NoAccessLog     bool
	APIKey          string
	// EmulateVLLM is the vLLM version whose behaviour is imitated
	// (engineserver's profile table).
	EmulateVLLM string
	// FaultSpecs are the --fault NAME[=VALUE] flags; Faults their parse.
	FaultSpecs []string
	Faults     engineserver.Faults
	// DevMode and RuntimeLoRA come from VLLM_SERVER_DEV_MODE and
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM reads them.
	DevMode     bool
	RuntimeLoRA bool

	Device    string
	Threads   int
	MaxBatch  int
	WorkerLib string
	// ToolCallFormat parses tool calls out of chat replies: "auto" detects
	// it from the chat template, or a chat.ToolCallFormat name.
	ToolCallFormat string
}

func newServeEngineCmd(deps *Deps, runF func(context.Context, *ServeEngineOptions) error) *cobra.Command {
	opts := &ServeEngineOptions{}
	cmd := &cobra.Command{
		Use:   "serve-engine [MODEL] [--model DIR] [--port P]",
		Short: "Serve the builtin engine behind OpenAI's API and vLLM's token-id subset",
		Long: `Serve a model with ortrain's builtin (libtorch worker) engine over HTTP, for two
kinds of client at once.

Any OpenAI client (base URL http://HOST:PORT/v1), with OpenAI's JSON shapes:

  POST /v1/chat/completions     messages rendered with the model's chat template; tools
                                (calls parsed in the model's format), streaming, usage, logprobs
  POST /v1/completions          a text prompt: a string, or a list holding one string
  GET  /v1/models

Ortrain's vLLM path (supervisor, client, weight sync), with vLLM's JSON shapes:

  GET  /health, /version
  POST /v1/completions          token-id prompts (a list of ints or of such lists):
                                return_token_ids, logprobs=0, n, seed, stop_token_ids
  dev routes, only with VLLM_SERVER_DEV_MODE=1 (as vLLM):
  GET  /is_paused
  POST /pause, /resume          modes abort, wait, keep (they hold chat requests too)
  POST /collective_rpc          method reload_weights, kwargs.weights_path (HF safetensors dir)
  POST /reset_prefix_cache
  POST /v1/load_lora_adapter, /v1/unload_lora_adapter
                                only with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1

An absent route answers 404 {"detail":"Not Found"}. The API key (VLLM_API_KEY
or --api-key) guards only paths under /v1, /v2, /inference and /cohere, as
vLLM's: /health, /version and the dev routes answer without it.

It answers as vLLM ` + engineserver.CurrentVLLM + ` does; --emulate-vllm VERSION answers as another:

` + engineserver.ProfileHelp() + `
Faults, for tests (--fault NAME[=VALUE], repeatable), quiet as a broken vLLM's:

` + engineserver.FaultHelp() + `
"model" is the served name (--served-model-name) or a loaded adapter's name;
any other name answers 404. Text and chat completions sample one choice
(n=1) and need the model's tokenizer; the tool-call format is detected from
the chat template unless --tool-call-format names it. A chat reply is
sampled whole, then streamed as chunks.

It exists so the vLLM path runs where vLLM is not installed:
` + "`ortrain serve-vllm --command \"ortrain serve-engine\"`" + ` launches and supervises it in
place of ` + "`vllm serve`" + `. It accepts the vllm serve flags the supervisor passes;
--tensor-parallel-size and --gpu-memory-utilization are accepted for that
reason and do not change the results (it runs on --device). Log-probs are
always processed_logprobs (after temperature and truncation). Token-id
completions refuse stop strings, streaming and penalties with HTTP 400.

The listening URL is printed on stdout; logs go to stderr.`,
		Example: `  ortrain init-model --preset tiny --out models/tiny
  ortrain serve-engine --model models/tiny --port 8100

  # any OpenAI client
  curl -s http://127.0.0.1:8100/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"models/tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":16}'

  # as vLLM would be launched by the supervisor (dev routes and runtime LoRA on)
  VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 \
    ortrain serve-engine models/tiny --host 127.0.0.1 --port 8100 --enable-lora --max-lora-rank 16

  # an older vLLM whose reload_weights ignores new weights
  VLLM_SERVER_DEV_MODE=1 ortrain serve-engine models/tiny --fault reload-noop --emulate-vllm 0.14.0`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if opts.Model != "" && opts.Model != args[0] {
					return usageErrorf("the model is given twice (%q and --model %q); give one", args[0], opts.Model)
				}
				opts.Model = args[0]
			}
			opts.IO, opts.Getenv = deps.IO, deps.Getenv
			opts.Logger = deps.Logger.With().Str("command", "serve-engine").Logger()
			if err := opts.readEnv(deps.Getenv); err != nil {
				return err
			}
			if err := opts.validate(); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runServeEngine(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Model, "model", "", "model directory (or the positional MODEL)")
	f.StringVar(&opts.Host, "host", "127.0.0.1", "address to bind (beyond loopback an API key is required)")
	f.StringVar(&opts.APIKey, "api-key", "", "require this Bearer token on /v1, /v2, /inference and /cohere paths, as vLLM (default: $VLLM_API_KEY; prefer the variable: flags show in ps)")
	f.IntVar(&opts.Port, "port", 8000, "port to listen on (0: a free port)")
	f.StringVar(&opts.ServedModelName, "served-model-name", "", "name clients send as \"model\" (default: the model path)")
	f.IntVar(&opts.MaxModelLen, "max-model-len", 0, "prompt + completion cap (default: max_position_embeddings)")
	f.IntVar(&opts.TensorParallel, "tensor-parallel-size", 1, "accepted for vllm serve compatibility")
	f.StringVar(&opts.LogprobsMode, "logprobs-mode", "processed_logprobs", "only processed_logprobs is supported")
	f.StringVar(&opts.GenerationCfg, "generation-config", "vllm", "only vllm (request fields or vLLM defaults, never generation_config.json)")
	f.Float64Var(&opts.GPUMemoryUtil, "gpu-memory-utilization", 0, "accepted for vllm serve compatibility")
	f.BoolVar(&opts.EnableLoRA, "enable-lora", false, "serve LoRA adapters (loaded at run time with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)")
	f.IntVar(&opts.MaxLoRARank, "max-lora-rank", 16, "largest adapter rank: one of "+joinInts(loraRanks()))
	f.IntVar(&opts.MaxLoRAs, "max-loras", 1, "accepted for vllm serve compatibility (adapters are kept in host memory)")
	f.StringVar(&opts.DType, "dtype", "", "compute dtype: float32, bfloat16, float16 (default: float32 on CPU)")
	f.Int64Var(&opts.Seed, "seed", 0, "seed for requests that give none")
	f.BoolVar(&opts.NoAccessLog, "disable-uvicorn-access-log", false, "accepted for vllm serve compatibility (there is no access log)")
	f.StringVar(&opts.Device, "device", "cpu", "worker device: cpu, cuda, cuda:N")
	f.IntVar(&opts.Threads, "threads", 0, "libtorch threads (0: libtorch's default)")
	f.IntVar(&opts.MaxBatch, "max-batch", 64, "most requests merged into one sampling call")
	f.StringVar(&opts.ToolCallFormat, "tool-call-format", "auto", "how the model writes tool calls: auto (detect from the chat template) or one of "+strings.Join(chat.ToolCallFormatNames(), ", "))
	f.StringVar(&opts.EmulateVLLM, "emulate-vllm", engineserver.CurrentVLLM, "answer as this vLLM version: "+strings.Join(engineserver.Versions(), ", "))
	f.StringArrayVar(&opts.FaultSpecs, "fault", nil, "misbehave on purpose, for tests: NAME[=VALUE] (repeatable; see above)")
	f.StringVar(&opts.WorkerLib, "worker-lib", "", "worker library path (default: search $ORTRAIN_WORKER_LIB, next to the binary, build/worker)")
	return cmd
}

func (o *ServeEngineOptions) validate() error {
	switch {
	case o.Model == "":
		return usageErrorf("no model: give MODEL or --model DIR (create one with `ortrain init-model --preset tiny --out DIR`)")
	case o.LogprobsMode != "processed_logprobs":
		return usageErrorf("--logprobs-mode %q: serve-engine returns processed_logprobs only", o.LogprobsMode)
	case o.GenerationCfg != "vllm":
		return usageErrorf("--generation-config %q: serve-engine supports only vllm (send every sampling field)", o.GenerationCfg)
	case o.Port < 0 || o.Port > 65535:
		return usageErrorf("--port %d is not a port", o.Port)
	case !slices.Contains(loraRanks(), o.MaxLoRARank):
		// vLLM's argparse refuses it whether or not --enable-lora is given.
		return usageErrorf("--max-lora-rank %d: invalid choice (choose from %s)", o.MaxLoRARank, joinInts(loraRanks()))
	case o.MaxBatch < 1:
		return usageErrorf("--max-batch %d must be at least 1", o.MaxBatch)
	case o.ToolCallFormat != "auto" && !slices.Contains(chat.ToolCallFormatNames(), o.ToolCallFormat):
		return usageErrorf("--tool-call-format %q: want auto or one of %s", o.ToolCallFormat, strings.Join(chat.ToolCallFormatNames(), ", "))
	case o.APIKey == "" && !vllm.IsLoopback(o.Host):
		return usageErrorf("--host %s is reachable beyond this machine: give an API key (VLLM_API_KEY or --api-key) so /v1 is not open, or bind to 127.0.0.1 "+
			"(as in vLLM, the key does not guard the dev routes)", o.Host)
	}
	if _, err := engineserver.LookupProfile(o.EmulateVLLM); err != nil {
		return usageErrorf("--emulate-vllm: %v", err)
	}
	o.Faults = engineserver.Faults{}
	for _, spec := range o.FaultSpecs {
		if err := o.Faults.Set(spec); err != nil {
			return usageErrorf("--fault %s: %v", spec, err)
		}
	}
	return nil
}

// readEnv reads the variables vLLM reads: the API key (unless --api-key
// gave one), dev mode and runtime LoRA updating.
func (o *ServeEngineOptions) readEnv(getenv func(string) string) error {
	so := engineserver.Options{APIKey: o.APIKey}
	if err := so.ReadVLLMEnv(getenv); err != nil {
		return usageErrorf("%v", err)
	}
	o.APIKey, o.DevMode, o.RuntimeLoRA = so.APIKey, so.DevMode, so.RuntimeLoRA
	return nil
}

// loraRanks are the --max-lora-rank values vLLM accepts, read off
// vllm.LoRARank (the one copy of that set): the ranks it maps to themselves.
func loraRanks() []int {
	var out []int
	for r := 1; r <= 512; r = vllm.LoRARank(r + 1) {
		out = append(out, r)
	}
	return out
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}

func runServeEngine(ctx context.Context, opts *ServeEngineOptions) error {
	// A directory or a Hugging Face repo id in the local cache, as vLLM
	// takes; a missing one is a usage error that says where it looked.
	dir, _, err := model.Resolve(opts.Model, opts.Getenv)
	if err != nil {
		return err
	}
	wo := engineserver.WorkerOptions{ModelDir: dir, WorkerLib: opts.WorkerLib, Getenv: opts.Getenv,
		Device: opts.Device, DType: opts.DType, Threads: opts.Threads, Seed: opts.Seed, Logger: opts.Logger}
	if opts.EnableLoRA {
		wo.LoRARank = opts.MaxLoRARank
	}
	backend, err := engineserver.OpenWorker(ctx, wo)
	if err != nil {
		return err
	}
	defer backend.Close()
	so := engineserver.Options{ModelName: opts.ServedModelName, ModelRoot: dir, MaxModelLen: opts.MaxModelLen,
		EOSIDs: backend.EOSIDs(), VocabSize: backend.VocabSize(), LoRA: opts.EnableLoRA, RuntimeLoRA: opts.RuntimeLoRA, DevMode: opts.DevMode,
		APIKey: opts.APIKey, Version: opts.EmulateVLLM, Faults: opts.Faults, Logger: opts.Logger,
		Batch: engine.BuiltinOptions{MaxBatch: opts.MaxBatch, Linger: 2 * time.Millisecond, Timeout: 10 * time.Minute, Logger: opts.Logger}}
	if so.ModelName == "" {
		so.ModelName = opts.Model
	}
	if so.MaxModelLen == 0 {
		so.MaxModelLen = backend.MaxPositionEmbeddings()
	}
	if so.TextChat, err = textChat(backend, opts); err != nil {
		return err
	}
	srv := engineserver.NewServer(backend, so)
	defer srv.Close()
	l, err := net.Listen("tcp", net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)))
	if err != nil {
		return fmt.Errorf("listen on %s:%d (pick another --port): %w", opts.Host, opts.Port, err)
	}
	fmt.Fprintf(opts.IO.Out, "http://%s\n", l.Addr())
	opts.Logger.Info().Str("url", "http://"+l.Addr().String()).Str("model", so.ModelName).Bool("lora", opts.EnableLoRA).
		Bool("runtime_lora", opts.RuntimeLoRA).Bool("dev_mode", opts.DevMode).Str("vllm", opts.EmulateVLLM).
		Strs("faults", opts.FaultSpecs).Bool("chat", so.TextChat != nil).Msg("Application startup complete.")
	if err := engineserver.Run(ctx, l, srv); err != nil {
		return err
	}
	opts.Logger.Info().Msg("stopped")
	return nil
}

// textChat prepares text and chat completions from the model's tokenizer.
// A model without one still serves token ids (the vLLM path needs no
// more), with a warning; a tool-call format named on the command line
// says chat is wanted, so there it is an error.
func textChat(backend *engineserver.WorkerBackend, opts *ServeEngineOptions) (*engineserver.TextChat, error) {
	tc, err := engineserver.NewTextChat(backend.Tokenizer(), opts.ToolCallFormat)
	if err != nil {
		if opts.ToolCallFormat != "auto" {
			return nil, fmt.Errorf("--tool-call-format %s: text and chat completions need the tokenizer of %s: %w", opts.ToolCallFormat, opts.Model, err)
		}
		opts.Logger.Warn().Err(err).Msg("text and chat completions are off: serving token-id completions only")
		return nil, nil
	}
	for _, w := range tc.Warnings {
		opts.Logger.Warn().Msg(w)
	}
	opts.Logger.Info().Stringer("tool_call_format", tc.Format()).Msg("serving text and chat completions")
	return tc, nil
}
