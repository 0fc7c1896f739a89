package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// The decode-kernel cache: one JSON file per cache directory holding every
// measurement this machine made, per machine key (CPU, libtorch, oneDNN,
// threads). A machine measures a shape once; every later load of a model
// with that shape takes the same numbers, so the same config and seed
// choose the same kernels and sample the same tokens, across processes and
// --resume. An flock serialises the read-measure-write of processes that
// load at once (ranks, the sampler copy, parallel tests).
const (
	kernelCacheFile    = "decode-kernels.json"
	kernelCacheVersion = 1
	// kernelCacheWait bounds waiting for another process's measurement.
	kernelCacheWait = 60 * time.Second
)

// KernelCacheDir is where decode-kernel measurements are kept by default:
// $ORTRAIN_CACHE_DIR, else the user's cache directory's ortrain/.
func KernelCacheDir(getenv func(string) string) string {
	if d := getenv("ORTRAIN_CACHE_DIR"); d != "" {
		return d
	}
	if d := getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "ortrain")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".cache", "ortrain")
	}
	return ""
}

type kernelCache struct {
	Version  int                            `json:"version"`
	Machines map[string]*KernelMeasurements `json:"machines"`
}

// KernelMeasurements are one machine's cached decode-kernel timings.
type KernelMeasurements struct {
	CPU       CPU               `json:"cpu"`
	Libtorch  string            `json:"libtorch"`
	OneDNN    string            `json:"onednn"`
	Threads   int               `json:"threads"`
	Gemm      []GemmTiming      `json:"gemm"`
	Attention []AttentionTiming `json:"attention"`
}

// key identifies the machine and settings the timings hold for.
func (m *KernelMeasurements) key() string {
	return fmt.Sprintf("%s|%s|%s|%s|threads=%d", m.CPU.Model, m.CPU.FlagsHash, m.Libtorch, m.OneDNN, m.Threads)
}

func sameGemm(a, b GemmTiming) bool {
	return a.Rows == b.Rows && a.K == b.K && a.N == b.N && a.Serial == b.Serial
}

func sameAttention(a, b AttentionTiming) bool {
	return a.Rows == b.Rows && a.Heads == b.Heads && a.KVHeads == b.KVHeads && a.HeadDim == b.HeadDim &&
		a.Keys == b.Keys && a.Serial == b.Serial
}

// fill copies cached numbers into want and returns what is still missing.
func (m *KernelMeasurements) fill(want KernelBench) (KernelBench, KernelBench) {
	var missing KernelBench
	for i, w := range want.Gemm {
		found := false
		for _, c := range m.Gemm {
			if sameGemm(w, c) && c.measured() {
				want.Gemm[i], found = c, true
				break
			}
		}
		if !found {
			missing.Gemm = append(missing.Gemm, w)
		}
	}
	for i, w := range want.Attention {
		found := false
		for _, c := range m.Attention {
			if sameAttention(w, c) && c.measured() {
				want.Attention[i], found = c, true
				break
			}
		}
		if !found {
			missing.Attention = append(missing.Attention, w)
		}
	}
	return want, missing
}

// merge adds measured entries that are not cached yet.
func (m *KernelMeasurements) merge(got KernelBench) {
	for _, g := range got.Gemm {
		if g.measured() && !containsFunc(m.Gemm, g, sameGemm) {
			m.Gemm = append(m.Gemm, g)
		}
	}
	for _, a := range got.Attention {
		if a.measured() && !containsFunc(m.Attention, a, sameAttention) {
			m.Attention = append(m.Attention, a)
		}
	}
}

func containsFunc[T any](xs []T, x T, same func(a, b T) bool) bool {
	for _, y := range xs {
		if same(x, y) {
			return true
		}
	}
	return false
}

// cachedBench fills want from the cache in dir and measures (with measure)
// only what it lacks, adding that to the cache. With dir "" or a cache that
// cannot be used it measures everything; cacheErr then says why the cache
// was not used (not an error of the load). fromCache reports whether every
// entry came from the file.
func cachedBench(ctx context.Context, dir string, machine KernelMeasurements, want KernelBench,
	measure func(KernelBench) (KernelBench, error)) (got KernelBench, fromCache bool, cacheErr, err error) {
	if dir == "" {
		got, err = measure(want)
		return got, false, errors.New("no cache directory (set ORTRAIN_CACHE_DIR or HOME)"), err
	}
	unlock, lerr := lockKernelCache(ctx, dir)
	if lerr != nil {
		got, err = measure(want)
		return got, false, lerr, err
	}
	defer unlock()
	path := filepath.Join(dir, kernelCacheFile)
	file := kernelCache{Version: kernelCacheVersion, Machines: map[string]*KernelMeasurements{}}
	if b, rerr := os.ReadFile(path); rerr == nil {
		var read kernelCache
		// A file of another version or a damaged one is measured over.
		if json.Unmarshal(b, &read) == nil && read.Version == kernelCacheVersion && read.Machines != nil {
			file = read
		}
	}
	key := machine.key()
	mt := file.Machines[key]
	if mt == nil {
		m := machine
		m.Gemm, m.Attention = nil, nil
		mt = &m
		file.Machines[key] = mt
	}
	got, missing := mt.fill(want)
	if len(missing.Gemm)+len(missing.Attention) == 0 {
		return got, true, nil, nil
	}
	measured, err := measure(missing)
	if err != nil {
		return got, false, nil, err
	}
	mt.merge(measured)
	got, _ = mt.fill(want)
	if werr := writeKernelCache(path, file); werr != nil {
		return got, false, werr, nil
	}
	return got, false, nil, nil
}

// lockKernelCache takes the cache directory's flock, polling until
// kernelCacheWait or ctx ends.
func lockKernelCache(ctx context.Context, dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("kernel cache: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, kernelCacheFile+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kernel cache: %w", err)
	}
	deadline := time.Now().Add(kernelCacheWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("kernel cache %s: lock: %w", dir, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func writeKernelCache(path string, file kernelCache) error {
	b, err := json.MarshalIndent(file, "", " ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), kernelCacheFile+".*")
	if err != nil {
		return fmt.Errorf("kernel cache: %w", err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("kernel cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("kernel cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("kernel cache: %w", err)
	}
	return nil
}

// ReadKernelCache returns every machine's measurements in dir (doctor).
func ReadKernelCache(dir string) ([]KernelMeasurements, error) {
	b, err := os.ReadFile(filepath.Join(dir, kernelCacheFile))
	if err != nil {
		return nil, err
	}
	var file kernelCache
	if err := json.Unmarshal(b, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, kernelCacheFile), err)
	}
	out := make([]KernelMeasurements, 0, len(file.Machines))
	for _, m := range file.Machines {
		out = append(out, *m)
	}
	return out, nil
}
