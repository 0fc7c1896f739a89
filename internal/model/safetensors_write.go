package model

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// Tensor is a named tensor with its raw little-endian bytes.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
}

// TensorSpec describes a tensor to be written by WriteSafetensorsStream.
type TensorSpec struct {
	Name  string
	DType DType
	Shape []int64
}

// ByteLen is the tensor's size in bytes.
func (s TensorSpec) ByteLen() int64 {
	n := int64(s.DType.Size())
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// DefaultSafetensorsMetadata is the header metadata transformers writes and
// expects when loading PyTorch weights.
func DefaultSafetensorsMetadata() map[string]string { return map[string]string{"format": "pt"} }

// WriteSafetensors writes tensors to path atomically (temp file + rename).
// A nil metadata writes {"format":"pt"}.
func WriteSafetensors(path string, tensors []Tensor, metadata map[string]string) error {
	specs := make([]TensorSpec, len(tensors))
	byName := make(map[string]Tensor, len(tensors))
	for i, t := range tensors {
		specs[i] = TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
		if int64(len(t.Data)) != specs[i].ByteLen() {
			return fmt.Errorf("write %s: tensor %q has %d bytes, %s%v needs %d", path, t.Name, len(t.Data), t.DType, t.Shape, specs[i].ByteLen())
		}
		byName[t.Name] = t
	}
	return WriteSafetensorsStream(path, specs, metadata, func(s TensorSpec, w io.Writer) error {
		_, err := w.Write(byName[s.Name].Data)
		return err
	})
}

// WriteSafetensorsStream writes a safetensors file whose tensor bytes are
// produced one tensor at a time by fill, so large models never sit in
// memory whole. Tensors are laid out by dtype size (largest first) then
// name, as the reference writer does; fill is called in that order and
// must write exactly spec.ByteLen() bytes. The file appears atomically.
func WriteSafetensorsStream(path string, specs []TensorSpec, metadata map[string]string, fill func(TensorSpec, io.Writer) error) error {
	order, header, err := encodeSafetensorsHeader(specs, metadata)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return writeFileAtomic(path, func(w io.Writer) error {
		var lenBuf [8]byte
		binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(header)))
		if _, err := w.Write(lenBuf[:]); err != nil {
			return err
		}
		if _, err := w.Write(header); err != nil {
			return err
		}
		for _, s := range order {
			cw := &countingWriter{w: w}
			if err := fill(s, cw); err != nil {
				return fmt.Errorf("tensor %q: %w", s.Name, err)
			}
			if cw.n != s.ByteLen() {
				return fmt.Errorf("tensor %q: wrote %d bytes, want %d", s.Name, cw.n, s.ByteLen())
			}
		}
		return nil
	})
}

// encodeSafetensorsHeader orders the tensors and renders the JSON header,
// space-padded to a multiple of 8 bytes so the data stays aligned.
func encodeSafetensorsHeader(specs []TensorSpec, metadata map[string]string) ([]TensorSpec, []byte, error) {
	if metadata == nil {
		metadata = DefaultSafetensorsMetadata()
	}
	order := append([]TensorSpec(nil), specs...)
	seen := map[string]bool{}
	for _, s := range order {
		if s.DType.Size() == 0 {
			return nil, nil, fmt.Errorf("tensor %q: unknown dtype %q", s.Name, s.DType)
		}
		if s.Name == "" || s.Name == "__metadata__" || seen[s.Name] {
			return nil, nil, fmt.Errorf("tensor name %q is empty, reserved or repeated", s.Name)
		}
		seen[s.Name] = true
		for _, d := range s.Shape {
			if d < 0 {
				return nil, nil, fmt.Errorf("tensor %q: negative dimension in shape %v", s.Name, s.Shape)
			}
		}
	}
	sortSafetensors(order)
	var buf bytes.Buffer
	buf.WriteString(`{"__metadata__":`)
	meta, err := json.Marshal(metadata)
	if err != nil {
		return nil, nil, err
	}
	buf.Write(meta)
	offset := int64(0)
	for _, s := range order {
		name, _ := json.Marshal(s.Name)
		buf.WriteByte(',')
		buf.Write(name)
		buf.WriteString(`:{"dtype":"` + string(s.DType) + `","shape":[`)
		for i, d := range s.Shape {
			if i > 0 {
				buf.WriteByte(',')
			}
			buf.WriteString(strconv.FormatInt(d, 10))
		}
		end := offset + s.ByteLen()
		fmt.Fprintf(&buf, `],"data_offsets":[%d,%d]}`, offset, end)
		offset = end
	}
	buf.WriteByte('}')
	for buf.Len()%8 != 0 {
		buf.WriteByte(' ')
	}
	return order, buf.Bytes(), nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeFileAtomic writes through a buffered temp file in path's directory,
// syncs it, and renames it over path, so readers see the old file or the
// whole new one.
func writeFileAtomic(path string, write func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp file for %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err = write(bw); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, err)
	}
	return nil
}

// writeJSONFileAtomic writes v as indented JSON with a final newline,
// without HTML escaping.
func writeJSONFileAtomic(path string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // HF files keep "<|im_end|>" literal
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return writeFileAtomic(path, func(w io.Writer) error { _, err := w.Write(buf.Bytes()); return err })
}

// EncodeF32 returns values as little-endian float32 bytes.
func EncodeF32(values []float32) []byte {
	out := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out
}

// DecodeF32 reads little-endian float32 bytes.
func DecodeF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// EncodeBF16 rounds values to bfloat16 (round to nearest even, NaN kept
// quiet) as torch does, little-endian.
func EncodeBF16(values []float32) []byte {
	out := make([]byte, 2*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint16(out[2*i:], F32ToBF16(v))
	}
	return out
}

// DecodeBF16 widens little-endian bfloat16 bytes to float32 (exact).
func DecodeBF16(b []byte) []float32 {
	out := make([]float32, len(b)/2)
	for i := range out {
		out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
	}
	return out
}

// F32ToBF16 rounds one float32 to bfloat16 bits.
func F32ToBF16(v float32) uint16 {
	b := math.Float32bits(v)
	if v != v { // NaN: keep the sign, force a quiet payload
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// EncodeF16 rounds values to IEEE half precision (round to nearest even),
// little-endian.
func EncodeF16(values []float32) []byte {
	out := make([]byte, 2*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint16(out[2*i:], F32ToF16(v))
	}
	return out
}

// DecodeF16 widens little-endian half-precision bytes to float32 (exact).
func DecodeF16(b []byte) []float32 {
	out := make([]float32, len(b)/2)
	for i := range out {
		out[i] = F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return out
}

// F32ToF16 rounds one float32 to half-precision bits.
func F32ToF16(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127+15 >= 0x1f: // overflow
		return sign | 0x7c00
	case exp-127+15 <= 0: // subnormal half or zero
		e := exp - 127 + 15
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint32(14 - e)
		half := m >> shift
		rem := m & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	e := uint32(exp - 127 + 15)
	half := e<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++ // may carry into the exponent, which is correct rounding
	}
	return sign | uint16(half)
}

// F16ToF32 widens half-precision bits to float32.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: normalise
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		mant &= 0x3ff
		return math.Float32frombits(sign | e<<23 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

func sortSafetensors(order []TensorSpec) {
	sort.SliceStable(order, func(i, j int) bool {
		if a, b := order[i].DType.Size(), order[j].DType.Size(); a != b {
			return a > b
		}
		return order[i].Name < order[j].Name
	})
}
