package memstat

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadFixture(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name    string
		status  string
		want    Stats
		wantErr bool
	}{
		{"both", "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n", Stats{RSS: 1 << 20, PeakRSS: 2 << 20}, false},
		{"no peak line", "VmRSS:\t1024 kB\n", Stats{}, true},
		{"garbage number", "VmRSS:\tlots kB\nVmHWM:\t1 kB\n", Stats{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			require.NoError(t, os.WriteFile(p, []byte(tc.status), 0o644))
			got, err := Files{Status: p}.Read()
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := Files{Status: filepath.Join(dir, "absent")}.Read()
	require.ErrorIs(t, err, ErrUnsupported)
}

// TestPeakFollowsAnAllocation: on this process, touching 64 MiB raises the
// peak at least that much above the resident set before it, and a reset
// brings the peak back to about the resident set.
func TestPeakFollowsAnAllocation(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("procfs only")
	}
	require.NoError(t, Self().ResetPeak())
	before, err := Self().Read()
	require.NoError(t, err)
	buf := make([]byte, 64<<20)
	for i := range buf {
		if i%4096 == 0 {
			buf[i] = 1
		}
	}
	after, err := Self().Read()
	require.NoError(t, err)
	runtime.KeepAlive(buf)
	assert.GreaterOrEqual(t, after.PeakRSS-before.RSS, int64(60<<20))
	assert.GreaterOrEqual(t, after.PeakRSS, after.RSS)
}
