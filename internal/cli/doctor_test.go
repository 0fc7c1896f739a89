package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/worker"
)

func doctorOpts(env map[string]string) (*DoctorOptions, *bytes.Buffer) {
	io, out, _ := TestIO()
	return &DoctorOptions{
		IO:         io,
		Getenv:     func(k string) string { return env[k] },
		Executable: func() (string, error) { return "/opt/ortrain/bin/ortrain", nil },
		LookPath:   func(string) (string, error) { return "", errors.New("not found") },
	}, out
}

func TestDoctorMissingLibrary(t *testing.T) {
	opts, out := doctorOpts(nil)
	opts.WorkerLib = filepath.Join(t.TempDir(), "libortrain_worker.so")
	err := runDoctor(context.Background(), opts)
	require.ErrorContains(t, err, "worker library")
	assert.Contains(t, out.String(), "✓ ortrain")
	assert.Contains(t, out.String(), "✗ worker library")
	assert.Contains(t, out.String(), "fix: scripts/install-libtorch.sh && scripts/build-worker.sh")
	assert.Contains(t, out.String(), "✗ vLLM")
	assert.Contains(t, out.String(), "fix: pip install vllm")
}

func TestDoctorReportsProbedLibrary(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libortrain_worker.so")
	require.NoError(t, os.WriteFile(lib, []byte("x"), 0o644))
	for _, tc := range []struct {
		name    string
		info    worker.Info
		err     error
		wantErr bool
		want    []string
	}{
		{"cpu", worker.Info{LibtorchVersion: "1.13.0", ABIVersion: 1, Threads: 2}, nil, false,
			[]string{"✓ worker library", "✓ libtorch", "1.13.0 (worker ABI 1", "✗ CUDA", "fix: on a GPU machine"}},
		{"debian 2.14", worker.Info{LibtorchVersion: "2.14.1", ABIVersion: 6, DistBackends: []string{"gloo"},
			OneDNN: &worker.OneDNNInfo{Active: true, Library: "/usr/lib/x86_64-linux-gnu/libdnnl.so.3.6"},
			Store:  &worker.StoreInfo{LibUVDefault: true, Detail: "libtorch was built without libuv"}}, nil, false,
			[]string{"✓ c10d Gloo", "✗ c10d NCCL", "✓ oneDNN decode", "active: dnnl_sgemm from /usr/lib/x86_64-linux-gnu/libdnnl.so.3.6",
				"✗ TCPStore libuv   missing (libtorch was built without libuv): data-parallel runs serve the classic store instead", "fix: optional: pip install torch"}},
		{"gpu", worker.Info{LibtorchVersion: "2.5.1", ABIVersion: 1, CUDADevices: 2}, nil, false,
			[]string{"✓ libtorch", "2.5.1", "✓ CUDA", "2 device(s)"}},
		{"broken", worker.Info{}, errors.New("undefined symbol: _ZN3c10"), true,
			[]string{"✗ libtorch", "undefined symbol", "fix: rebuild against the installed libtorch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, out := doctorOpts(map[string]string{worker.EnvLibrary: lib})
			opts.Probe = func(_ context.Context, got string) (workerProbe, error) {
				assert.Equal(t, lib, got)
				return workerProbe{Info: tc.info}, tc.err
			}
			err := runDoctor(context.Background(), opts)
			if tc.wantErr {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			for _, w := range tc.want {
				assert.Contains(t, out.String(), w)
			}
		})
	}
}

// TestDoctorWorkerCapabilities: one line each for the c10d backends, the
// TCPStore's libuv and the oneDNN decode path, a ✗ carrying its fix or
// cost, and none of them failing the command (all are optional).
func TestDoctorWorkerCapabilities(t *testing.T) {
	for _, tc := range []struct {
		name string
		info worker.Info
		want []Check
	}{
		{"debian 1.13 cpu", worker.Info{LibtorchVersion: "1.13.0", DistBackends: []string{"gloo"},
			OneDNN: &worker.OneDNNInfo{Active: true, Library: "/usr/lib/x86_64-linux-gnu/libdnnl.so.2"},
			Store:  &worker.StoreInfo{Detail: "libtorch 1.13 serves the classic store by default"}},
			[]Check{
				{Name: "c10d Gloo", OK: true, Detail: "compiled in: data-parallel training on CPU"},
				{Name: "c10d NCCL", Detail: "not compiled in: data-parallel training on CUDA devices fails at start"},
				{Name: "TCPStore libuv", OK: true, Detail: "not used: libtorch 1.13 serves the classic store by default"},
				{Name: "oneDNN decode", OK: true, Detail: "active: dnnl_sgemm from /usr/lib/x86_64-linux-gnu/libdnnl.so.2"},
			}},
		{"pip 2.6 cuda", worker.Info{LibtorchVersion: "2.6.0", CUDADevices: 1, DistBackends: []string{"gloo", "nccl"},
			OneDNN: &worker.OneDNNInfo{Detail: "no libdnnl.so* is loaded and libtorch_cpu.so does not export dnnl_sgemm"},
			Store:  &worker.StoreInfo{LibUVDefault: true, LibUV: true}},
			[]Check{
				{Name: "c10d Gloo", OK: true, Detail: "compiled in: data-parallel training on CPU"},
				{Name: "c10d NCCL", OK: true, Detail: "compiled in: data-parallel training on CUDA"},
				{Name: "TCPStore libuv", OK: true, Detail: "available (libtorch's default store)"},
				{Name: "oneDNN decode", Detail: "inactive (no libdnnl.so* is loaded and libtorch_cpu.so does not export dnnl_sgemm): " +
					"CPU sampling runs its matmuls on at::mm, which on some CPUs is several times slower at a few rows (the decode kernels line measures this one)"},
			}},
		{"no backends", worker.Info{LibtorchVersion: "2.14.1"}, []Check{
			{Name: "c10d Gloo", Detail: "not compiled in: data-parallel training on CPU (--nproc-per-node, torchrun) fails at start"},
			{Name: "TCPStore libuv", Detail: "unknown: the worker library does not report it", Fix: rebuildFix},
			{Name: "oneDNN decode", Detail: "unknown: the worker library does not report it", Fix: rebuildFix},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lib := filepath.Join(t.TempDir(), "libortrain_worker.so")
			require.NoError(t, os.WriteFile(lib, []byte("x"), 0o644))
			opts, out := doctorOpts(map[string]string{worker.EnvLibrary: lib})
			opts.JSON = true
			opts.Probe = func(context.Context, string) (workerProbe, error) { return workerProbe{Info: tc.info}, nil }
			require.NoError(t, runDoctor(context.Background(), opts))
			var checks []Check
			require.NoError(t, json.Unmarshal(out.Bytes(), &checks))
			byName := map[string]Check{}
			for _, c := range checks {
				byName[c.Name] = c
			}
			for _, w := range tc.want {
				got, ok := byName[w.Name]
				require.True(t, ok, "no %q check in %v", w.Name, checks)
				assert.Equal(t, w.OK, got.OK, w.Name)
				assert.False(t, got.Required, w.Name)
				assert.Equal(t, w.Detail, got.Detail, w.Name)
				if w.OK {
					assert.Empty(t, got.Fix, w.Name)
				} else {
					assert.NotEmpty(t, got.Fix, w.Name)
				}
				if w.Fix != "" {
					assert.Equal(t, w.Fix, got.Fix, w.Name)
				}
			}
		})
	}
}

func TestDoctorJSON(t *testing.T) {
	opts, out := doctorOpts(nil)
	opts.WorkerLib, opts.JSON = "/nonexistent/lib.so", true
	require.Error(t, runDoctor(context.Background(), opts))
	var checks []Check
	require.NoError(t, json.Unmarshal(out.Bytes(), &checks))
	require.Len(t, checks, 3)
	assert.Equal(t, "worker library", checks[1].Name)
	assert.False(t, checks[1].OK)
	assert.True(t, checks[1].Required)
	assert.NotEmpty(t, checks[1].Fix)
}

// TestHelperProbeProcess is not a test: it is the child process of
// TestDoctorProbesInChild, run as the test binary with ORTRAIN_PROBE_CHILD=1.
func TestHelperProbeProcess(t *testing.T) {
	if os.Getenv("ORTRAIN_PROBE_CHILD") != "1" {
		return
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(Execute(context.Background(), SystemDeps(), args))
}

// TestDoctorProbesInChild runs the real hidden probe command in a child
// process against a missing library (always) and the built worker (when
// present).
func TestDoctorProbesInChild(t *testing.T) {
	prefix, env := []string{"-test.run=^TestHelperProbeProcess$", "--"}, []string{"ORTRAIN_PROBE_CHILD=1"}
	_, err := probeInChild(context.Background(), os.Args[0], prefix, env, filepath.Join(t.TempDir(), "missing.so"))
	require.ErrorContains(t, err, "build-worker.sh")
	lib, _, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_WORKER is set but the worker library is missing: %v", err)
		}
		t.Logf("worker library not built; probed only the missing-library path")
		return
	}
	cache := t.TempDir()
	info, err := probeInChild(context.Background(), os.Args[0], prefix, append(env, "ORTRAIN_CACHE_DIR="+cache), lib)
	require.NoError(t, err)
	assert.Equal(t, worker.ABIVersion, info.ABIVersion)
	assert.NotEmpty(t, info.LibtorchVersion)
	assert.Equal(t, lib, info.Path)
	// The child measured the decode kernels on small100m's shapes, into the
	// cache it was given, and doctor shows the choice with its numbers.
	require.Empty(t, info.DecodeKernelsError)
	require.NotNil(t, info.DecodeKernels)
	assert.True(t, info.DecodeKernels.Applies)
	assert.Equal(t, "measured", info.DecodeKernels.Source)
	assert.FileExists(t, filepath.Join(cache, "decode-kernels.json"))
	c := decodeKernelsCheck(info)
	assert.True(t, c.OK)
	for _, want := range []string{"small100m's shapes: auto (measured in", "1 rows: oneDNN", "16 rows: oneDNN", "at::mm", "GFLOP/s", "attention at 16 rows: fused", "cache " + cache} {
		assert.Contains(t, c.Detail, want)
	}
	t.Logf("doctor: %s", c.Detail)
}
