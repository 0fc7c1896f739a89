package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat/jinja"
)

// renderCase is one case of hf_jinja2_rendered.json, decoded into the
// package's own message and tool types.
type renderCase struct {
	ID                  string          `json:"id"`
	Template            string          `json:"template"`
	Messages            []fixtureMsg    `json:"messages"`
	Tools               []fixtureTool   `json:"tools"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Extra               json.RawMessage `json:"extra_context"`
	Expected            *string         `json:"expected"`
	ExpectedError       *string         `json:"expected_error"`
}

type fixtureMsg struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	Name             string          `json:"name"`
	ToolCallID       string          `json:"tool_call_id"`
	ToolCalls        []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type fixtureTool struct {
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

func (m fixtureMsg) message() Message {
	msg := Message{Role: m.Role, ReasoningContent: m.ReasoningContent, Name: m.Name, ToolCallID: m.ToolCallID}
	switch {
	case len(m.Content) == 0 || string(m.Content) == "null":
		msg.NullContent = true
	case json.Unmarshal(m.Content, &msg.Content) != nil:
		msg.ContentJSON = m.Content
	}
	for _, c := range m.ToolCalls {
		msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	return msg
}

// TestTemplateRenderExpected renders the tool-calling templates' fixture
// cases through Template.Render with Message and Tool values (what the
// rollout passes) and compares byte for byte with transformers' output.
func TestTemplateRenderExpected(t *testing.T) {
	data, err := os.ReadFile("../../testdata/chat-templates/expected/hf_jinja2_rendered.json")
	require.NoError(t, err)
	var fixture struct{ Cases []renderCase }
	require.NoError(t, json.Unmarshal(data, &fixture))
	rendered := 0
	for _, c := range fixture.Cases {
		t.Run(c.ID, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("../../testdata/chat-templates", strings.TrimPrefix(c.Template, "chat-templates/")))
			require.NoError(t, err)
			var extra map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(c.Extra, &extra))
			special := map[string]string{}
			kwargs := map[string]any{}
			for k, v := range extra {
				var s string
				if strings.HasSuffix(k, "_token") && json.Unmarshal(v, &s) == nil {
					special[k] = s
					continue
				}
				kwargs[k] = v
			}
			tmpl, err := NewTemplate(string(src), special, func() time.Time { return time.Date(2024, 7, 26, 0, 0, 0, 0, time.UTC) })
			require.NoError(t, err)
			var msgs []Message
			for _, m := range c.Messages {
				msgs = append(msgs, m.message())
			}
			var tools []Tool
			for _, tl := range c.Tools {
				tools = append(tools, Tool{Name: tl.Function.Name, Description: tl.Function.Description, Parameters: tl.Function.Parameters})
			}
			got, err := tmpl.Render(msgs, tools, c.AddGenerationPrompt, kwargs)
			rendered++
			if c.ExpectedError != nil {
				var te *jinja.TemplateError
				require.True(t, errors.As(err, &te), "got %v", err)
				assert.Equal(t, *c.ExpectedError, te.Error())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, *c.Expected, got)
		})
	}
	assert.Equal(t, 118, rendered)
}
