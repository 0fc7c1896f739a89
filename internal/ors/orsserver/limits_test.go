package orsserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// echoCap is the most of an input a validation item repeats (the kit's
// maxEchoBytes) and truncMark what ends a cut one.
const (
	echoCap   = 1 << 10
	truncMark = "... [truncated]"
)

type item422 struct {
	Type           string          `json:"type"`
	Loc            []any           `json:"loc"`
	Input          json.RawMessage `json:"input"`
	InputTruncated bool            `json:"input_truncated"`
}

// TestValidationEchoIsCapped: a 422 repeats at most echoCap bytes of the
// input per item, marked as cut, so a large body no longer makes a reply
// several times its size; small inputs are echoed exactly as before.
func TestValidationEchoIsCapped(t *testing.T) {
	f := startServer(t, orsserver.Options{}, envs.Echo())
	big := strings.Repeat("é", 1<<20) // 2 MiB of 2-byte runes: a cut lands mid-rune unless moved
	tests := []struct {
		name, path, body string
		sid              bool
		truncated        []string // loc[1] (or "" for the body) of each cut item
		exactInput       string   // for an uncut single item
	}{
		{name: "missing fields echo the whole body each", path: "/echoenvironment/task", body: `{"bulk":"` + big + `"}`,
			truncated: []string{"split", "index", "bulk"}},
		{name: "extra key", path: "/echoenvironment/tasks", body: `{"split":"train","bulk":"` + big + `"}`, truncated: []string{"bulk"}},
		{name: "wrong kind", path: "/echoenvironment/tasks", body: `{"split":["` + big + `"]}`, truncated: []string{"split"}},
		{name: "not an object", path: "/echoenvironment/tasks", body: `["` + big + `"]`, truncated: []string{""}},
		{name: "create value error", path: "/create", sid: true, body: `{"task_spec":{"x":"` + big + `"},"split":"train","index":0}`, truncated: []string{""}},
		{name: "small input exact", path: "/echoenvironment/tasks", body: `{"split":"train","bogus":{"a":[1,2]}}`, exactInput: `{"a":[1,2]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr map[string]string
			if tt.sid {
				hdr = sidHeader("echo-cap")
			}
			resp := f.do(t, f.follow, "POST", tt.path, tt.body, hdr)
			require.Equal(t, http.StatusUnprocessableEntity, resp.status, "%.300s", resp.body)
			assert.Less(t, len(resp.body), 8<<10, "the reply is bounded, not a copy of the body")
			var got struct {
				Detail []item422 `json:"detail"`
			}
			require.NoError(t, json.Unmarshal([]byte(resp.body), &got), "%.300s", resp.body)
			if tt.exactInput != "" {
				require.Len(t, got.Detail, 1)
				assert.JSONEq(t, tt.exactInput, string(got.Detail[0].Input))
				assert.False(t, got.Detail[0].InputTruncated)
				assert.NotContains(t, resp.body, "input_truncated")
				return
			}
			var cut []string
			for _, it := range got.Detail {
				if !it.InputTruncated {
					continue
				}
				loc := ""
				if len(it.Loc) > 1 {
					loc = fmt.Sprint(it.Loc[1])
				}
				cut = append(cut, loc)
				var s string
				require.NoError(t, json.Unmarshal(it.Input, &s), "a cut input is a string")
				assert.True(t, strings.HasSuffix(s, truncMark), s)
				assert.LessOrEqual(t, len(s), echoCap+len(truncMark))
				assert.True(t, utf8.ValidString(s))
				assert.NotContains(t, s, "\ufffd", "the cut does not split a rune")
			}
			assert.ElementsMatch(t, tt.truncated, cut)
		})
	}
}

// TestToolInputEchoIsCapped: a tool's input validation error (an ok:false
// result) repeats the input per missing field; it is capped too.
func TestToolInputEchoIsCapped(t *testing.T) {
	f := startServer(t, orsserver.Options{}, envs.Echo())
	runSteps(t, f, "tool-cap", []step{{id: "create", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200}})
	body := `{"name":"echo","input":{"bulk":"` + strings.Repeat("x", 1<<20) + `"}}`
	resp := f.do(t, f.follow, "POST", "/echoenvironment/call", body, sidHeader("tool-cap"))
	require.Equal(t, http.StatusOK, resp.status)
	evs := events(t, resp.body)
	require.NotEmpty(t, evs)
	end := evs[len(evs)-1]
	require.Equal(t, "end", end.Name)
	var out struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(end.Data), &out))
	assert.False(t, out.OK)
	assert.Contains(t, out.Error, "'type': 'missing'")
	assert.Contains(t, out.Error, truncMark)
	assert.Less(t, len(out.Error), 4<<10)
}

// TestBodyOverCapIs413: a body past the 16 MiB cap is refused as too
// large ({"detail": string}, the protocol's error shape), not as invalid.
func TestBodyOverCapIs413(t *testing.T) {
	f := startServer(t, orsserver.Options{}, envs.Echo())
	runSteps(t, f, "big-body", []step{{id: "create", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200}})
	huge := `{"split":"` + strings.Repeat("x", 16<<20) + `"}`
	tests := []struct{ name, path string }{
		{"discovery", "/echoenvironment/tasks"},
		{"create", "/create"},
		{"call", "/echoenvironment/call"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := f.do(t, f.follow, "POST", tt.path, huge, sidHeader("big-body"))
			require.Equal(t, http.StatusRequestEntityTooLarge, resp.status, "%.300s", resp.body)
			assert.Equal(t, "application/json", resp.header.Get("Content-Type"))
			detail, ok := detailOf(t, resp.body).(string)
			require.True(t, ok, resp.body)
			assert.Contains(t, detail, "too large")
		})
	}
}

// TestSessionIDLength: ids are bounded at 256 bytes on every endpoint that
// takes one; longer ones are refused as a missing one is (400, detail).
func TestSessionIDLength(t *testing.T) {
	f := startServer(t, orsserver.Options{}, envs.Echo())
	tests := []struct {
		name   string
		sid    string
		path   string
		body   string
		status int
	}{
		{"256 bytes create", strings.Repeat("a", 256), "/create", `{"split":"train","index":0}`, 200},
		{"256 bytes ping", strings.Repeat("a", 256), "/ping", "", 200},
		{"257 bytes create", strings.Repeat("b", 257), "/create", `{"split":"train","index":0}`, 400},
		{"500 kB create", strings.Repeat("c", 500_000), "/create", `{"split":"train","index":0}`, 400},
		{"257 bytes ping", strings.Repeat("b", 257), "/ping", "", 400},
		{"257 bytes call", strings.Repeat("b", 257), "/echoenvironment/call", `{"name":"echo","input":{}}`, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := f.do(t, f.follow, "POST", tt.path, tt.body, sidHeader(tt.sid))
			require.Equal(t, tt.status, resp.status, "%.300s", resp.body)
			if tt.status == 400 {
				assert.Equal(t, `{"detail":"X-Session-ID header is `+fmt.Sprint(len(tt.sid))+` bytes long; the limit is 256"}`, resp.body)
			}
		})
	}
	assert.Equal(t, int64(1), f.srv.Stats().Live, "only the 256-byte id made a session")
}

// TestMaxSessions: past the limit /create answers 503 with Retry-After
// (the ORS busy answer); a delete frees the slot; ids stay bounded.
func TestMaxSessions(t *testing.T) {
	f := startServer(t, orsserver.Options{MaxSessions: 2}, envs.Echo())
	create := `{"split":"train","index":0}`
	runSteps(t, f, "s1", []step{{id: "s1", method: "POST", path: "/create", body: create, status: 200}})
	runSteps(t, f, "s2", []step{{id: "s2", method: "POST", path: "/create", body: create, status: 200}})

	resp := f.do(t, f.follow, "POST", "/create", create, sidHeader("s3"))
	require.Equal(t, http.StatusServiceUnavailable, resp.status, resp.body)
	assert.Equal(t, "1", resp.header.Get("Retry-After"))
	assert.Equal(t, "application/json", resp.header.Get("Content-Type"))
	assert.Equal(t, `{"detail":"Server at capacity: 2 sessions open (the limit); retry after one ends"}`, resp.body)
	// A live id is still "already exists", not a wait.
	runSteps(t, f, "s1", []step{{id: "dup at capacity", method: "POST", path: "/create", body: create, status: 400, exact: `{"detail":"Session already exists"}`}})

	runSteps(t, f, "s1", []step{{id: "delete s1", method: "POST", path: "/delete", status: 200}})
	runSteps(t, f, "s3", []step{{id: "s3 after delete", method: "POST", path: "/create", body: create, status: 200}})
	st := f.srv.Stats()
	assert.Equal(t, int64(2), st.Live)
	assert.Equal(t, int64(3), st.Created)
}

// TestMaxSessionsConcurrent: many concurrent creates against a small limit
// never open more than the limit (the slot is reserved atomically).
func TestMaxSessionsConcurrent(t *testing.T) {
	const limit, tries = 3, 40
	f := startServer(t, orsserver.Options{MaxSessions: limit}, envs.Echo())
	var wg sync.WaitGroup
	statuses := make([]int, tries)
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequest("POST", f.url+"/create", strings.NewReader(`{"split":"train","index":0}`))
			if err != nil {
				return
			}
			req.Header.Set("X-Session-ID", fmt.Sprintf("c-%d", i))
			resp, err := f.follow.Do(req)
			if err != nil {
				return
			}
			_ = resp.Body.Close()
			statuses[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	counts := map[int]int{}
	for _, s := range statuses {
		counts[s]++
	}
	assert.Equal(t, map[int]int{200: limit, 503: tries - limit}, counts)
	assert.Equal(t, int64(limit), f.srv.Stats().Live)
}

// TestClientWaitsOutCapacity: ortrain's ORS client retries the capacity
// refusal and opens its session once a slot frees.
func TestClientWaitsOutCapacity(t *testing.T) {
	f := startServer(t, orsserver.Options{MaxSessions: 1}, envs.Echo())
	runSteps(t, f, "holder", []step{{id: "holder", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200}})
	var once sync.Once
	c, err := ors.NewClient(f.url, ors.Options{
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), RequestAttempts: 5,
		// The first wait frees the slot, so the retry finds it.
		Sleep: func(context.Context, time.Duration) error {
			once.Do(func() {
				runSteps(t, f, "holder", []step{{id: "free", method: "POST", path: "/delete", status: 200}})
			})
			return nil
		},
	})
	require.NoError(t, err)
	ctx := context.Background()
	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 0})
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
	assert.Equal(t, int64(1), c.CapacityWaits(), "the 503 was waited out")
}
