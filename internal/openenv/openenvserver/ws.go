package openenvserver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/ortrain/ortrain/internal/openenv"
)

// handleSocket serves /ws (kind "ws", the session protocol) and the /mcp
// WebSocket (kind "mcp-ws", bare JSON-RPC). The session is created when the
// socket is accepted and destroyed when it closes.
func (s *Server) handleSocket(w http.ResponseWriter, r *http.Request, kind string) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()
	ww := &watchWriter{ResponseWriter: w}
	conn, err := websocket.Accept(ww, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return // Accept answered the bad handshake itself
	}
	defer func() { _ = conn.CloseNow() }()
	conn.SetReadLimit(s.opts.MaxMessageBytes)
	ctx, cancel := context.WithCancel(s.baseCtx)
	defer cancel()

	// kill runs from the reaper or Shutdown while this handler reads: the
	// close handshake ends the Read below.
	kill := func(reason string) {
		code := websocket.StatusNormalClosure
		if reason == "shutdown" {
			code = websocket.StatusGoingAway
		}
		s.closeConn(conn, code, reason)
	}
	sess, err := s.openSession(ctx, kind, kill)
	if err != nil {
		s.refuse(ctx, conn, kind, err)
		return
	}
	defer s.endSession(sess, "disconnected")
	// Whoever closes, the slot is free before the close frame goes out.
	ww.watch.arm(func() { s.freeSlot(sess) })
	if s.opts.PingInterval > 0 {
		go s.pingLoop(ctx, conn)
	}
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageText && !utf8.Valid(data) {
			// RFC 6455 §8.1: text that is not UTF-8 fails the connection
			// with 1007; it is never handed to the protocol.
			s.closeConn(conn, websocket.StatusInvalidFramePayloadData, "text frame is not valid UTF-8")
			return
		}
		done := sess.begin()
		var reply []byte
		end := false
		if kind == "mcp-ws" {
			reply = pyDumps(mustMarshal(s.handleRPC(ctx, data, rpcCall{own: sess, parseF: wsParseError})))
		} else {
			reply, end = s.handleFrame(ctx, sess, data)
		}
		done()
		if reply != nil {
			wctx, wcancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
			err = conn.Write(wctx, websocket.MessageText, reply)
			wcancel()
			if err != nil {
				return
			}
		}
		if end {
			s.closeConn(conn, websocket.StatusNormalClosure, "")
			return
		}
	}
}

// refuse answers a socket the server cannot serve: CAPACITY_REACHED or
// FACTORY_ERROR on /ws, -32000 on /mcp, sent unsolicited; then 1000.
func (s *Server) refuse(ctx context.Context, conn *websocket.Conn, kind string, err error) {
	var ce *capacityError
	var fe *factoryError
	var msg []byte
	switch {
	case kind == "mcp-ws" && errors.As(err, &ce):
		msg = pyDumps(mustMarshal(openenv.RPCResponse{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: capacityRPC(ce)}))
	case kind == "mcp-ws":
		msg = pyDumps(mustMarshal(openenv.RPCResponse{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: rpcErr(openenv.RPCInternalError, err.Error(), nil)}))
	case errors.As(err, &ce):
		msg = errorFrame(openenv.CodeCapacityReached, ce.Error(), map[string]any{"active_sessions": ce.active, "max_sessions": ce.max})
	case errors.As(err, &fe):
		s.log.Warn().Err(err).Msg("env factory failed")
		msg = errorFrame(openenv.CodeFactoryError, fe.Error(), map[string]any{"factory_name": fe.name})
	default:
		msg = errorFrame(openenv.CodeSessionError, err.Error(), nil)
	}
	wctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
	defer cancel()
	if conn.Write(wctx, websocket.MessageText, msg) == nil {
		s.closeConn(conn, websocket.StatusNormalClosure, "")
	}
}

// closeConn runs the close handshake in the background of a deadline: a
// peer that never answers the close frame costs at most WriteTimeout.
func (s *Server) closeConn(conn *websocket.Conn, code websocket.StatusCode, reason string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = conn.Close(code, reason)
	}()
	select {
	case <-done:
	case <-time.After(s.opts.WriteTimeout):
		_ = conn.CloseNow()
		<-done
	}
}

func (s *Server) pingLoop(ctx context.Context, conn *websocket.Conn) {
	t := time.NewTicker(s.opts.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, s.opts.PingInterval)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				_ = conn.CloseNow()
				return
			}
		}
	}
}

// errorFrame renders {"type":"error","data":{"message","code",...extra}}.
func errorFrame(code openenv.ErrorCode, msg string, extra map[string]any) []byte {
	data := map[string]any{"message": msg, "code": code}
	for k, v := range extra {
		data[k] = v
	}
	return mustMarshal(map[string]any{"type": openenv.FrameError, "data": data})
}

// handleFrame answers one /ws frame; end means close the socket (1000)
// after the reply (if any).
func (s *Server) handleFrame(ctx context.Context, sess *session, data []byte) (reply []byte, end bool) {
	f, ferr := parseClientFrame(data)
	if ferr != nil {
		extra := map[string]any{}
		if ferr.issues != nil {
			extra["errors"] = ferr.issues
		}
		return errorFrame(ferr.code, ferr.message, extra), ferr.fatal()
	}
	switch f.Type {
	case openenv.FrameClose:
		return nil, true
	case openenv.FrameState:
		st, err := s.state(ctx, sess)
		if err != nil {
			return errorFrame(openenv.CodeExecutionError, err.Error(), nil), false
		}
		return mustMarshal(map[string]any{"type": openenv.FrameState, "data": st}), false
	case openenv.FrameMCP:
		return mustMarshal(map[string]any{"type": openenv.FrameMCP, "data": s.handleRPC(ctx, f.Data, rpcCall{own: sess, parseF: wsParseError})}), false
	}
	var res openenv.StepResult
	var err error
	if f.Type == openenv.FrameReset {
		res, err = s.reset(ctx, sess, f.Data)
	} else {
		res, err = s.step(ctx, sess, f.Data)
	}
	var ve *validationError
	switch {
	case errors.As(err, &ve):
		return errorFrame(openenv.CodeValidationError, "Invalid message", map[string]any{"errors": ve.issues}), false
	case err != nil:
		return errorFrame(openenv.CodeExecutionError, err.Error(), nil), false
	}
	return mustMarshal(map[string]any{"type": openenv.FrameObservation, "data": res}), false
}
