package openenv

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Servers newer than the captures may send frames no request asked for
// (telemetry, progress, notices). The client answers requests in order, so
// such a frame must neither pass for a reply nor end the session: the
// socket's reader drops it and counts it.

// strayWSFrame reports whether a /ws frame answers no request: a JSON
// object whose type is not one of the reply types. Anything else (not an
// object, no type) is kept so that parsing reports it.
func strayWSFrame(b []byte) (string, bool) {
	typ, ok := frameType(b)
	if !ok {
		return "", false
	}
	switch typ {
	case FrameObservation, FrameState, FrameMCP, FrameError:
		return "", false
	}
	return typ, true
}

// strayRPCFrame reports whether a /mcp WebSocket frame is a server-sent
// JSON-RPC notification or request (a method, no result or error) rather
// than a reply.
func strayRPCFrame(b []byte) (string, bool) {
	var m struct {
		Method *string          `json:"method"`
		Result json.RawMessage  `json:"result"`
		Error  *json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &m) != nil || m.Method == nil || m.Result != nil || m.Error != nil {
		return "", false
	}
	return *m.Method, true
}

// frameType returns the "type" string of a JSON object frame. The reference
// server writes type first ({"type":"observation",...}), so that layout is
// read without decoding the rest (observations can be megabytes).
func frameType(b []byte) (string, bool) {
	rest := bytes.TrimLeft(b, " \t\r\n")
	if r, ok := bytes.CutPrefix(rest, []byte("{")); ok {
		r = bytes.TrimLeft(r, " \t\r\n")
		if r, ok = bytes.CutPrefix(r, []byte(`"type"`)); ok {
			r = bytes.TrimLeft(r, " \t\r\n")
			if r, ok = bytes.CutPrefix(r, []byte(":")); ok {
				r = bytes.TrimLeft(r, " \t\r\n")
				if r, ok = bytes.CutPrefix(r, []byte(`"`)); ok {
					if end := bytes.IndexByte(r, '"'); end >= 0 && !bytes.ContainsRune(r[:end], '\\') {
						return string(r[:end]), true
					}
				}
			}
		}
	}
	var h struct {
		Type *string `json:"type"`
	}
	if json.Unmarshal(b, &h) != nil || h.Type == nil {
		return "", false
	}
	return *h.Type, true
}

// noteIgnored logs a dropped frame at once, then at most once a minute
// with the running count; never its content.
func (c *Client) noteIgnored(op, kind string) {
	n := c.ignored.Add(1)
	if c.ignoredLog.due(sparseLogEvery) {
		c.log.Info().Str("socket", op).Str("frame_type", kind).Int64("ignored_frames", n).
			Msg("openenv server sent frames that answer no request; ignoring them (counted, logged at most once a minute)")
	}
}

// noteCapacity counts one capacity refusal that Start will wait out, and
// says so at info level the first time and then at most once a minute.
func (c *Client) noteCapacity(err error) {
	n := c.capacityWaits.Add(1)
	if !c.capacityLog.due(sparseLogEvery) {
		return
	}
	ev := c.log.Info().Int64("capacity_waits", n)
	var se *ServerError
	if errors.As(err, &se) && se.MaxSessions > 0 {
		ev = ev.Int("active_sessions", se.ActiveSessions).Int("max_sessions", se.MaxSessions)
	}
	ev.Msg("openenv server at capacity: sessions wait for a free slot (refusals are counted, logged at most once a minute)")
}
