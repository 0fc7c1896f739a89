package openenvserver

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordConn is a net.Conn that keeps what is written.
type recordConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *recordConn) Write(p []byte) (int, error) { return c.buf.Write(p) }

// frame encodes one frame as a server (or, masked, a client) writes it.
func frame(op byte, payload int, masked bool) []byte {
	b := []byte{0x80 | op}
	var mbit byte
	if masked {
		mbit = 0x80
	}
	switch {
	case payload > 0xffff:
		b = append(b, mbit|127)
		b = binary.BigEndian.AppendUint64(b, uint64(payload))
	case payload > 125:
		b = append(b, mbit|126)
		b = binary.BigEndian.AppendUint16(b, uint16(payload))
	default:
		b = append(b, mbit|byte(payload))
	}
	if masked {
		b = append(b, 1, 2, 3, 4)
	}
	// A payload of 0x88 bytes looks like close frames to a parser that
	// loses its place.
	return append(b, bytes.Repeat([]byte{0x88}, payload)...)
}

// TestCloseWatch: the hook runs once, as the write holding the close
// frame's first byte is made and not before, however the frames before it
// (every length encoding) are split across writes.
func TestCloseWatch(t *testing.T) {
	var stream []byte
	for _, f := range [][]byte{
		frame(0x1, 0, false), frame(0x1, 125, false), frame(0x2, 126, false), frame(0x1, 0xffff, false),
		frame(0x2, 0x10000, false), frame(0x9, 4, false), frame(0x1, 300, true), frame(0x0, 7, false),
	} {
		stream = append(stream, f...)
	}
	closeAt := len(stream)
	stream = append(stream, frame(opClose, 2, false)...)
	stream = append(stream, frame(0x1, 3, false)...) // whatever follows

	tests := []struct {
		name  string
		chunk int
	}{
		{"byte by byte", 1},
		{"odd chunks", 7},
		{"bufio sized", 4096},
		{"one write", len(stream)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := &recordConn{}
			w := &closeWatch{Conn: rc}
			fired, at := 0, -1
			w.arm(func() { fired++; at = rc.buf.Len() })
			for off := 0; off < len(stream); off += tt.chunk {
				end := min(off+tt.chunk, len(stream))
				_, err := w.Write(stream[off:end])
				require.NoError(t, err)
				if end <= closeAt {
					require.Zero(t, fired, "fired before the close frame (at %d)", end)
				}
			}
			assert.Equal(t, 1, fired)
			assert.Equal(t, closeAt/tt.chunk*tt.chunk, at, "fired just before the write that starts the close frame")
			assert.Equal(t, stream, rc.buf.Bytes(), "bytes pass through unchanged")
		})
	}
}

// TestCloseWatchArmAfterClose: a hook armed after the close frame left
// runs at once.
func TestCloseWatchArmAfterClose(t *testing.T) {
	w := &closeWatch{Conn: &recordConn{}}
	_, err := w.Write(frame(opClose, 0, false))
	require.NoError(t, err)
	ran := false
	w.arm(func() { ran = true })
	assert.True(t, ran)
}
