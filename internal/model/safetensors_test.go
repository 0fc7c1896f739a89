package model

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// special float32 values every dtype round trip covers.
var specialF32 = []float32{0, float32(math.Copysign(0, -1)), 1, -1, 0.5, 61440, -2.5,
	float32(math.Inf(1)), float32(math.Inf(-1)), 3.140625, 1.0 / 1024}

func TestSafetensorsRoundTripBitExact(t *testing.T) {
	tests := []struct {
		dtype  DType
		encode func([]float32) []byte
		decode func([]byte) []float32
	}{
		{F32, EncodeF32, DecodeF32},
		{BF16, EncodeBF16, DecodeBF16},
		{F16, EncodeF16, DecodeF16},
	}
	for _, tt := range tests {
		t.Run(string(tt.dtype), func(t *testing.T) {
			vals := append([]float32(nil), specialF32...)
			vals = append(vals, float32(math.NaN()))
			data := tt.encode(vals)
			tensors := []Tensor{
				{Name: "a.weight", DType: tt.dtype, Shape: []int64{3, 4}, Data: data},
				{Name: "b.scalar", DType: tt.dtype, Shape: []int64{}, Data: tt.encode([]float32{2})},
				{Name: "c.empty", DType: tt.dtype, Shape: []int64{0, 5}, Data: nil},
				{Name: "d.ids", DType: I64, Shape: []int64{2}, Data: binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 7), 1<<40)},
			}
			path := filepath.Join(t.TempDir(), "model.safetensors")
			require.NoError(t, WriteSafetensors(path, tensors, nil))

			h, got, err := ReadSafetensors(path)
			require.NoError(t, err)
			assert.Equal(t, map[string]string{"format": "pt"}, h.Metadata)
			assert.Zero(t, h.DataStart%8, "data section is 8-byte aligned")
			byName := map[string]Tensor{}
			for _, g := range got {
				byName[g.Name] = g
			}
			require.Len(t, byName, len(tensors))
			for _, want := range tensors {
				g := byName[want.Name]
				assert.Equal(t, want.DType, g.DType, want.Name)
				assert.Equal(t, want.Shape, g.Shape, want.Name)
				assert.True(t, bytes.Equal(want.Data, g.Data), "%s: bytes differ", want.Name)
			}
			// Values representable in the dtype survive encode+decode exactly.
			back := tt.decode(byName["a.weight"].Data)
			for i, v := range specialF32 {
				assert.Equal(t, math.Float32bits(v), math.Float32bits(back[i]), "value %g", v)
			}
			assert.True(t, math.IsNaN(float64(back[len(back)-1])))

			one, err := ReadTensorData(path, h, mustTensor(t, h, "b.scalar"))
			require.NoError(t, err)
			assert.Equal(t, []float32{2}, tt.decode(one))
		})
	}
}

func mustTensor(t *testing.T, h *SafetensorsHeader, name string) TensorInfo {
	info, ok := h.Tensor(name)
	require.True(t, ok, name)
	return info
}

func TestHalfConversionsRound(t *testing.T) {
	tests := []struct {
		in       float32
		bf16     uint16
		f16      uint16
		f16Value float32
	}{
		{1, 0x3f80, 0x3c00, 1},
		{1.00390625, 0x3f80, 0x3c04, 1.00390625}, // bf16 tie → even; exact in f16
		{1 + 3.0/512, 0x3f81, 0x3c06, 1 + 3.0/512},
		{65520, 0x4780, 0x7c00, float32(math.Inf(1))},                  // f16 overflow rounds to inf
		{5.960464477539063e-08, 0x3380, 0x0001, 5.960464477539063e-08}, // smallest f16 subnormal
		{2.9802322387695312e-08, 0x3300, 0x0000, 0},                    // half of it: tie → even (0)
		{-0.0001, 0xb8d2, 0x868e, -0.00010001659393310547},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.bf16, F32ToBF16(tt.in), "bf16(%g)", tt.in)
		assert.Equal(t, tt.f16, F32ToF16(tt.in), "f16(%g)", tt.in)
		assert.Equal(t, tt.f16Value, F16ToF32(F32ToF16(tt.in)), "f16 value of %g", tt.in)
	}
	// Every finite half value widens and narrows back to itself.
	for h := 0; h < 1<<16; h++ {
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue // NaN payloads are canonicalised
		}
		require.Equal(t, uint16(h), F32ToF16(F16ToF32(uint16(h))), "half %#04x", h)
	}
}

// validFile returns a well-formed safetensors file with two tensors, laid
// out as WriteSafetensors does.
func validFile(t testing.TB) []byte {
	specs := []TensorSpec{{"w", F32, []int64{2, 2}}, {"b", BF16, []int64{2}}}
	_, header, err := encodeSafetensorsHeader(specs, nil)
	require.NoError(t, err)
	data := append(EncodeF32([]float32{1, 2, 3, 4}), EncodeBF16([]float32{1, 2})...)
	return withHeader(string(header), data)
}

// withHeader builds a file from a JSON header and a data section.
func withHeader(header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

func TestSafetensorsRejectsCorruptHeaders(t *testing.T) {
	data16 := make([]byte, 16)
	tests := []struct {
		name   string
		file   func(t *testing.T) []byte
		tensor string
		msg    string
	}{
		{"too short", func(t *testing.T) []byte { return []byte{1, 2, 3} }, "", "shorter than"},
		{"length past end", func(t *testing.T) []byte {
			b := validFile(t)
			binary.LittleEndian.PutUint64(b, uint64(len(b)))
			return b
		}, "", "runs past the end"},
		{"length huge", func(t *testing.T) []byte {
			b := validFile(t)
			binary.LittleEndian.PutUint64(b, math.MaxUint64)
			return b
		}, "", "exceeds"},
		{"not json", func(t *testing.T) []byte { return withHeader("{nope", data16) }, "", "header JSON"},
		{"not an object", func(t *testing.T) []byte { return withHeader(`[1,2]`, data16) }, "", "not a JSON object"},
		{"trailing garbage", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}} x`, data16)
		}, "", "header JSON"},
		{"duplicate tensor", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, data16)
		}, "", "duplicate key"},
		{"unknown dtype", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F12","shape":[4],"data_offsets":[0,16]}}`, data16)
		}, "w", "unknown dtype"},
		{"missing shape", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","data_offsets":[0,16]}}`, data16)
		}, "w", "must have"},
		{"extra field", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1}}`, data16)
		}, "w", "entry must be"},
		{"negative dim", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}`, data16)
		}, "w", "negative"},
		{"size mismatch", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, data16)
		}, "w", "needs 12"},
		{"reversed offsets", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}}`, data16)
		}, "w", "increasing"},
		{"three offsets", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,8,16]}}`, data16)
		}, "w", "[begin, end]"},
		{"overlap", func(t *testing.T) []byte {
			return withHeader(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, data16)
		}, "b", "gaps or overlap"},
		{"gap", func(t *testing.T) []byte {
			return withHeader(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, data16)
		}, "b", "gaps or overlap"},
		{"out of range", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}}`, data16)
		}, "w", "runs past"},
		{"data left over", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, data16)
		}, "", "cover 8 bytes but the data section has 16"},
		{"shape overflow", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,16]}}`, data16)
		}, "w", "too large"},
		{"float offsets", func(t *testing.T) []byte {
			return withHeader(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16.5]}}`, data16)
		}, "w", "entry must be"},
		{"bad metadata", func(t *testing.T) []byte {
			return withHeader(`{"__metadata__":{"format":1},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, data16)
		}, "", "__metadata__"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.file(t)
			_, err := ParseSafetensorsHeader("x.safetensors", bytes.NewReader(b), int64(len(b)))
			require.Error(t, err)
			var se *SafetensorsError
			require.True(t, errors.As(err, &se), "want *SafetensorsError, got %T", err)
			assert.Equal(t, "x.safetensors", se.File)
			assert.Equal(t, tt.tensor, se.Tensor)
			assert.Contains(t, err.Error(), tt.msg)
			assert.True(t, strings.HasPrefix(err.Error(), "safetensors file x.safetensors"), err.Error())
		})
	}
}

func TestSafetensorsEmptyTensorSharesOffset(t *testing.T) {
	b := withHeader(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}`, make([]byte, 16))
	h, err := ParseSafetensorsHeader("x", bytes.NewReader(b), int64(len(b)))
	require.NoError(t, err)
	require.Len(t, h.Tensors, 2)
	assert.Equal(t, "e", h.Tensors[0].Name)
}

func TestWriteSafetensorsRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		tensors []Tensor
		msg     string
	}{
		{"wrong byte count", []Tensor{{Name: "a", DType: F32, Shape: []int64{2}, Data: make([]byte, 4)}}, "needs 8"},
		{"unknown dtype", []Tensor{{Name: "a", DType: "Q4", Shape: []int64{1}, Data: nil}}, "unknown dtype"},
		{"repeated name", []Tensor{{Name: "a", DType: U8, Shape: []int64{1}, Data: []byte{1}}, {Name: "a", DType: U8, Shape: []int64{1}, Data: []byte{2}}}, "repeated"},
		{"reserved name", []Tensor{{Name: "__metadata__", DType: U8, Shape: []int64{1}, Data: []byte{1}}}, "reserved"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "m.safetensors")
			err := WriteSafetensors(path, tt.tensors, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.msg)
			_, statErr := os.Stat(path)
			assert.ErrorIs(t, statErr, os.ErrNotExist, "no partial file is left")
			entries, _ := os.ReadDir(dir)
			assert.Empty(t, entries, "no temp file is left")
		})
	}
}

func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(validFile(f))
	f.Add(withHeader(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add(withHeader(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, make([]byte, 16)))
	f.Add(withHeader(`{}`, nil))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseSafetensorsHeader("fuzz", bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		// An accepted header must describe tensors that tile the data
		// section exactly and lie inside the file.
		next := int64(0)
		for _, ti := range h.Tensors {
			if ti.Begin != next || ti.End < ti.Begin || ti.End-ti.Begin != ti.NumElements()*int64(ti.DType.Size()) {
				t.Fatalf("accepted inconsistent tensor %+v", ti)
			}
			next = ti.End
		}
		if h.DataStart+next != int64(len(b)) {
			t.Fatalf("tensors cover %d bytes from %d, file has %d", next, h.DataStart, len(b))
		}
	})
}

func TestWriteSafetensorsLayout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	require.NoError(t, WriteSafetensors(path, []Tensor{
		{Name: "w", DType: F32, Shape: []int64{2, 2}, Data: EncodeF32([]float32{1, 2, 3, 4})},
		{Name: "b", DType: BF16, Shape: []int64{2}, Data: EncodeBF16([]float32{1, 2})},
	}, nil))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, validFile(t), got)
	assert.Contains(t, string(got), `{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]}}`,
		"larger dtypes first, then by name")
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), info.Mode().Perm())
}
