package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// probeCommand is the hidden subcommand that opens the worker library in a
// short-lived child, so a libtorch that aborts on load cannot take doctor down.
const probeCommand = "__probe-worker"

// probeTimeout bounds the child's dlopen of libtorch.
const probeTimeout = 60 * time.Second

// DoctorOptions are the inputs of `ortrain doctor`.
type DoctorOptions struct {
	IO         *IOStreams
	Getenv     func(string) string
	Executable func() (string, error)
	WorkerLib  string
	JSON       bool
	// Probe opens the library and reports it (and the decode kernels it
	// measures); nil runs probeCommand in a child of Executable.
	Probe func(ctx context.Context, lib string) (workerProbe, error)
	// LookPath finds optional tools (vllm); nil means exec.LookPath.
	LookPath func(string) (string, error)
}

// Check is one line of doctor's report; Fix is the command that would turn
// a failed check into a passing one. Required checks fail the command.
type Check struct {
	Name     string `json:"name"`
	OK       bool   `json:"ok"`
	Required bool   `json:"required"`
	Detail   string `json:"detail"`
	Fix      string `json:"fix,omitempty"`
}

const buildFix = "scripts/install-libtorch.sh && scripts/build-worker.sh (or set ORTRAIN_WORKER_LIB)"

func newDoctorCmd(deps *Deps, runF func(context.Context, *DoctorOptions) error) *cobra.Command {
	opts := &DoctorOptions{}
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Report what is installed: the worker library, libtorch, CUDA devices, vLLM",
		Long: `Check what ortrain can use on this machine and say how to fix what is missing.
One line per capability: the ortrain binary, the libtorch worker library (where it
was found, which libtorch it was built against, its ABI), the c10d backends compiled
into it (Gloo, NCCL), whether libtorch's TCPStore has libuv, whether CPU sampling
reaches oneDNN's sgemm, CUDA devices seen by libtorch, the BLAS libtorch uses on CPU,
and vLLM. Each ✗ line carries the command that fixes it or what it costs. The worker library is opened in a short-lived child process, so a
broken libtorch cannot crash doctor itself.

Exit status 1 when a capability training needs (the worker library) is missing;
optional ones (CUDA, vLLM) only print ✗.`,
		Example: `  ortrain doctor
  ortrain doctor --worker-lib build/worker/libortrain_worker.so --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.IO, opts.Getenv, opts.Executable = deps.IO, deps.Getenv, deps.Executable
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runDoctor(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.WorkerLib, "worker-lib", "", "path of the worker library (default: $ORTRAIN_WORKER_LIB, next to the binary, build/worker/)")
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print the checks as JSON")
	return cmd
}

// newProbeWorkerCmd is doctor's child: open the library, print its Info.
func newProbeWorkerCmd(deps *Deps) *cobra.Command {
	var lib string
	cmd := &cobra.Command{
		Use:    probeCommand + " --lib PATH",
		Short:  "Open the worker library and print its info as JSON (used by doctor)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := worker.Open(lib)
			if err != nil {
				return err
			}
			p := workerProbe{Info: l.Info()}
			// The decode kernels of a CPU benchmark model's shapes, as a
			// run's load would choose them (cached for this machine).
			preset, _ := model.PresetByName(kernelsPreset)
			k, err := l.ChooseDecodeKernels(cmd.Context(), worker.KernelsAuto, &preset.Config, runtime.NumCPU(), worker.KernelCacheDir(deps.Getenv))
			if err != nil {
				p.DecodeKernelsError = err.Error()
			} else {
				p.DecodeKernels = &k
			}
			return json.NewEncoder(deps.IO.Out).Encode(p)
		},
	}
	cmd.Flags().StringVar(&lib, "lib", "", "library path")
	return cmd
}

func runDoctor(ctx context.Context, opts *DoctorOptions) error {
	checks := doctorChecks(ctx, opts)
	if opts.JSON {
		enc := json.NewEncoder(opts.IO.Out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(checks); err != nil {
			return err
		}
	} else {
		for _, c := range checks {
			mark := "✓"
			if !c.OK {
				mark = "✗"
			}
			fmt.Fprintf(opts.IO.Out, "%s %-16s %s\n", mark, c.Name, c.Detail)
			if !c.OK && c.Fix != "" {
				fmt.Fprintf(opts.IO.Out, "  %-16s fix: %s\n", "", c.Fix)
			}
		}
	}
	var missing []string
	for _, c := range checks {
		if c.Required && !c.OK {
			missing = append(missing, c.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("doctor: not ready to train: %s (see the fix lines above)", strings.Join(missing, ", "))
	}
	return ctx.Err()
}

func doctorChecks(ctx context.Context, opts *DoctorOptions) []Check {
	exe, err := opts.Executable()
	if err != nil {
		exe = "unknown (" + err.Error() + ")"
	}
	checks := []Check{{Name: "ortrain", OK: true, Required: true,
		Detail: fmt.Sprintf("%s (%s, %s/%s) %s", Version(), runtime.Version(), runtime.GOOS, runtime.GOARCH, exe)}}
	if !worker.CGOEnabled { // no library can be opened: rebuilding it would not help
		checks[0].OK = false
		checks[0].Detail += ": built without cgo (CGO_ENABLED=0), so it cannot open the worker: training, sampling and checkpoints are out; env serve/check/list and list-tasks work"
		checks[0].Fix = "build ortrain with cgo and a C compiler: make build (CGO_ENABLED=1)"
		return append(checks, vllmCheck(opts))
	}
	lib, searched, err := worker.FindLibrary(opts.WorkerLib, opts.Getenv)
	if err != nil {
		detail := err.Error()
		if worker.IsNotFound(err) {
			detail = "not found (searched: " + strings.Join(searched, ", ") + ")"
		}
		return append(checks, Check{Name: "worker library", Required: true, Detail: detail, Fix: buildFix}, vllmCheck(opts))
	}
	checks = append(checks, Check{Name: "worker library", OK: true, Required: true, Detail: lib})
	probe := opts.Probe
	if probe == nil {
		probe = func(ctx context.Context, lib string) (workerProbe, error) {
			return probeInChild(ctx, exe, nil, nil, lib)
		}
	}
	probed, err := probe(ctx, lib)
	info := probed.Info
	if err != nil {
		checks = append(checks, Check{Name: "libtorch", Required: true, Detail: "worker library does not load: " + err.Error(),
			Fix: "rebuild against the installed libtorch: scripts/build-worker.sh"})
		return append(checks, vllmCheck(opts))
	}
	checks = append(checks, Check{Name: "libtorch", OK: true, Required: true, Detail: fmt.Sprintf(
		"%s (worker ABI %d, CXX11 ABI %v, %d intra-op threads by default)", info.LibtorchVersion, info.ABIVersion, info.CXX11ABI, info.Threads)})
	checks = append(checks, c10dChecks(info)...)
	checks = append(checks, storeCheck(info), oneDNNCheck(info), decodeKernelsCheck(probed))
	if info.CUDADevices > 0 {
		checks = append(checks, Check{Name: "CUDA", OK: true, Detail: fmt.Sprintf("%d device(s): use device cuda:0 …", info.CUDADevices)})
	} else {
		checks = append(checks, Check{Name: "CUDA", Detail: "no CUDA devices visible to libtorch: training runs on CPU",
			Fix: "on a GPU machine: pip install torch (CUDA build), then scripts/build-worker.sh"})
		checks = append(checks, blasCheck())
	}
	return append(checks, vllmCheck(opts))
}

// rebuildFix is the fix for a report the worker library predates.
const rebuildFix = "rebuild the worker library: scripts/build-worker.sh"

// c10dChecks report the process-group backends compiled into the worker.
func c10dChecks(info worker.Info) []Check {
	gloo := Check{Name: "c10d Gloo", OK: true, Detail: "compiled in: data-parallel training on CPU"}
	if !slices.Contains(info.DistBackends, "gloo") {
		gloo = Check{Name: "c10d Gloo", Detail: "not compiled in: data-parallel training on CPU (--nproc-per-node, torchrun) fails at start",
			Fix: "apt-get install libgloo-dev, then scripts/build-worker.sh (its c10d line says why Gloo is missing)"}
	}
	nccl := Check{Name: "c10d NCCL", OK: true, Detail: "compiled in: data-parallel training on CUDA"}
	if !slices.Contains(info.DistBackends, "nccl") {
		nccl = Check{Name: "c10d NCCL", Detail: "not compiled in: data-parallel training on CUDA devices fails at start",
			Fix: "on a GPU machine: pip install torch (CUDA build, with nvidia-nccl), then scripts/build-worker.sh"}
	}
	return []Check{gloo, nccl}
}

// storeCheck reports whether libtorch's TCPStore (the rendezvous of
// data-parallel runs) can serve with libuv, its default from 2.4.
func storeCheck(info worker.Info) Check {
	const name = "TCPStore libuv"
	st := info.Store
	switch {
	case st == nil:
		return Check{Name: name, Detail: "unknown: the worker library does not report it", Fix: rebuildFix}
	case st.LibUV:
		return Check{Name: name, OK: true, Detail: "available (libtorch's default store)"}
	case !st.LibUVDefault:
		return Check{Name: name, OK: true, Detail: "not used: " + st.Detail}
	}
	return Check{Name: name, Detail: "missing (" + st.Detail + "): data-parallel runs serve the classic store instead, " +
		"which is fine for a few ranks", Fix: "optional: pip install torch (the wheels have libuv), then scripts/build-worker.sh"}
}

// oneDNNCheck reports whether oneDNN's sgemm is there for CPU sampling to
// choose (csrc/onednn.cpp); decodeKernelsCheck what it chose.
func oneDNNCheck(info worker.Info) Check {
	const name = "oneDNN decode"
	d := info.OneDNN
	switch {
	case d == nil:
		return Check{Name: name, Detail: "unknown: the worker library does not report it", Fix: rebuildFix}
	case d.Active:
		return Check{Name: name, OK: true, Detail: "active: dnnl_sgemm from " + d.Library}
	}
	return Check{Name: name, Detail: "inactive (" + d.Detail + "): CPU sampling runs its matmuls on at::mm, " +
		"which on some CPUs is several times slower at a few rows (the decode kernels line measures this one)", Fix: "a libtorch whose libtorch_cpu links libdnnl (Debian's libtorch-dev) or exports dnnl_sgemm, then scripts/build-worker.sh"}
}

// workerProbe is what the probe child prints: the library's Info and the
// decode kernels it measured on kernelsPreset's shapes.
type workerProbe struct {
	worker.Info
	DecodeKernels      *worker.DecodeKernels `json:"decode_kernels,omitempty"`
	DecodeKernelsError string                `json:"decode_kernels_error,omitempty"`
}

// kernelsPreset is the model whose decode shapes doctor measures.
const kernelsPreset = "small100m"

// decodeKernelsCheck shows the decode kernels a CPU float32 model of
// kernelsPreset's shapes gets here and the numbers behind the choice.
func decodeKernelsCheck(p workerProbe) Check {
	const name = "decode kernels"
	switch {
	case p.DecodeKernelsError != "":
		return Check{Name: name, Detail: "not measured: " + p.DecodeKernelsError, Fix: rebuildFix}
	case p.DecodeKernels == nil:
		return Check{Name: name, Detail: "unknown: the probe did not measure them", Fix: rebuildFix}
	}
	k := *p.DecodeKernels
	parts := []string{fmt.Sprintf("%s's shapes: %s", kernelsPreset, k.Summary())}
	for _, rows := range []int64{1, 16, 128} {
		var on, mm []float64
		for _, g := range k.Bench.Gemm {
			if g.Rows != rows || g.ATenSeconds <= 0 {
				continue
			}
			mm = append(mm, g.GFLOPS(g.ATenSeconds))
			if g.OneDNNSeconds > 0 {
				on = append(on, g.GFLOPS(g.OneDNNSeconds))
			}
		}
		if len(mm) > 0 {
			parts = append(parts, fmt.Sprintf("%d rows: oneDNN %s, at::mm %s GFLOP/s", rows, gflopsRange(on), gflopsRange(mm)))
		}
	}
	for _, a := range k.Bench.Attention {
		if a.ATenSeconds > 0 && a.FusedSeconds > 0 {
			parts = append(parts, fmt.Sprintf("attention at %d rows: fused %.0f µs, ATen %.0f µs", a.Rows, a.FusedSeconds*1e6, a.ATenSeconds*1e6))
		}
	}
	if k.CachePath != "" {
		parts = append(parts, "cache "+k.CachePath)
	}
	return Check{Name: name, OK: true, Detail: strings.Join(parts, "; ")}
}

// gflopsRange is "min–max" of rates, or "n/a".
func gflopsRange(xs []float64) string {
	if len(xs) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f–%.0f", slices.Min(xs), slices.Max(xs))
}

// probeInChild runs `exe [prefix...] __probe-worker --lib lib` with a
// timeout and decodes the report it prints.
func probeInChild(ctx context.Context, exe string, prefix, env []string, lib string) (workerProbe, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	args := append(append([]string{}, prefix...), probeCommand, "--lib", lib)
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		tail := strings.TrimSpace(errOut.String())
		if len(tail) > 600 {
			tail = "…" + tail[len(tail)-600:]
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return workerProbe{}, fmt.Errorf("probe timed out after %s: %s", probeTimeout, tail)
		}
		return workerProbe{}, fmt.Errorf("probe child failed (%v): %s", err, tail)
	}
	var info workerProbe
	if err := json.Unmarshal(out.Bytes(), &info); err != nil {
		return workerProbe{}, fmt.Errorf("probe child printed no info: %w (%q)", err, out.String())
	}
	return info, nil
}

// blasCheck looks at which BLAS libtorch's libblas.so.3 resolves to: the
// reference BLAS makes fp32 matmul about 14x slower than OpenBLAS.
func blasCheck() Check {
	const fix = "apt-get install libopenblas0-openmp (scripts/install-libtorch.sh does this)"
	matches, _ := filepath.Glob("/usr/lib/*/libblas.so.3")
	if len(matches) == 0 {
		return Check{Name: "BLAS", OK: true, Detail: "no system libblas.so.3 (libtorch bundles its own)"}
	}
	real, err := filepath.EvalSymlinks(matches[0])
	if err != nil {
		return Check{Name: "BLAS", Detail: err.Error(), Fix: fix}
	}
	if strings.Contains(real, "openblas") || strings.Contains(real, "mkl") || strings.Contains(real, "blis") {
		return Check{Name: "BLAS", OK: true, Detail: real}
	}
	return Check{Name: "BLAS", Detail: real + " is the slow reference BLAS", Fix: fix}
}

func vllmCheck(opts *DoctorOptions) Check {
	look := opts.LookPath
	if look == nil {
		look = exec.LookPath
	}
	if p, err := look("vllm"); err == nil {
		return Check{Name: "vLLM", OK: true, Detail: p}
	}
	return Check{Name: "vLLM", Detail: "not on PATH (optional: the built-in worker generates)", Fix: "pip install vllm (on a GPU machine)"}
}
