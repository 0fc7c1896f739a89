package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
)

// DType is a safetensors element type, spelled as in the file header.
type DType string

// The safetensors dtypes this parser knows.
const (
	Bool    DType = "BOOL"
	U8      DType = "U8"
	I8      DType = "I8"
	F8E5M2  DType = "F8_E5M2"
	F8E4M3  DType = "F8_E4M3"
	I16     DType = "I16"
	U16     DType = "U16"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I32     DType = "I32"
	U32     DType = "U32"
	F32     DType = "F32"
	F64     DType = "F64"
	I64     DType = "I64"
	U64     DType = "U64"
	unknown DType = ""
)

var dtypeSizes = map[DType]int{
	Bool: 1, U8: 1, I8: 1, F8E5M2: 1, F8E4M3: 1,
	I16: 2, U16: 2, F16: 2, BF16: 2,
	I32: 4, U32: 4, F32: 4,
	F64: 8, I64: 8, U64: 8,
}

// Size returns the element size in bytes, or 0 for an unknown dtype.
func (d DType) Size() int { return dtypeSizes[d] }

// MaxSafetensorsHeader bounds the JSON header, as the reference
// implementation does (100 MB), so a corrupt length cannot make us allocate
// gigabytes.
const MaxSafetensorsHeader = 100 << 20

// TensorInfo locates one tensor in a safetensors file. Begin and End are
// byte offsets into the data section, which starts at DataStart in the file.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int64
	Begin int64
	End   int64
}

// NumElements is the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// SafetensorsHeader is the parsed header of one safetensors file. Tensors
// are ordered by their data offset.
type SafetensorsHeader struct {
	File      string
	Metadata  map[string]string
	Tensors   []TensorInfo
	DataStart int64 // 8 + header length
	DataLen   int64
}

// Tensor returns the named tensor's info.
func (h *SafetensorsHeader) Tensor(name string) (TensorInfo, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// SafetensorsError is a malformed safetensors file. Tensor is empty when the
// problem is not about one tensor.
type SafetensorsError struct {
	File    string
	Tensor  string
	Problem string
}

func (e *SafetensorsError) Error() string {
	if e.Tensor == "" {
		return fmt.Sprintf("safetensors file %s: %s", e.File, e.Problem)
	}
	return fmt.Sprintf("safetensors file %s: tensor %q: %s", e.File, e.Tensor, e.Problem)
}

// ReadSafetensorsHeader opens path and parses its header strictly.
func ReadSafetensorsHeader(path string) (*SafetensorsHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat safetensors: %w", err)
	}
	return ParseSafetensorsHeader(path, f, st.Size())
}

// ParseSafetensorsHeader parses the header of a safetensors file of the
// given size read through r. file names the source in errors. It rejects a
// header length that does not fit the file, invalid or duplicate JSON keys,
// unknown dtypes, shapes whose size disagrees with the offsets, and offsets
// that overlap, leave gaps, or run past the end of the data.
func ParseSafetensorsHeader(file string, r io.ReaderAt, size int64) (*SafetensorsHeader, error) {
	bad := func(tensor, format string, args ...any) error {
		return &SafetensorsError{File: file, Tensor: tensor, Problem: fmt.Sprintf(format, args...)}
	}
	if size < 8 {
		return nil, bad("", "file is %d bytes, shorter than the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, bad("", "read header length: %v", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxSafetensorsHeader {
		return nil, bad("", "header length %d exceeds the %d-byte limit", n, MaxSafetensorsHeader)
	}
	if int64(n) > size-8 {
		return nil, bad("", "header length %d runs past the end of the %d-byte file", n, size)
	}
	raw := make([]byte, n)
	if _, err := r.ReadAt(raw, 8); err != nil {
		return nil, bad("", "read %d-byte header: %v", n, err)
	}
	h, err := decodeSafetensorsHeader(file, raw, size-8-int64(n))
	if err != nil {
		return nil, err
	}
	h.DataStart = 8 + int64(n)
	return h, nil
}

type rawTensorEntry struct {
	DType       *DType   `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

// decodeSafetensorsHeader parses the JSON header given the length of the
// data section that follows it.
func decodeSafetensorsHeader(file string, raw []byte, dataLen int64) (*SafetensorsHeader, error) {
	bad := func(tensor, format string, args ...any) error {
		return &SafetensorsError{File: file, Tensor: tensor, Problem: fmt.Sprintf(format, args...)}
	}
	trimmed := bytes.TrimRight(raw, " ")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, bad("", "header is not a JSON object")
	}
	entries, err := decodeObjectNoDuplicates(trimmed)
	if err != nil {
		return nil, bad("", "header JSON: %v", err)
	}
	h := &SafetensorsHeader{File: file, DataLen: dataLen}
	for _, e := range entries {
		if e.key == "__metadata__" {
			if err := json.Unmarshal(e.value, &h.Metadata); err != nil {
				return nil, bad("", "__metadata__ must be an object of strings: %v", err)
			}
			continue
		}
		t, err := decodeTensorEntry(e.key, e.value)
		if err != nil {
			return nil, bad(e.key, "%v", err)
		}
		h.Tensors = append(h.Tensors, t)
	}
	// Empty tensors share their offset with the next one; order them first.
	sort.SliceStable(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		return a.Begin < b.Begin || (a.Begin == b.Begin && a.End < b.End)
	})
	// The reference parser requires the tensors to tile the data section
	// exactly: no gaps, no overlap, nothing left over.
	next := int64(0)
	for _, t := range h.Tensors {
		if t.Begin != next {
			return nil, bad(t.Name, "data_offsets [%d, %d] start at %d, want %d (tensors must tile the data without gaps or overlap)", t.Begin, t.End, t.Begin, next)
		}
		if t.End > dataLen {
			return nil, bad(t.Name, "data_offsets end %d runs past the %d-byte data section", t.End, dataLen)
		}
		next = t.End
	}
	if next != dataLen {
		return nil, bad("", "tensors cover %d bytes but the data section has %d", next, dataLen)
	}
	return h, nil
}

func decodeTensorEntry(name string, value json.RawMessage) (TensorInfo, error) {
	var e rawTensorEntry
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return TensorInfo{}, fmt.Errorf("entry must be {dtype, shape, data_offsets}: %v", err)
	}
	if e.DType == nil || e.Shape == nil || e.DataOffsets == nil {
		return TensorInfo{}, fmt.Errorf("entry must have dtype, shape and data_offsets")
	}
	t := TensorInfo{Name: name, DType: *e.DType, Shape: *e.Shape}
	elemSize := t.DType.Size()
	if elemSize == 0 {
		return TensorInfo{}, fmt.Errorf("unknown dtype %q", t.DType)
	}
	if len(*e.DataOffsets) != 2 {
		return TensorInfo{}, fmt.Errorf("data_offsets must be [begin, end], got %d numbers", len(*e.DataOffsets))
	}
	t.Begin, t.End = (*e.DataOffsets)[0], (*e.DataOffsets)[1]
	if t.Begin < 0 || t.End < t.Begin {
		return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] are not an increasing non-negative range", t.Begin, t.End)
	}
	nbytes := uint64(elemSize)
	for _, d := range t.Shape {
		if d < 0 {
			return TensorInfo{}, fmt.Errorf("shape %v has a negative dimension", t.Shape)
		}
		hi, lo := bits.Mul64(nbytes, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return TensorInfo{}, fmt.Errorf("shape %v is too large", t.Shape)
		}
		nbytes = lo
	}
	if uint64(t.End-t.Begin) != nbytes {
		return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] hold %d bytes but %s%v needs %d", t.Begin, t.End, t.End-t.Begin, t.DType, t.Shape, nbytes)
	}
	return t, nil
}

type jsonEntry struct {
	key   string
	value json.RawMessage
}

// decodeObjectNoDuplicates decodes a JSON object keeping key order and
// rejecting duplicate keys and trailing data (encoding/json silently keeps
// the last duplicate).
func decodeObjectNoDuplicates(b []byte) ([]jsonEntry, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want an object")
	}
	seen := map[string]bool{}
	var out []jsonEntry
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("want a string key, got %v", tok)
		}
		if seen[key] {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("value of %q: %w", key, err)
		}
		out = append(out, jsonEntry{key, v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after the header object")
	}
	return out, nil
}

// ReadTensorData reads one tensor's raw little-endian bytes.
func ReadTensorData(path string, h *SafetensorsHeader, t TensorInfo) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors: %w", err)
	}
	defer f.Close()
	buf := make([]byte, t.End-t.Begin)
	if _, err := f.ReadAt(buf, h.DataStart+t.Begin); err != nil {
		return nil, &SafetensorsError{File: path, Tensor: t.Name, Problem: fmt.Sprintf("read data: %v", err)}
	}
	return buf, nil
}

// ReadSafetensors loads every tensor of a file into memory, in header
// order. Meant for small models and tests.
func ReadSafetensors(path string) (*SafetensorsHeader, []Tensor, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read safetensors: %w", err)
	}
	h, err := ParseSafetensorsHeader(path, bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, nil, err
	}
	out := make([]Tensor, 0, len(h.Tensors))
	for _, t := range h.Tensors {
		out = append(out, Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape,
			Data: data[h.DataStart+t.Begin : h.DataStart+t.End : h.DataStart+t.End]})
	}
	return h, out, nil
}
