package vllm

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// DefaultCommand is the program a replica runs when the launch config names
// none: `vllm serve MODEL ...`.
var DefaultCommand = []string{"vllm", "serve"}

// LoRALaunch turns on runtime LoRA adapter loading.
type LoRALaunch struct {
	MaxRank  int // --max-lora-rank: the largest adapter rank served
	MaxLoras int // --max-loras: adapters resident at once (>= staleness + 1)
}

// LoRARank is the --max-lora-rank that serves adapters of rank: the
// smallest size vLLM allows that holds it (vLLM accepts only 1, 8, 16, 32,
// 64, 128, 256, 320 and 512). Above 512 it is rank itself, which vLLM
// refuses with its own message.
func LoRARank(rank int) int {
	for _, allowed := range [...]int{1, 8, 16, 32, 64, 128, 256, 320, 512} {
		if allowed >= rank {
			return allowed
		}
	}
	return rank
}

// LaunchConfig describes the command of every replica; the port and GPUs are
// per replica.
type LaunchConfig struct {
	// Command is the program and its leading arguments; empty means
	// DefaultCommand. Tests use `ortrain serve-engine`.
	Command []string
	// Self is the running ortrain binary: a Command whose program is
	// "ortrain" runs Self, so replicas use the same build as the trainer.
	Self string
	// Model is a local model directory, given as the positional argument.
	Model string
	// ServedModelName is the name clients send; empty: the model path.
	ServedModelName string
	// Host to serve on; empty means 127.0.0.1. Beyond loopback an APIKey
	// is required, vLLM itself binds 127.0.0.1 (see bindHost), and
	// ortrain's guard (internal/vllmguard) serves Host, requiring the key
	// on every route: vLLM's own key leaves /pause, /collective_rpc and
	// the other control routes open.
	Host string
	// APIKey reaches the replica as VLLM_API_KEY (vLLM's --api-key, read by
	// serve-engine too), never on the command line where ps shows it.
	APIKey               string
	TensorParallelSize   int     // 0 or 1: one GPU per replica
	GPUMemoryUtilization float64 // 0: vLLM's default
	MaxModelLen          int     // 0: the model's
	DType                string  // empty: the checkpoint's
	Seed                 *int64
	LoRA                 *LoRALaunch
	// ExtraArgs are appended verbatim (after ortrain's own flags, so they win).
	ExtraArgs []string
	// Environ is the parent's environment, filtered by ChildEnv.
	Environ []string
	// ExtraEnv (KEY=VALUE) is added after the filtered environment.
	ExtraEnv []string
}

// Argv is the replica's command line for port, bound to bindHost.
func (c *LaunchConfig) Argv(port int) []string {
	argv := slices.Clone(c.Command)
	if len(argv) == 0 {
		argv = slices.Clone(DefaultCommand)
	}
	if argv[0] == "ortrain" && c.Self != "" {
		argv[0] = c.Self
	}
	argv = append(argv, c.Model,
		"--host", c.bindHost(), "--port", strconv.Itoa(port),
		"--logprobs-mode", "processed_logprobs",
		"--generation-config", "vllm",
		"--tensor-parallel-size", strconv.Itoa(max(c.TensorParallelSize, 1)),
		"--disable-uvicorn-access-log",
	)
	if c.ServedModelName != "" {
		argv = append(argv, "--served-model-name", c.ServedModelName)
	}
	if c.GPUMemoryUtilization > 0 {
		argv = append(argv, "--gpu-memory-utilization", strconv.FormatFloat(c.GPUMemoryUtilization, 'g', -1, 64))
	}
	if c.MaxModelLen > 0 {
		argv = append(argv, "--max-model-len", strconv.Itoa(c.MaxModelLen))
	}
	if c.DType != "" {
		argv = append(argv, "--dtype", c.DType)
	}
	if c.Seed != nil {
		argv = append(argv, "--seed", strconv.FormatInt(*c.Seed, 10))
	}
	if c.LoRA != nil {
		argv = append(argv, "--enable-lora",
			"--max-lora-rank", strconv.Itoa(c.LoRA.MaxRank),
			"--max-loras", strconv.Itoa(max(c.LoRA.MaxLoras, 1)))
	}
	return append(argv, c.ExtraArgs...)
}

func (c *LaunchConfig) host() string {
	if c.Host == "" {
		return "127.0.0.1"
	}
	return c.Host
}

// bindHost is the address vLLM itself binds: Host on loopback, else
// 127.0.0.1, where only this machine (and the guard in front) reaches it.
func (c *LaunchConfig) bindHost() string {
	if IsLoopback(c.host()) {
		return c.host()
	}
	return "127.0.0.1"
}

// CheckExposure refuses a bind beyond loopback without an API key.
func (c *LaunchConfig) CheckExposure() error {
	if c.APIKey == "" && !IsLoopback(c.host()) {
		return &ExposedError{Host: c.host()}
	}
	return nil
}

// ExposedError: replicas would listen beyond loopback without an API key.
type ExposedError struct{ Host string }

func (e *ExposedError) Error() string {
	return fmt.Sprintf("host %s is reachable beyond this machine, and ortrain's guard in front of the replicas requires an API key on every route there: "+
		"set engine.vllm_api_key (ORTRAIN_ENGINE_VLLM_API_KEY) for ortrain run, VLLM_API_KEY for serve-vllm, or bind to 127.0.0.1", e.Host)
}

// IsLoopback reports whether host (a name or an address) only reaches
// this machine.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// ClientHost is the address this machine's clients use for a replica bound
// to host: a wildcard bind is reached over loopback.
func ClientHost(host string) string {
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil && ip.IsUnspecified() {
		return "127.0.0.1"
	}
	return host
}

// Env is the replica's environment: the filtered parent environment, the
// replica's GPUs, dev mode (for /pause, /collective_rpc, /reset_prefix_cache)
// and runtime LoRA updating when LoRA is on.
func (c *LaunchConfig) Env(gpus []int) []string {
	env := ChildEnv(c.Environ)
	env = append(env, "CUDA_VISIBLE_DEVICES="+JoinGPUs(gpus), "VLLM_SERVER_DEV_MODE=1")
	if c.LoRA != nil {
		env = append(env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1")
	}
	if c.TensorParallelSize > 1 || c.LoRA != nil {
		env = append(env, "VLLM_WORKER_MULTIPROC_METHOD=spawn")
	}
	if c.APIKey != "" {
		env = append(env, "VLLM_API_KEY="+c.APIKey)
	}
	return append(env, c.ExtraEnv...)
}

// childEnvPrefixes are the parent variables a replica may inherit: what
// Python, CUDA, Hugging Face and the worker library need; nothing else.
var childEnvPrefixes = []string{
	"PATH=", "HOME=", "USER=", "LANG=", "LC_", "TMPDIR=", "TZ=", "XDG_",
	"PYTHON", "VIRTUAL_ENV=", "CONDA_", "LD_LIBRARY_PATH=",
	"HF_", "TRANSFORMERS_", "VLLM_", "CUDA_", "NCCL_", "TORCH", "TRITON_", "NVIDIA_",
	"ORTRAIN_WORKER_LIB=",
}

// ChildEnv keeps the allowed variables of environ, minus anything that looks
// like a secret, and minus the ones Env sets itself.
func ChildEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if isSecretName(name) || name == "CUDA_VISIBLE_DEVICES" || name == "VLLM_SERVER_DEV_MODE" {
			continue
		}
		for _, p := range childEnvPrefixes {
			if strings.HasPrefix(kv, p) {
				out = append(out, kv)
				break
			}
		}
	}
	return out
}

func isSecretName(name string) bool {
	up := strings.ToUpper(name)
	for _, s := range []string{"KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"} {
		if strings.Contains(up, s) {
			return true
		}
	}
	return false
}

// PortInUseError says a fixed port cannot be bound.
type PortInUseError struct {
	Addr string
	Err  error
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("port %s is in use (%v): stop what listens there, pick another --port, or use port 0 for free ports", e.Addr, e.Err)
}

// CheckPort fails with *PortInUseError when host:port cannot be bound now.
func CheckPort(host string, port int) error {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return &PortInUseError{Addr: addr, Err: err}
	}
	return l.Close()
}

// FreePort asks the kernel for a port that is free on host right now. The
// child binds it moments later; a lost race shows up as a crashed start and
// is retried on a new port.
func FreePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("pick a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
