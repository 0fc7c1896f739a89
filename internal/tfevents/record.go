// Package tfevents writes and reads TensorBoard event files: TFRecord framing
// around tensorflow.Event protobufs, encoded by hand with protowire so no
// generated code from TensorFlow's .proto files is needed.
package tfevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// castagnoli is CRC32C, the checksum TFRecord uses; crc32.MakeTable returns
// a shared read-only table, so this is not mutable state.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskDelta is TFRecord's constant for masking CRCs (a CRC of data that holds
// CRCs is weak otherwise; see tensorflow/core/lib/hash/crc32c.h).
const maskDelta = 0xa282ead8

// maskedCRC returns the masked CRC32C of b as TFRecord stores it.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + maskDelta
}

// recordHeaderLen is the length field (8 bytes) plus its CRC (4 bytes).
const recordHeaderLen = 12

// appendRecord frames data as one TFRecord:
// uint64 length, masked CRC of the length bytes, data, masked CRC of data.
func appendRecord(dst, data []byte) []byte {
	var hdr [recordHeaderLen]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(hdr[8:], maskedCRC(hdr[:8]))
	dst = append(dst, hdr[:]...)
	dst = append(dst, data...)
	return binary.LittleEndian.AppendUint32(dst, maskedCRC(data))
}

// ErrCorrupt means a record's framing or checksum is wrong.
var ErrCorrupt = errors.New("corrupt tfrecord")

// maxRecordLen bounds one record so a corrupt length cannot make the reader
// allocate without limit (scalar events are a few hundred bytes).
const maxRecordLen = 64 << 20

// RecordReader reads TFRecords one by one and verifies both checksums.
type RecordReader struct {
	r      io.Reader
	offset int64
}

// NewRecordReader reads records from r.
func NewRecordReader(r io.Reader) *RecordReader { return &RecordReader{r: r} }

// Next returns the next record's data. It returns io.EOF at a clean end,
// io.ErrUnexpectedEOF (wrapped) for a truncated record and ErrCorrupt
// (wrapped) for a checksum mismatch.
func (rr *RecordReader) Next() ([]byte, error) {
	var hdr [recordHeaderLen]byte
	n, err := io.ReadFull(rr.r, hdr[:])
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		return nil, fmt.Errorf("record header at offset %d (%d bytes): %w", rr.offset, n, err)
	}
	if got, want := binary.LittleEndian.Uint32(hdr[8:]), maskedCRC(hdr[:8]); got != want {
		return nil, fmt.Errorf("%w: length crc at offset %d is %#x, want %#x", ErrCorrupt, rr.offset, got, want)
	}
	length := binary.LittleEndian.Uint64(hdr[:8])
	if length > maxRecordLen {
		return nil, fmt.Errorf("%w: record at offset %d claims %d bytes", ErrCorrupt, rr.offset, length)
	}
	body := make([]byte, length+4)
	if _, err := io.ReadFull(rr.r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("record body at offset %d: %w", rr.offset, err)
	}
	data := body[:length]
	if got, want := binary.LittleEndian.Uint32(body[length:]), maskedCRC(data); got != want {
		return nil, fmt.Errorf("%w: data crc at offset %d is %#x, want %#x", ErrCorrupt, rr.offset, got, want)
	}
	rr.offset += recordHeaderLen + int64(length) + 4
	return data, nil
}
