package sft_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/sft"
)

const goodRow = `{"messages":[{"role":"user","content":"Open it."},` +
	`{"role":"assistant","content":"","tool_calls":[{"id":"call_0","type":"function","function":{"name":"open_envelope","arguments":{}}}]},` +
	`{"role":"tool","tool_call_id":"call_0","name":"open_envelope","content":"code: 482"},` +
	`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"unlock","arguments":"{\"code\": \"482\"}"}}]},` +
	`{"role":"tool","tool_call_id":"call_1","name":"unlock","content":"unlocked"}],` +
	`"tools":[{"type":"function","function":{"name":"open_envelope","description":"Read the code.","parameters":{"type":"object","properties":{}}}},` +
	`{"type":"function","function":{"name":"unlock","description":"Unlock.","parameters":{"properties":{"code":{"type":"string"}},"required":["code"],"type":"object"}}}],"reward":1}`

func TestReadParsesTRLForms(t *testing.T) {
	data := goodRow + "\n\n" +
		`{"prompt":[{"role":"user","content":"Hi"}],"completion":[{"role":"assistant","content":[{"type":"text","text":"Hello"}]}]}` + "\n" +
		`{"prompt":"2+2=","completion":"4"}` + "\n"
	ds, err := sft.Read(strings.NewReader(data), "d.jsonl", sft.ReadOptions{})
	require.NoError(t, err)
	require.Len(t, ds.Examples, 3)

	conv := ds.Examples[0]
	assert.Equal(t, 1, conv.Line)
	require.Len(t, conv.Messages, 5)
	require.Len(t, conv.Tools, 2)
	assert.Equal(t, "unlock", conv.Tools[1].Name)
	assert.JSONEq(t, `{"code":"482"}`, string(conv.Messages[3].ToolCalls[0].Arguments), "a JSON-string argument is the object")
	assert.True(t, conv.Messages[3].NullContent)
	assert.False(t, conv.Completion())

	pc := ds.Examples[1]
	assert.Equal(t, 3, pc.Line, "blank lines count")
	assert.Equal(t, 1, pc.PromptLen)
	assert.Equal(t, "Hello", pc.Messages[1].Content, "text blocks are joined")
	assert.True(t, pc.Completion())

	txt := ds.Examples[2]
	assert.Equal(t, "2+2=", txt.PromptText)
	assert.Equal(t, "4", txt.CompletionText)
}

func TestReadRejectsBadRowsByLineAndField(t *testing.T) {
	cases := []struct {
		name, row, field string
	}{
		{"not json", `this is not json`, ""},
		{"json array", `[1,2]`, ""},
		{"broken json", `{"messages": [`, ""},
		{"no messages", `{"reward": 1}`, "messages"},
		{"text form", `{"text": "hi"}`, "text"},
		{"bad role", `{"messages":[{"role":"robot","content":"x"}]}`, "messages[0].role"},
		{"no assistant", `{"messages":[{"role":"user","content":"x"}]}`, "messages"},
		{"assistant first", `{"messages":[{"role":"assistant","content":"x"}]}`, "messages[0]"},
		{"tool without call", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"tool","content":"z"}]}`, "messages[2]"},
		{"tool answering another id", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[{"id":"a","function":{"name":"f","arguments":{}}}]},{"role":"tool","tool_call_id":"b","content":"z"}]}`, "messages[2].tool_call_id"},
		{"args not object", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":[1]}}]}]}`, "messages[1].tool_calls[0]"},
		{"call without name", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[{"function":{"arguments":{}}}]}]}`, "messages[1].tool_calls[0]"},
		{"tool calls on user", `{"messages":[{"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]}]}`, "messages[0].tool_calls"},
		{"prompt only", `{"prompt":"x"}`, "completion"},
		{"empty completion", `{"prompt":"x","completion":""}`, "completion"},
		{"tool without name", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}],"tools":[{"type":"function","function":{"description":"d"}}]}`, "tools[0].function.name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sft.Read(strings.NewReader(goodRow+"\n"+tc.row+"\n"), "d.jsonl", sft.ReadOptions{})
			var re *sft.RowError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, "d.jsonl", re.File)
			assert.Equal(t, 2, re.Line)
			assert.Equal(t, tc.field, re.Field)

			ds, err := sft.Read(strings.NewReader(goodRow+"\n"+tc.row+"\n"), "d.jsonl", sft.ReadOptions{SkipBad: true})
			require.NoError(t, err, "skipped and counted with SkipBad")
			assert.Len(t, ds.Examples, 1)
			require.Len(t, ds.Skipped, 1)
			assert.Equal(t, 2, ds.Skipped[0].Line)
		})
	}
}

func TestReadEmptyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "empty.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("\n\n"), 0o644))
	_, err := sft.ReadFile(path, sft.ReadOptions{})
	assert.True(t, errors.Is(err, sft.ErrEmptyData))

	_, err = sft.Read(strings.NewReader("nope\n"), "d.jsonl", sft.ReadOptions{SkipBad: true})
	assert.True(t, errors.Is(err, sft.ErrEmptyData), "every row skipped is no data")

	_, err = sft.ReadFile(filepath.Join(dir, "missing.jsonl"), sft.ReadOptions{})
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func FuzzRead(f *testing.F) {
	f.Add(goodRow)
	f.Add(`{"prompt":"a","completion":"b"}`)
	f.Add(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		ds, err := sft.Read(strings.NewReader(s), "f.jsonl", sft.ReadOptions{SkipBad: true})
		if err == nil {
			require.NotEmpty(t, ds.Examples)
		}
	})
}
