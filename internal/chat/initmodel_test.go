package chat_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/model"
)

// Issue 24: what `ortrain init-model` writes means what ortrain does. Its
// tokenizer_config.json names Qwen2Tokenizer, which transformers 5 (and so
// vLLM) normalizes to NFC; tokenizer.json declares the same NFC, and
// ortrain, which follows tokenizer.json, splits decomposed text as they do.
func TestInitModelTokenizerNormalizesLikeTransformers(t *testing.T) {
	dir := t.TempDir()
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.InitOverwrite(dir, preset, 1))
	tok, err := chat.LoadTokenizer(dir)
	require.NoError(t, err)
	for _, tc := range []struct{ decomposed, composed string }{
		{"cafe\u0301", "café"},
		{"A\u030angstro\u0308m", "Ångström"},
		{"\u1100\u1161\u11a8", "각"},
	} {
		assert.Equal(t, tok.Encode(tc.composed), tok.Encode(tc.decomposed), "%q is split as its NFC form %q", tc.decomposed, tc.composed)
	}
}
