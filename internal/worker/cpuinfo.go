package worker

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"runtime"
	"slices"
	"strings"
)

// CPU names the processor the kernels were measured on.
type CPU struct {
	Model string `json:"model"`
	// ISA is the vector extensions that matter to float32 matmuls, as
	// /proc/cpuinfo names them (avx2, avx512f, amx_tile, asimd, sve, ...).
	ISA []string `json:"isa"`
	// FlagsHash is a short hash of every flag: two CPUs with the same model
	// name but different microcode-exposed features do not share a cache.
	FlagsHash string `json:"flags_hash"`
}

// String is "model (isa isa ...)".
func (c CPU) String() string {
	if len(c.ISA) == 0 {
		return c.Model
	}
	return c.Model + " (" + strings.Join(c.ISA, " ") + ")"
}

// isaFlags are the /proc/cpuinfo flags CPU.ISA keeps, in this order.
var isaFlags = []string{"fma", "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile", "asimd", "sve", "sve2"}

// HostCPU reads /proc/cpuinfo (Linux); elsewhere, or when it cannot be
// read, the model is the Go architecture.
func HostCPU() CPU {
	return parseCPUInfo("/proc/cpuinfo")
}

func parseCPUInfo(path string) CPU {
	c := CPU{Model: runtime.GOARCH}
	f, err := os.Open(path)
	if err != nil {
		return c
	}
	defer f.Close()
	var flags []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "model name", "Model name":
			if c.Model == runtime.GOARCH && val != "" {
				c.Model = val
			}
		case "flags", "Features": // x86, arm64
			if flags == nil {
				flags = strings.Fields(val)
			}
		}
	}
	for _, fl := range isaFlags {
		if slices.Contains(flags, fl) {
			c.ISA = append(c.ISA, fl)
		}
	}
	sum := sha256.Sum256([]byte(strings.Join(flags, " ")))
	c.FlagsHash = hex.EncodeToString(sum[:6])
	return c
}
