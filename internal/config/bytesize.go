package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteUnits are the suffixes ParseByteSize accepts, longest first so "GiB"
// is not read as "B".
var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseByteSize reads a size: a count of bytes (1073741824) or a number
// with a unit, binary (KiB, MiB, GiB, TiB; K, M, G, T) or decimal (KB, MB,
// GB, TB), case-insensitive. Fractions round down to whole bytes.
func ParseByteSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || t == "" || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("size %q is not a number of bytes or a number with a unit (KiB, MiB, GiB, KB, MB, GB)", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	b := f * mult
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(b), nil
}

// KVCacheBudgetBytes is engine.kv_cache_budget in bytes.
func (e EngineConfig) KVCacheBudgetBytes() (int64, error) {
	n, err := ParseByteSize(e.KVCacheBudget)
	if err != nil {
		return 0, fmt.Errorf("engine.kv_cache_budget: %w", err)
	}
	return n, nil
}
