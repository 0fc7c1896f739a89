package openenvserver

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"sync"
)

// A socket's capacity slot must be free before its peer can learn that the
// socket closed: a client that opens its next session as soon as it hears
// the close frame must find the slot free. The close frame is written by
// the websocket library, which also echoes a peer's close frame by itself
// before Read returns, so the one place to act before the peer hears it is
// the byte stream. closeWatch follows the frames the server writes and runs
// a hook just before the first byte of a close frame leaves.

// opClose is the close frame's opcode (RFC 6455 §5.2).
const opClose = 0x8

// closeWatch is a hijacked connection whose writes are parsed as server
// WebSocket frames (unmasked, any split across writes).
type closeWatch struct {
	net.Conn

	mu      sync.Mutex
	hdr     [14]byte // the current frame's header bytes so far (at most 14)
	hdrLen  int
	skip    uint64 // payload bytes of the current frame still to pass
	closing bool   // a close frame has started
	onClose func() // run once, before the close frame's first byte
}

// arm sets the hook; if a close frame has gone out already, it runs now.
func (c *closeWatch) arm(f func()) {
	c.mu.Lock()
	if !c.closing {
		c.onClose = f
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	f()
}

func (c *closeWatch) Write(p []byte) (int, error) {
	c.mu.Lock()
	hook := c.scan(p)
	c.mu.Unlock()
	if hook != nil {
		hook()
	}
	return c.Conn.Write(p)
}

// scan advances the frame parser over p (mu held). It returns the hook,
// once, when p holds the start of a close frame.
func (c *closeWatch) scan(p []byte) func() {
	var hook func()
	for len(p) > 0 {
		if c.skip > 0 {
			n := min(c.skip, uint64(len(p)))
			c.skip -= n
			p = p[n:]
			continue
		}
		c.hdr[c.hdrLen] = p[0]
		c.hdrLen++
		p = p[1:]
		if c.hdrLen == 1 && c.hdr[0]&0x0f == opClose && !c.closing {
			c.closing = true
			hook, c.onClose = c.onClose, nil
		}
		if n, size := frameHeader(c.hdr[:c.hdrLen]); n > 0 && c.hdrLen == n {
			c.hdrLen, c.skip = 0, size
		}
	}
	return hook
}

// frameHeader returns the length of the header that h begins and its
// frame's payload size, or 0 while h is too short to tell.
func frameHeader(h []byte) (n int, size uint64) {
	if len(h) < 2 {
		return 0, 0
	}
	n = 2
	switch h[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h[1]&0x80 != 0 {
		n += 4 // masking key (a server never masks, but stay in step)
	}
	if len(h) < n {
		return n, 0
	}
	switch l := h[1] & 0x7f; l {
	case 126:
		size = uint64(binary.BigEndian.Uint16(h[2:4]))
	case 127:
		size = binary.BigEndian.Uint64(h[2:10])
	default:
		size = uint64(l)
	}
	return n, size
}

// watchWriter hands the websocket library a closeWatch when it hijacks
// the connection.
type watchWriter struct {
	http.ResponseWriter
	watch *closeWatch // set by Hijack
}

func (w *watchWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, fmt.Errorf("hijack: %w", err)
	}
	w.watch = &closeWatch{Conn: conn}
	// The library writes through brw.Writer, which net/http made over the
	// raw connection, so it gets one over the watch instead. Nothing is
	// lost: net/http flushed the 101 before handing the connection over.
	return w.watch, bufio.NewReadWriter(brw.Reader, bufio.NewWriter(w.watch)), nil
}
