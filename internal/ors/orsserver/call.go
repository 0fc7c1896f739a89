package orsserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ortrain/ortrain/internal/ors"
)

// invocation is one running or finished tool call, resumable by task id.
type invocation struct {
	done    chan struct{}
	payload string // RunToolOutput JSON, when errMsg is empty
	errMsg  string // SSE error text when the tool raised
}

// whitespaceRunLimit: longer whitespace runs in a result are \u-escaped so
// chunk boundaries can always avoid starting with whitespace.
const whitespaceRunLimit = 512

func (s *Server) handleCall(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.lookup(w, r)
	if !ok {
		return
	}
	inst, ok := s.awaitReady(w, r, sess)
	if !ok {
		return
	}
	body, ok := decodeBody(w, r, []bodyField{
		{name: "name", kind: kindString, required: true},
		{name: "input", kind: kindObject, required: true},
		{name: "task_id", kind: kindString},
	})
	if !ok {
		return
	}
	name, _ := bodyString(body, "name")
	taskID, resume := bodyString(body, "task_id")

	stream := startSSE(w)
	var inv *invocation
	if resume {
		v, ok := s.calls.Load(taskID)
		if !ok {
			_ = stream.event("error", "unknown task_id")
			return
		}
		inv = v.(*invocation)
	} else {
		taskID = newID()
		inv = &invocation{done: make(chan struct{})}
		s.calls.Store(taskID, inv)
		s.toolCalls.Add(1)
		go s.invoke(sess, inst, name, body["input"], taskID, inv)
	}
	if stream.event("task_id", taskID) != nil {
		return
	}
	if h := s.opts.Hooks.DropCallStream; h != nil && h(r, taskID) {
		panic(http.ErrAbortHandler)
	}
	s.streamResult(r.Context(), stream, inv)
}

// streamResult sends heartbeats until inv finishes, then its result.
func (s *Server) streamResult(ctx context.Context, stream *sseStream, inv *invocation) {
	t := time.NewTicker(s.opts.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return // the tool keeps running; the client may resume
		case now := <-t.C:
			if stream.comment(now) != nil {
				return
			}
		case <-inv.done:
			if inv.errMsg != "" {
				_ = stream.event("error", inv.errMsg)
				return
			}
			chunks := Chunks(inv.payload, MaxChunkBytes)
			for i, c := range chunks {
				ev := "chunk"
				if i == len(chunks)-1 {
					ev = "end"
				}
				if stream.event(ev, c) != nil {
					return
				}
			}
			return
		}
	}
}

// invoke runs the tool (detached from the request, so a dropped client can
// resume) and keeps the result for ResumeLinger.
func (s *Server) invoke(sess *session, inst Instance, name string, input json.RawMessage, taskID string, inv *invocation) {
	defer func() {
		close(inv.done)
		sess.touch()
		time.AfterFunc(s.opts.ResumeLinger, func() { s.calls.Delete(taskID) })
	}()
	result, err := s.runTool(sess, inst, name, input)
	if err != nil {
		inv.errMsg = err.Error()
		return
	}
	payload, err := ors.MarshalJSON(result)
	if err != nil {
		inv.errMsg = fmt.Sprintf("'%s' returned an output that cannot be encoded: %v", name, err)
		return
	}
	inv.payload = escapeLongWhitespaceRuns(string(payload), whitespaceRunLimit)
}

// runTool dispatches to a shared or task-scoped tool. Tool-level failures
// are ok:false results; a raised error or panic is returned as err.
func (s *Server) runTool(sess *session, inst Instance, name string, input json.RawMessage) (res ors.RunToolOutput, err error) {
	tool, ok := sess.env.tools[name]
	if !ok {
		if tt, isTT := inst.(TaskToolsInstance); isTT {
			for _, t := range tt.TaskTools() {
				if t.Name == name {
					tool, ok = t, true
					break
				}
			}
		}
	}
	if !ok {
		return ors.RunToolOutput{Error: fmt.Sprintf("'%s' is not a valid tool", name), Reason: "not_found"}, nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	out, err := tool.Call(s.baseCtx, inst, input)
	var inputErr *InputError
	if errors.As(err, &inputErr) {
		return ors.RunToolOutput{Error: inputErr.Error(), Reason: "input_validation"}, nil
	}
	if err != nil {
		return ors.RunToolOutput{}, err
	}
	return ors.RunToolOutput{OK: true, Output: &out}, nil
}
