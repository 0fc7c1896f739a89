package tfevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMaskedCRCKnownValues pins the CRC to published values so writer and
// reader cannot agree on a wrong checksum: CRC32C("123456789") = 0xe3069283
// (RFC 3720 check value), CRC32C("abcd") = 0x92c80a31 (tensorboardX's own
// test vector), and the masking TFRecord applies.
func TestMaskedCRCKnownValues(t *testing.T) {
	require.Equal(t, uint32(0xe3069283), crc32.Checksum([]byte("123456789"), castagnoli))
	require.Equal(t, uint32(0x92c80a31), crc32.Checksum([]byte("abcd"), castagnoli))
	c := uint32(0xe3069283)
	assert.Equal(t, ((c>>15)|(c<<17))+0xa282ead8, maskedCRC([]byte("123456789")))
	// CRC32C of zero bytes is 0, so the masked CRC is the mask delta itself.
	assert.Equal(t, uint32(maskDelta), maskedCRC(nil))
}

func TestWriterRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tb")
	w, err := Create(dir)
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })

	wall := time.Date(2026, 11, 23, 12, 0, 0, 500_000_000, time.UTC)
	steps := []struct {
		step    int
		scalars map[string]float64
	}{
		{1, map[string]float64{"reward": 0.25, "loss": -0.03457675129175186, "rewards/letters/mean": 0.1}},
		{2, map[string]float64{"reward": 0.5, "time/rollout": 2.17, "clip_ratio/low_min": 0}},
		{3, map[string]float64{"kl": math.Inf(1), "entropy": math.NaN()}},
		{4, map[string]float64{}},
	}
	for i, s := range steps {
		require.NoError(t, w.AddScalars(s.step, wall.Add(time.Duration(i)*time.Second), s.scalars))
	}
	require.NoError(t, w.Close())
	assert.NoError(t, w.Close(), "second close is a no-op")
	assert.ErrorIs(t, w.AddScalars(5, wall, nil), ErrClosed)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Regexp(t, `^events\.out\.tfevents\.\d+\.[^.]+.*\.\d+$`, entries[0].Name())

	raw, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	checkFraming(t, raw, 1+len(steps))

	events, err := ReadFile(w.Path())
	require.NoError(t, err)
	require.Len(t, events, 1+len(steps))
	assert.Equal(t, FileVersion, events[0].FileVersion)
	assert.Empty(t, events[0].Scalars)
	assert.InDelta(t, float64(time.Now().Unix()), events[0].WallTime, 60)

	for i, s := range steps {
		e := events[i+1]
		assert.Equal(t, int64(s.step), e.Step)
		assert.Empty(t, e.FileVersion)
		assert.InDelta(t, unixSeconds(wall)+float64(i), e.WallTime, 1e-6)
		require.Len(t, e.Scalars, len(s.scalars))
		for j, sc := range e.Scalars {
			if j > 0 {
				assert.Less(t, e.Scalars[j-1].Tag, sc.Tag, "tags are sorted")
			}
			want, ok := s.scalars[sc.Tag]
			require.True(t, ok, "unexpected tag %q", sc.Tag)
			switch {
			case math.IsNaN(want):
				assert.True(t, math.IsNaN(float64(sc.Value)))
			default:
				assert.Equal(t, float32(want), sc.Value, sc.Tag)
			}
		}
	}
}

// checkFraming walks raw by hand, independent of RecordReader: each record
// is uint64 length, masked CRC of the length bytes, data, masked CRC of data.
func checkFraming(t *testing.T, raw []byte, records int) {
	t.Helper()
	n := 0
	for off := 0; off < len(raw); n++ {
		require.GreaterOrEqual(t, len(raw)-off, 12, "header of record %d", n)
		length := int(binary.LittleEndian.Uint64(raw[off:]))
		assert.Equal(t, maskedCRC(raw[off:off+8]), binary.LittleEndian.Uint32(raw[off+8:]), "length crc of record %d", n)
		data := raw[off+12 : off+12+length]
		assert.Equal(t, maskedCRC(data), binary.LittleEndian.Uint32(raw[off+12+length:]), "data crc of record %d", n)
		off += 12 + length + 4
	}
	assert.Equal(t, records, n)
}

func TestReaderRejectsDamage(t *testing.T) {
	var good []byte
	good = appendRecord(good, Event{WallTime: 1, FileVersion: FileVersion}.marshal())
	good = appendRecord(good, Event{WallTime: 2, Step: 7, Scalars: []Scalar{{"reward", 0.5}}}.marshal())

	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x01
		return b
	}
	tests := []struct {
		name    string
		data    []byte
		wantErr error
		events  int
	}{
		{"intact", good, nil, 2},
		{"length byte flipped", flip(0), ErrCorrupt, 0},
		{"length crc flipped", flip(9), ErrCorrupt, 0},
		{"data byte flipped", flip(14), ErrCorrupt, 0},
		{"data crc of second record flipped", flip(len(good) - 1), ErrCorrupt, 1},
		{"truncated body", good[:len(good)-3], io.ErrUnexpectedEOF, 1},
		{"truncated header", good[:len(good)-len(good)/2+5], io.ErrUnexpectedEOF, 1},
		{"huge length", func() []byte {
			var hdr [12]byte
			binary.LittleEndian.PutUint64(hdr[:8], 1<<40)
			binary.LittleEndian.PutUint32(hdr[8:], maskedCRC(hdr[:8]))
			return hdr[:]
		}(), ErrCorrupt, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events, err := ReadEvents(bytes.NewReader(tt.data))
			if tt.wantErr == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.wantErr)
			}
			assert.Len(t, events, tt.events)
		})
	}
}

func TestUnmarshalSkipsUnknownFields(t *testing.T) {
	// An Event with graph_def (field 4) and a Summary.Value with node_name
	// (field 7) and an image (field 4): readers must skip what they do not hold.
	e := Event{WallTime: 3, Step: 9, Scalars: []Scalar{{"a", 1.5}}}.marshal()
	e = append(e, 0x22, 0x02, 0xde, 0xad) // field 4, bytes, len 2
	got, err := UnmarshalEvent(e)
	require.NoError(t, err)
	assert.Equal(t, Event{WallTime: 3, Step: 9, Scalars: []Scalar{{"a", 1.5}}}, got)

	_, err = UnmarshalEvent([]byte{0x0a, 0x05, 0x01}) // wall_time tag with a short body
	require.Error(t, err)
}

func TestConcurrentAddScalars(t *testing.T) {
	w, err := Create(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 25 {
				assert.NoError(t, w.AddScalars(g*100+i, time.Now(), map[string]float64{"x": float64(i)}))
			}
		})
	}
	wg.Wait()
	require.NoError(t, w.Flush())
	events, err := ReadFile(w.Path())
	require.NoError(t, err)
	assert.Len(t, events, 101)
}

func TestCreateFailsOnFileAsDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err := Create(filepath.Join(file, "tb"))
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "create event dir"), err.Error())
	assert.False(t, errors.Is(err, ErrClosed))
}

func FuzzReadEvents(f *testing.F) {
	var seed []byte
	seed = appendRecord(seed, Event{WallTime: 1, FileVersion: FileVersion}.marshal())
	seed = appendRecord(seed, Event{WallTime: 2, Step: 3, Scalars: []Scalar{{"loss", -1}}}.marshal())
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		events, err := ReadEvents(bytes.NewReader(data))
		if err != nil {
			return
		}
		// Whatever decodes cleanly must re-encode into records that decode
		// to the same events.
		var again []byte
		for _, e := range events {
			again = appendRecord(again, e.marshal())
		}
		back, err := ReadEvents(bytes.NewReader(again))
		require.NoError(t, err)
		require.Len(t, back, len(events))
	})
}

func TestTrainerTags(t *testing.T) {
	got := TrainerTags(map[string]float64{
		"step": 3, "loss": 0.5, "reward": 0.25, "rewards/letters/mean": 0.1,
		"eval_reward": 0.7, "test_loss": 1, "time/rollout": 2,
	})
	assert.Equal(t, map[string]float64{
		"train/loss": 0.5, "train/reward": 0.25, "train/rewards/letters/mean": 0.1,
		"eval/reward": 0.7, "test/loss": 1, "train/time/rollout": 2,
	}, got)
}
