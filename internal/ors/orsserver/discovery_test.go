package orsserver_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

const echoToolsJSON = `{"tools":[{"name":"echo","description":"Echo the given text back. Echoing the task's target wins.","input_schema":{"properties":{"text":{"title":"Text","type":"string"}},"required":["text"],"title":"EchoParams","type":"object"}}]}`

const echoTasks = `{"id":"echo-0","target":"hello"},{"id":"echo-1","target":"world"},{"id":"echo-2","target":"trl"},{"id":"echo-3","target":"openreward"}`

// TestDiscoveryConformance runs ors-protocol.md §13.1 D1–D21.
func TestDiscoveryConformance(t *testing.T) {
	f := startServer(t, orsserver.Options{Version: "1.2.3"}, envs.Echo())
	tests := []struct {
		id, method, path, body string
		hdr                    map[string]string
		noFollow               bool
		status                 int
		exact                  string // byte-exact body
		jsonEq                 string // semantically equal body
		detail                 any    // detail string, or "list" for a 422 list
		location               string
	}{
		{id: "D1", method: "GET", path: "/health", status: 200, exact: `{"status":"ok"}`},
		{id: "D2", method: "GET", path: "/list_environments", status: 200, exact: `["echoenvironment"]`},
		{id: "D3", method: "GET", path: "/echoenvironment/tools", status: 200, exact: echoToolsJSON},
		{id: "D4", method: "GET", path: "/ECHOENVIRONMENT/tools", status: 200, exact: echoToolsJSON},
		{id: "D5 redirect", method: "GET", path: "/tools", noFollow: true, status: 308, location: "/echoenvironment/tools"},
		{id: "D5 followed", method: "GET", path: "/tools", status: 200, exact: echoToolsJSON},
		{id: "D6", method: "GET", path: "/nosuchenv/tools", noFollow: true, status: 308, location: "/echoenvironment/nosuchenv/tools"},
		{id: "D6 followed", method: "GET", path: "/nosuchenv/tools", status: 404, exact: `{"detail":"Not Found"}`},
		{id: "D7", method: "GET", path: "/echoenvironment/splits", status: 200, exact: `[{"name":"train","type":"train"}]`},
		{id: "D8", method: "POST", path: "/echoenvironment/tasks", body: `{"split":"train"}`, status: 200,
			exact: `{"tasks":[` + echoTasks + `],"env_name":"echoenvironment"}`},
		{id: "D9", method: "POST", path: "/echoenvironment/tasks", body: `{"split":"test"}`, status: 400, exact: `{"detail":"Invalid split"}`},
		{id: "D10", method: "POST", path: "/echoenvironment/tasks", body: `{"split":"train","x":1}`, status: 422, detail: "list"},
		{id: "D11", method: "POST", path: "/echoenvironment/num_tasks", body: `{"split":"train"}`, status: 200, exact: `{"num_tasks":4}`},
		{id: "D12", method: "POST", path: "/echoenvironment/task", body: `{"split":"train","index":3}`, status: 200,
			exact: `{"task":{"id":"echo-3","target":"openreward"},"env_name":"echoenvironment"}`},
		{id: "D12 lax int", method: "POST", path: "/echoenvironment/task", body: `{"split":"train","index":"3"}`, status: 200,
			jsonEq: `{"task":{"id":"echo-3","target":"openreward"},"env_name":"echoenvironment"}`},
		{id: "D12 fractional", method: "POST", path: "/echoenvironment/task", body: `{"split":"train","index":3.5}`, status: 422, detail: "list"},
		{id: "D13", method: "POST", path: "/echoenvironment/task", body: `{"split":"train","index":4}`, status: 400, exact: `{"detail":"Invalid index"}`},
		{id: "D14", method: "POST", path: "/echoenvironment/task", body: `{"split":"train","index":-1}`, status: 200,
			jsonEq: `{"task":{"id":"echo-3","target":"openreward"},"env_name":"echoenvironment"}`},
		{id: "D15", method: "POST", path: "/echoenvironment/task_range", body: `{"split":"train","start":1,"stop":3}`, status: 200,
			jsonEq: `{"tasks":[{"id":"echo-1","target":"world"},{"id":"echo-2","target":"trl"}],"env_name":"echoenvironment"}`},
		{id: "D16", method: "POST", path: "/echoenvironment/task_range", body: `{"split":"train","start":-1}`, status: 200,
			jsonEq: `{"tasks":[{"id":"echo-3","target":"openreward"}],"env_name":"echoenvironment"}`},
		{id: "D17", method: "POST", path: "/echoenvironment/task_range", body: `{"split":"train","stop":-3}`, status: 200,
			jsonEq: `{"tasks":[{"id":"echo-0","target":"hello"}],"env_name":"echoenvironment"}`},
		{id: "D18", method: "POST", path: "/echoenvironment/task_range", body: `{"split":"train","start":2,"stop":2}`, status: 200,
			exact: `{"tasks":[],"env_name":"echoenvironment"}`},
		{id: "D19", method: "POST", path: "/echoenvironment/task_range", body: `{"split":"train","start":null}`, status: 200,
			jsonEq: `{"tasks":[` + echoTasks + `],"env_name":"echoenvironment"}`},
		{id: "D20", method: "POST", path: "/num_tasks", body: `{"split":"train"}`, status: 200, exact: `{"num_tasks":4}`,
			hdr: map[string]string{"X-Session-ID": "random-sid", "X-Deployment": "Owner/Env"}},
		{id: "D21", method: "GET", path: "/version", status: 200, exact: `{"version":"1.2.3","build_sha":null}`},
		{id: "double slash", method: "GET", path: "//health", status: 200, exact: `{"status":"ok"}`},
		{id: "405", method: "POST", path: "/health", status: 405, exact: `{"detail":"Method Not Allowed"}`},
		{id: "unknown endpoint", method: "GET", path: "/echoenvironment/nope", status: 404, exact: `{"detail":"Not Found"}`},
		{id: "root with suffix", method: "GET", path: "/health/x", status: 404, exact: `{"detail":"Not Found"}`},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			c := f.follow
			if tt.noFollow {
				c = f.noFollow
			}
			resp := f.do(t, c, tt.method, tt.path, tt.body, tt.hdr)
			require.Equal(t, tt.status, resp.status, resp.body)
			assert.Equal(t, "application/json", resp.header.Get("Content-Type"))
			switch {
			case tt.exact != "":
				assert.Equal(t, tt.exact, resp.body)
			case tt.jsonEq != "":
				assert.JSONEq(t, tt.jsonEq, resp.body)
			}
			if tt.detail == "list" {
				assert.IsType(t, []any{}, detailOf(t, resp.body))
			}
			if tt.location != "" {
				assert.Equal(t, tt.location, resp.header.Get("Location"))
			}
		})
	}
}

func TestDiscoveryIndexOnlyEnv(t *testing.T) {
	env := envs.Echo()
	list := env.ListTasks
	env.ListTasks = nil
	env.NumTasks = func(ctx contextT, split string) (int, error) { l, _ := list(ctx, split); return len(l), nil }
	env.GetTask = func(ctx contextT, split string, i int) (rawJSON, error) { l, _ := list(ctx, split); return l[i], nil }
	f := startServer(t, orsserver.Options{}, env)
	resp := f.do(t, f.follow, "POST", "/echoenvironment/tasks", `{"split":"train"}`, nil)
	assert.Equal(t, http.StatusBadRequest, resp.status)
	assert.Contains(t, detailOf(t, resp.body), "list_tasks is not supported")
	resp = f.do(t, f.follow, "POST", "/echoenvironment/task_range", `{"split":"train","start":1}`, nil)
	assert.JSONEq(t, `{"tasks":[{"id":"echo-1","target":"world"},{"id":"echo-2","target":"trl"},{"id":"echo-3","target":"openreward"}],"env_name":"echoenvironment"}`, resp.body)
	resp = f.do(t, f.follow, "POST", "/echoenvironment/task", `{"split":"train","index":-4}`, nil)
	assert.JSONEq(t, `{"task":{"id":"echo-0","target":"hello"},"env_name":"echoenvironment"}`, resp.body)
}

func TestNewRejectsBadDeclarations(t *testing.T) {
	noTools := envs.Echo()
	noTools.Tools = nil
	noSplits := envs.Echo()
	noSplits.Splits = nil
	reserved := envs.Echo()
	reserved.Name = "Health"
	for name, list := range map[string][]*orsserver.Env{
		"none": nil, "no tools": {noTools}, "no splits": {noSplits}, "duplicate": {envs.Echo(), envs.Echo()}, "reserved": {reserved},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := orsserver.New(orsserver.Options{}, list...)
			require.Error(t, err)
		})
	}
}
