package engineserver

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver/servetest"
)

// strictBackend fails a batch holding an id outside the toy vocabulary, as
// the worker's embedding lookup does (the 500 a bad prompt used to get).
type strictBackend struct {
	*servetest.Backend
	seen atomic.Int64 // requests that reached the backend
}

func (b *strictBackend) SampleBatch(ctx context.Context, adapter string, reqs []engine.Request) ([]engine.Result, error) {
	for _, r := range reqs {
		for _, id := range r.PromptIDs {
			if id >= servetest.Vocab {
				return nil, fmt.Errorf("index %d is out of bounds for the embedding", id)
			}
		}
	}
	b.seen.Add(int64(len(reqs)))
	return b.Backend.SampleBatch(ctx, adapter, reqs)
}

// TestTokenIDPromptOutsideVocab: a token-id prompt naming an id the model
// has no row for is the client's error: 400 in OpenAI's shape, naming
// prompt and the index, and the backend never sees it; with or without
// the text-and-chat side, which routes token ids to the same handler.
func TestTokenIDPromptOutsideVocab(t *testing.T) {
	_, tc := tinyTextChat(t)
	servers := []struct {
		name string
		tc   *TextChat
	}{
		{"token ids only", nil},
		{"with text and chat", tc},
	}
	tests := []struct {
		name, prompt string
		code         int
		msg          string
	}{
		{"last id in range", `[1,7]`, 200, ""},
		{"first id past the end", `[1,8]`, 400, "prompt[1] = 8 is not a token id of this model's vocabulary (0 to 7)"},
		{"largest int32", `[2147483647]`, 400, "prompt[0] = 2147483647 is not a token id"},
		{"in a list of prompts", `[[1],[2,3,99]]`, 400, "prompt[1][2] = 99 is not a token id"},
		{"list of prompts in range", `[[1],[2,3]]`, 200, ""},
	}
	for _, sv := range servers {
		t.Run(sv.name, func(t *testing.T) {
			backend := &strictBackend{Backend: servetest.NewBackend(0)}
			cs := startChatServer(t, backend, sv.tc, func(o *Options) { o.VocabSize = servetest.Vocab })
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					before := backend.seen.Load()
					code, body := cs.post(t, "/v1/completions", `{"model":"toy","prompt":`+tt.prompt+`,"max_tokens":2}`)
					require.Equal(t, tt.code, code, body)
					if tt.code == 200 {
						assert.Positive(t, backend.seen.Load()-before)
						return
					}
					e := openAIErr(t, body)
					assert.Contains(t, e.Message, tt.msg)
					assert.Equal(t, "invalid_request_error", e.Type)
					assert.Equal(t, "prompt", deref(e.Param))
					assert.Equal(t, before, backend.seen.Load(), "refused before the backend")
				})
			}
		})
	}
}
