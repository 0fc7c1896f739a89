package agentrollout

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/agent"
	"github.com/ortrain/ortrain/internal/rollout"
)

// goAgentEnv makes the test binary, started as an agent, run goAgent.
const goAgentEnv = "ORTRAIN_TEST_GO_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(goAgentEnv) != "" {
		facts := agent.Facts{BaseURL: os.Getenv(agent.EnvBaseURL), APIKey: os.Getenv(agent.EnvAPIKey),
			Model: os.Getenv(agent.EnvModel), MCPURL: os.Getenv(agent.EnvMCPURL), Task: json.RawMessage(os.Getenv(agent.EnvTask))}
		reward, err := goAgent(context.Background(), facts)
		if err != nil {
			fmt.Fprintln(os.Stderr, "go agent:", err)
			os.Exit(1)
		}
		fmt.Printf("{\"reward\": %v}\n", reward)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// goAgent is an agent written in Go with net/http only: the same loop as
// testdata/tool_agent.py (ask the model, run its tool calls over MCP, send
// the results back), returning the reward it reports.
func goAgent(ctx context.Context, f agent.Facts) (float64, error) {
	var task struct {
		Messages []map[string]any `json:"messages"`
		Tools    []map[string]any `json:"tools"`
	}
	if err := json.Unmarshal(f.Task, &task); err != nil {
		return 0, fmt.Errorf("task: %w", err)
	}
	post := func(url string, body any, header http.Header) (http.Header, map[string]any, error) {
		b, _ := json.Marshal(body)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
		if err != nil {
			return nil, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+f.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode/100 != 2 {
			return nil, nil, fmt.Errorf("%s: %d %s", url, resp.StatusCode, raw)
		}
		var out map[string]any
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &out); err != nil {
				return nil, nil, err
			}
		}
		return resp.Header, out, nil
	}
	hdr, _, err := post(f.MCPURL, map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize",
		"params": map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "go-agent", "version": "1"}}}, nil)
	if err != nil {
		return 0, err
	}
	session := http.Header{"Mcp-Session-Id": {hdr.Get("Mcp-Session-Id")}}
	if _, _, err := post(f.MCPURL, map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"}, session); err != nil {
		return 0, err
	}
	messages := task.Messages
	for turn := range 4 {
		_, reply, err := post(f.BaseURL+"/chat/completions", map[string]any{"model": f.Model, "messages": messages, "tools": task.Tools}, nil)
		if err != nil {
			return 0, err
		}
		msg := reply["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
		messages = append(messages, msg)
		calls, _ := msg["tool_calls"].([]any)
		if len(calls) == 0 {
			break
		}
		for i, c := range calls {
			call := c.(map[string]any)
			fn := call["function"].(map[string]any)
			var args map[string]any
			if err := json.Unmarshal([]byte(fn["arguments"].(string)), &args); err != nil {
				return 0, fmt.Errorf("arguments: %w", err)
			}
			_, res, err := post(f.MCPURL, map[string]any{"jsonrpc": "2.0", "id": 10*turn + i + 2, "method": "tools/call",
				"params": map[string]any{"name": fn["name"], "arguments": args}}, session)
			if err != nil {
				return 0, err
			}
			text := ""
			for _, part := range res["result"].(map[string]any)["content"].([]any) {
				text += part.(map[string]any)["text"].(string)
			}
			messages = append(messages, map[string]any{"role": "tool", "tool_call_id": call["id"], "content": text})
		}
	}
	return 0.25, nil
}

// TestGoAgent: the same episode played by an agent written in Go, as a
// real process (this test binary re-executed), and by a URL agent (an
// HTTP agent service on loopback running the same loop).
func TestGoAgent(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var f struct {
			BaseURL string          `json:"base_url"`
			APIKey  string          `json:"api_key"`
			Model   string          `json:"model"`
			MCPURL  string          `json:"mcp_url"`
			Task    json.RawMessage `json:"task"`
		}
		if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reward, err := goAgent(r.Context(), agent.Facts{BaseURL: f.BaseURL, APIKey: f.APIKey, Model: f.Model, MCPURL: f.MCPURL, Task: f.Task})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]float64{"reward": reward})
	}))
	t.Cleanup(svc.Close)
	cases := []struct {
		name string
		spec agent.Spec
	}{
		{"process", agent.Spec{Command: []string{"/bin/sh", "-c", goAgentEnv + `=1 exec "$0" -test.run '^$'`, exe}}},
		{"url", agent.Spec{URL: svc.URL}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Timeout = 30 * time.Second
			h := newHarness(t, "builtin:lockbox", "openenv", tc.spec)
			tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 7})
			require.Equal(t, rollout.OutcomeDone, tr.Outcome, "%v", tr.Err)
			require.NotNil(t, tr.AgentReward)
			assert.Equal(t, 0.25, *tr.AgentReward)
			require.Len(t, tr.Rewards, 2)
			require.NotNil(t, tr.Rewards[1])
			assert.Equal(t, 1.0, *tr.Rewards[1], "unlocked with the code read through MCP")
			calls := h.model.recorded()
			require.Len(t, calls, 3)
			// The third call came after unlock ended the episode: counted,
			// not trained; the trajectory ends with the unlocking call.
			assert.Equal(t, 1, tr.AgentCalls.AfterFinish)
			last := calls[1]
			assert.Equal(t, append(append([]int32{}, last.req.PromptIDs...), last.res.IDs...), tr.Tokens)
			assert.Zero(t, tr.PrefixBreaks, "the Go agent's history extends token for token")
		})
	}
}
