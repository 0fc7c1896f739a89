package orsserver_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

func callFixture(t *testing.T, opts orsserver.Options) *fixture {
	t.Helper()
	f := startServerCounted(t, opts)
	runSteps(t, f, "S", []step{{id: "S3", method: "POST", path: "/create", body: `{"split":"train","index":3}`, status: 200}})
	return f
}

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestCallConformance covers §13.3 C1–C14, C20 and the JSON errors C8–C11.
func TestCallConformance(t *testing.T) {
	f := callFixture(t, orsserver.Options{})
	tests := []struct {
		id, path, body string
		hdr            map[string]string
		status         int    // JSON error status; 0 = SSE 200
		end            string // exact concatenated result
		endPrefix      string // result's error text prefix (ok:false)
		errEvent       string // exact SSE error text
		jsonDetail     string
	}{
		{id: "C1", body: `{"name":"echo","input":{"text":"openreward"}}`,
			end: `{"ok":true,"output":{"blocks":[{"text":"match","detail":null,"type":"text"}],"metadata":null,"reward":1.0,"finished":true}}`},
		{id: "C2", body: `{"name":"echo","input":{"text":"nope"}}`,
			end: `{"ok":true,"output":{"blocks":[{"text":"no match (got 'nope')","detail":null,"type":"text"}],"metadata":null,"reward":0.0,"finished":false}}`},
		{id: "C3", body: `{"name":"hint","input":{}}`,
			end: `{"ok":true,"output":{"blocks":[{"text":"try echo(text=...)","detail":null,"type":"text"}],"metadata":null,"reward":null,"finished":false}}`},
		{id: "C4", body: `{"name":"nosuchtool","input":{}}`, end: `{"ok":false,"error":"'nosuchtool' is not a valid tool","reason":"not_found"}`},
		{id: "C5", body: `{"name":"echo","input":{}}`, endPrefix: "Tool input validation error: [{'type': 'missing', 'loc': ('text',), 'msg': 'Field required'"},
		{id: "C6", body: `{"name":"echo","input":{"text":5}}`, endPrefix: "Tool input validation error: [{'type': 'string_type'"},
		{id: "C7", body: `{"name":"echo","input":{"text":"openreward","extra":1}}`,
			end: `{"ok":true,"output":{"blocks":[{"text":"match","detail":null,"type":"text"}],"metadata":null,"reward":1.0,"finished":true}}`},
		{id: "C8", body: `{"name":"echo"}`, status: 422},
		{id: "C9", body: `{"name":"echo","input":[]}`, status: 422},
		{id: "C10", body: `{"name":"echo","input":{}}`, hdr: map[string]string{"X-Session-ID": ""}, status: 400, jsonDetail: "X-Session-ID header is required"},
		{id: "C11", body: `{"name":"echo","input":{}}`, hdr: map[string]string{"X-Session-ID": "unknown"}, status: 404, jsonDetail: "Active environment not found"},
		{id: "C12", path: "/call", body: `{"name":"echo","input":{"text":"openreward"}}`,
			end: `{"ok":true,"output":{"blocks":[{"text":"match","detail":null,"type":"text"}],"metadata":null,"reward":1.0,"finished":true}}`},
		{id: "C13", body: `{"name":"boom","input":{}}`, errEvent: "bad"},
		{id: "C14", body: `{"name":"crash","input":{}}`, errEvent: "'crash' returned NoneType; expected ToolOutput"},
		{id: "C20", body: `{"name":"echo","input":{},"foo":1}`, status: 422},
		{id: "HTML and unicode unescaped", body: `{"name":"echo","input":{"text":"<a&b> é"}}`,
			end: `{"ok":true,"output":{"blocks":[{"text":"no match (got '<a&b> é')","detail":null,"type":"text"}],"metadata":null,"reward":0.0,"finished":false}}`},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			path := tt.path
			if path == "" {
				path = "/echoenvironment/call"
			}
			hdr := map[string]string{"X-Session-ID": "S", "Accept": "text/event-stream"}
			for k, v := range tt.hdr {
				hdr[k] = v
			}
			resp := f.do(t, f.follow, "POST", path, tt.body, hdr)
			if tt.status != 0 {
				require.Equal(t, tt.status, resp.status, resp.body)
				assert.Equal(t, "application/json", resp.header.Get("Content-Type"))
				if tt.jsonDetail != "" {
					assert.Equal(t, tt.jsonDetail, detailOf(t, resp.body))
				}
				return
			}
			require.Equal(t, 200, resp.status, resp.body)
			evs := events(t, resp.body)
			require.NotEmpty(t, evs)
			assert.Equal(t, "task_id", evs[0].Name)
			assert.Regexp(t, hex32, evs[0].Data)
			last := evs[len(evs)-1]
			if tt.errEvent != "" {
				assert.Equal(t, ors.Event{Name: "error", Data: tt.errEvent}, last)
				assert.Len(t, evs, 2, "no end after error")
				return
			}
			require.Equal(t, "end", last.Name)
			result := concat(evs)
			if tt.end != "" {
				assert.Equal(t, tt.end, result)
			}
			if tt.endPrefix != "" {
				var r ors.RunToolOutput
				require.NoError(t, json.Unmarshal([]byte(result), &r))
				assert.False(t, r.OK)
				assert.Equal(t, "input_validation", r.Reason)
				assert.True(t, strings.HasPrefix(r.Error, tt.endPrefix), r.Error)
			}
		})
	}
}

func concat(evs []ors.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Name == "chunk" || ev.Name == "end" {
			b.WriteString(ev.Data)
		}
	}
	return b.String()
}

// TestCallLargeResult covers C15 and checks every framing rule of §3.3 on
// the raw bytes.
func TestCallLargeResult(t *testing.T) {
	f := callFixture(t, orsserver.Options{})
	for _, size := range []int{20000, 100000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			resp := f.do(t, f.follow, "POST", "/echoenvironment/call", fmt.Sprintf(`{"name":"big","input":{"size":%d}}`, size), sidHeader("S"))
			require.Equal(t, 200, resp.status)
			evs := events(t, resp.body)
			chunks := 0
			for _, ev := range evs[1:] {
				if ev.Name == "chunk" {
					chunks++
				}
				assert.LessOrEqual(t, len(ev.Data), orsserver.MaxChunkBytes)
				assert.True(t, utf8.ValidString(ev.Data))
				r, _ := utf8.DecodeRuneInString(ev.Data)
				assert.False(t, orsserver.IsPySpace(r), "chunk starts with %q", r)
			}
			assert.GreaterOrEqual(t, chunks, size/4096)
			var out ors.RunToolOutput
			require.NoError(t, json.Unmarshal([]byte(concat(evs)), &out))
			require.True(t, out.OK)
			assert.Equal(t, bigText(size), out.Output.Text())
			assert.Equal(t, 0.5, *out.Output.Reward)
			for _, line := range strings.Split(resp.body, "\r\n") {
				assert.NotContains(t, line, "\n", "only CRLF line ends")
				assert.NotContains(t, line, "\r", "only CRLF line ends")
				assert.True(t, line == "" || strings.Contains(line, ":"), "line without colon: %q", line)
			}
		})
	}
}

// TestCallHeartbeat covers C16 with a 100 ms heartbeat.
func TestCallHeartbeat(t *testing.T) {
	f := callFixture(t, orsserver.Options{Heartbeat: 100 * time.Millisecond})
	resp := f.do(t, f.follow, "POST", "/echoenvironment/call", `{"name":"sleep","input":{"millis":450}}`, sidHeader("S"))
	require.Equal(t, 200, resp.status)
	assert.GreaterOrEqual(t, strings.Count(resp.body, "\r\n: ping - "), 3, resp.body)
	assert.Regexp(t, `^event: task_id\r\ndata: [0-9a-f]{32}\r\n\r\n(: ping - [^\r]+\r\n\r\n)+event: end\r\n`, resp.body)
}

// TestCallResume covers C17, C18, C19 and resume expiry after the linger.
func TestCallResume(t *testing.T) {
	f := callFixture(t, orsserver.Options{ResumeLinger: 300 * time.Millisecond,
		Hooks: orsserver.Hooks{DropCallStream: func(r *http.Request, _ string) bool { return r.Header.Get("X-Test-Drop") != "" }}})

	first := f.do(t, f.follow, "POST", "/echoenvironment/call", `{"name":"counted","input":{}}`, sidHeader("S"))
	evs := events(t, first.body)
	id := evs[0].Data
	before := f.counter.Load()

	t.Run("C17 resume replays without re-running", func(t *testing.T) {
		again := f.do(t, f.follow, "POST", "/echoenvironment/call", fmt.Sprintf(`{"name":"counted","input":{},"task_id":%q}`, id), sidHeader("S"))
		evs2 := events(t, again.body)
		assert.Equal(t, evs, evs2)
		assert.Equal(t, before, f.counter.Load())
	})
	t.Run("C18 unknown task id", func(t *testing.T) {
		resp := f.do(t, f.follow, "POST", "/echoenvironment/call", `{"name":"counted","input":{},"task_id":"deadbeefdeadbeefdeadbeefdeadbeef"}`, sidHeader("S"))
		assert.Equal(t, []ors.Event{{Name: "error", Data: "unknown task_id"}}, events(t, resp.body))
	})
	t.Run("C19 disconnect mid-call then resume", func(t *testing.T) {
		runs := f.counter.Load()
		req, err := http.NewRequest("POST", f.url+"/echoenvironment/call", strings.NewReader(`{"name":"sleep","input":{"millis":200}}`))
		require.NoError(t, err)
		req.Header.Set("X-Session-ID", "S")
		req.Header.Set("X-Test-Drop", "1")
		resp, err := f.follow.Do(req)
		require.NoError(t, err)
		r := ors.NewSSEReader(resp.Body)
		ev, err := r.Next()
		require.NoError(t, err)
		require.Equal(t, "task_id", ev.Name)
		_, err = r.Next()
		require.Error(t, err, "the stream was dropped")
		resp.Body.Close()
		again := f.do(t, f.follow, "POST", "/echoenvironment/call", fmt.Sprintf(`{"name":"sleep","input":{},"task_id":%q}`, ev.Data), sidHeader("S"))
		evs := events(t, again.body)
		require.Equal(t, "end", evs[len(evs)-1].Name)
		assert.Contains(t, evs[len(evs)-1].Data, "slept")
		assert.Equal(t, runs+1, f.counter.Load(), "tool ran once")
	})
	t.Run("resume expires after linger", func(t *testing.T) {
		time.Sleep(400 * time.Millisecond)
		resp := f.do(t, f.follow, "POST", "/echoenvironment/call", fmt.Sprintf(`{"name":"counted","input":{},"task_id":%q}`, id), sidHeader("S"))
		assert.Equal(t, []ors.Event{{Name: "error", Data: "unknown task_id"}}, events(t, resp.body))
	})
}
