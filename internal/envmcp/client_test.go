package envmcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// mcpClient is a minimal raw-HTTP MCP client: just enough of the streamable
// HTTP transport to drive the server the way an agent's SDK does.
type mcpClient struct {
	t       *testing.T
	url     string // .../mcp/{id}
	key     string
	session string // Mcp-Session-Id once initialized
	version string // MCP-Protocol-Version once initialized

	mu   sync.Mutex
	next int
}

// reply is one HTTP answer, with its JSON-RPC fields when the body has them.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
	RPC    struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
}

func newClient(t *testing.T, base, id, key string) *mcpClient {
	return &mcpClient{t: t, url: base + "/mcp/" + id, key: key}
}

// do sends one HTTP request with the client's key and session headers;
// extra headers override them ("" deletes one).
func (c *mcpClient) do(method string, body []byte, extra map[string]string) *reply {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.url, bytes.NewReader(body))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
	}
	if c.version != "" {
		req.Header.Set("MCP-Protocol-Version", c.version)
	}
	for k, v := range extra {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	r := &reply{Status: resp.StatusCode, Header: resp.Header}
	r.Body, err = io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	if len(r.Body) > 0 {
		require.Equal(c.t, "application/json", resp.Header.Get("Content-Type"), "body %s", r.Body)
		require.NoError(c.t, json.Unmarshal(r.Body, &r.RPC), "body %s", r.Body)
	}
	return r
}

// post sends a raw body.
func (c *mcpClient) post(body string) *reply {
	c.t.Helper()
	return c.do(http.MethodPost, []byte(body), nil)
}

// request sends a JSON-RPC request with a fresh id.
func (c *mcpClient) request(method string, params any) *reply {
	c.t.Helper()
	c.mu.Lock()
	c.next++
	id := c.next
	c.mu.Unlock()
	msg := map[string]any{"jsonrpc": "2.0", "id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	body, err := json.Marshal(msg)
	require.NoError(c.t, err)
	r := c.do(http.MethodPost, body, nil)
	if r.Status == http.StatusOK {
		require.JSONEq(c.t, fmt.Sprint(id), string(r.RPC.ID), "the reply answers the request's id")
	}
	return r
}

// notify sends a JSON-RPC notification.
func (c *mcpClient) notify(method string) *reply {
	c.t.Helper()
	return c.post(fmt.Sprintf(`{"jsonrpc":"2.0","method":%q}`, method))
}

// initialize runs the handshake (initialize, notifications/initialized)
// and returns initialize's result.
func (c *mcpClient) initialize(version string) initResult {
	c.t.Helper()
	r := c.request("initialize", map[string]any{
		"protocolVersion": version,
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]string{"name": "envmcp-test", "version": "0"},
	})
	require.Equal(c.t, http.StatusOK, r.Status, "initialize: %s", r.Body)
	require.Nil(c.t, r.RPC.Error, "initialize: %s", r.Body)
	var res initResult
	require.NoError(c.t, json.Unmarshal(r.RPC.Result, &res))
	c.session = r.Header.Get("Mcp-Session-Id")
	require.NotEmpty(c.t, c.session, "initialize sets Mcp-Session-Id")
	c.version = res.ProtocolVersion
	n := c.notify("notifications/initialized")
	require.Equal(c.t, http.StatusAccepted, n.Status)
	require.Empty(c.t, n.Body)
	return res
}

type initResult struct {
	ProtocolVersion string `json:"protocolVersion"`
	Capabilities    struct {
		Tools *struct {
			ListChanged bool `json:"listChanged"`
		} `json:"tools"`
	} `json:"capabilities"`
	ServerInfo struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"serverInfo"`
}

type listedTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	Annotations json.RawMessage `json:"annotations"`
}

func (c *mcpClient) listTools() []listedTool {
	c.t.Helper()
	r := c.request("tools/list", nil)
	require.Equal(c.t, http.StatusOK, r.Status, "tools/list: %s", r.Body)
	require.Nil(c.t, r.RPC.Error, "tools/list: %s", r.Body)
	var res struct {
		Tools []listedTool `json:"tools"`
	}
	require.NoError(c.t, json.Unmarshal(r.RPC.Result, &res))
	return res.Tools
}

type toolResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	IsError           bool                       `json:"isError"`
	StructuredContent json.RawMessage            `json:"structuredContent"`
	Meta              map[string]json.RawMessage `json:"_meta"`
}

// text is the result's one text block.
func (r toolResult) text(t *testing.T) string {
	t.Helper()
	require.Len(t, r.Content, 1)
	require.Equal(t, "text", r.Content[0].Type)
	return r.Content[0].Text
}

// callTool calls a tool and requires a JSON-RPC result (isError or not).
func (c *mcpClient) callTool(name string, args any) toolResult {
	c.t.Helper()
	r := c.request("tools/call", map[string]any{"name": name, "arguments": args})
	require.Equal(c.t, http.StatusOK, r.Status, "tools/call: %s", r.Body)
	require.Nil(c.t, r.RPC.Error, "tools/call: %s", r.Body)
	var res toolResult
	require.NoError(c.t, json.Unmarshal(r.RPC.Result, &res))
	return res
}

// serve starts a Server on a loopback port.
func serve(t *testing.T, opts envmcp.Options) (*envmcp.Server, string) {
	t.Helper()
	opts.Logger = zerolog.Nop()
	srv := envmcp.New(opts)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return srv, hs.URL
}

// openBuiltin opens a session on task 0 of a built-in env's train split,
// over protocol ("" for the env's own).
func openBuiltin(t *testing.T, target, protocol string) (envtarget.Session, []envtarget.ToolSpec) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	env, err := envtarget.Resolve(ctx, target, envtarget.Options{Logger: zerolog.Nop(), Protocol: protocol})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, env.Close(context.Background())) })
	sess, err := env.OpenSession(ctx, envtarget.TaskRef{Split: "train", Index: 0})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(context.Background()) })
	tools, err := sess.Tools(ctx)
	require.NoError(t, err)
	return sess, tools
}
