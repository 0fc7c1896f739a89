package worker

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadedObject returns the path of the first object mapped into this
// process whose file name starts with prefix ("" when none is).
func loadedObject(t *testing.T, prefix string) string {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && strings.HasPrefix(filepath.Base(fields[5]), prefix) {
			return fields[5]
		}
	}
	require.NoError(t, sc.Err())
	return ""
}

// TestOneDNNDecodePathActive: where libtorch_cpu links a libdnnl (Debian's
// libtorch: libdnnl.so.2 on 1.13, libdnnl.so.3.6 on 2.14), CPU decoding
// must reach its sgemm. A lookup by one soname once missed 2.14's and
// sampling fell back to at::mm without a word.
func TestOneDNNDecodePathActive(t *testing.T) {
	lib := testLib(t)
	torchCPU := loadedObject(t, "libtorch_cpu.so")
	require.NotEmpty(t, torchCPU, "libtorch_cpu is not mapped after opening the worker library")
	ef, err := elf.Open(torchCPU)
	require.NoError(t, err)
	defer ef.Close()
	needed, err := ef.ImportedLibraries()
	require.NoError(t, err)
	dnnl := ""
	for _, n := range needed {
		if strings.HasPrefix(n, "libdnnl.so") {
			dnnl = n
		}
	}
	info := lib.Info().OneDNN
	require.NotNil(t, info, "the worker library does not report the oneDNN decode path; rebuild it with scripts/build-worker.sh")
	t.Logf("libtorch_cpu %s needs %q; oneDNN decode path: %+v", torchCPU, dnnl, *info)
	if dnnl == "" {
		return // oneDNN inside libtorch_cpu (pip wheels), exported or not: either is right
	}
	require.True(t, info.Active, "libtorch_cpu needs %s but the oneDNN decode path is off: %s", dnnl, info.Detail)
	assert.Equal(t, dnnl, filepath.Base(info.Library), "dnnl_sgemm should come from the libdnnl libtorch links")
	assert.Empty(t, info.Detail)
}

// TestStoreInfo: libtorch 2.4+ asks for a libuv store by default; the info
// says so and whether one starts here (Debian's libtorch has no libuv,
// pip's has).
func TestStoreInfo(t *testing.T) {
	info := testLib(t).Info()
	require.NotNil(t, info.Store, "the worker library does not report the TCPStore; rebuild it with scripts/build-worker.sh")
	t.Logf("libtorch %s TCPStore: %+v", info.LibtorchVersion, *info.Store)
	parts := strings.SplitN(info.LibtorchVersion, ".", 3)
	require.Len(t, parts, 3)
	major, err := strconv.Atoi(parts[0])
	require.NoError(t, err)
	minor, err := strconv.Atoi(parts[1])
	require.NoError(t, err)
	wantDefault := major > 2 || (major == 2 && minor >= 4)
	assert.Equal(t, wantDefault, info.Store.LibUVDefault)
	if !info.Store.LibUVDefault {
		assert.False(t, info.Store.LibUV)
	}
	if !info.Store.LibUV {
		assert.NotEmpty(t, info.Store.Detail, "a missing libuv store should say why")
	}
}

// TestInfoJSONRoundTrip: doctor's probe child prints Info as JSON and the
// parent decodes it, so the reports must survive the trip (nil stays nil:
// a library that predates them).
func TestInfoJSONRoundTrip(t *testing.T) {
	for _, in := range []Info{
		{LibtorchVersion: "2.14.1", DistBackends: []string{"gloo"},
			OneDNN: &OneDNNInfo{Active: true, Library: "/usr/lib/x86_64-linux-gnu/libdnnl.so.3.6"},
			Store:  &StoreInfo{LibUVDefault: true, Detail: "libtorch was built without libuv"}},
		{LibtorchVersion: "1.13.0"},
	} {
		b, err := json.Marshal(in)
		require.NoError(t, err)
		var out Info
		require.NoError(t, json.Unmarshal(b, &out))
		assert.Equal(t, in, out)
	}
}

// TestDeviceMemoryOnCPU: a CPU model's allocator tells nothing (the
// process's RSS is its memory), without an error.
func TestDeviceMemoryOnCPU(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	for _, reset := range []bool{true, false} {
		mem, ok, err := m.DeviceMemory(context.Background(), reset)
		require.NoError(t, err)
		assert.False(t, ok)
		assert.Equal(t, DeviceMemory{}, mem)
	}
}
