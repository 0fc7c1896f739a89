package chat

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSplitBehaviors checks Split's delimiter behaviours on the example of
// tokenizers' NormalizedString::split documentation.
func TestSplitBehaviors(t *testing.T) {
	cases := map[string][]string{
		"Removed":            {"the", "final", "countdown"},
		"Isolated":           {"the", "-", "final", "-", "-", "countdown"},
		"MergedWithPrevious": {"the-", "final-", "-", "countdown"},
		"MergedWithNext":     {"the", "-final", "-", "-countdown"},
		"Contiguous":         {"the", "-", "final", "--", "countdown"},
	}
	for behavior, want := range cases {
		for _, pattern := range []map[string]any{{"String": "-"}, {"Regex": "-"}} {
			raw, err := json.Marshal(map[string]any{"type": "Split", "pattern": pattern, "behavior": behavior, "invert": false})
			require.NoError(t, err)
			pre, _, err := buildPreTokenizer(raw)
			require.NoError(t, err)
			var got []string
			pre.preTokenize("the-final--countdown", true, func(p string) { got = append(got, p) })
			assert.Equal(t, want, got, "%s %v", behavior, pattern)
		}
	}
}

func TestMetaspaceSplitAndDecode(t *testing.T) {
	raw := json.RawMessage(`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}`)
	pre, _, err := buildPreTokenizer(raw)
	require.NoError(t, err)
	var got []string
	pre.preTokenize("Hey  friend", false, func(p string) { got = append(got, p) })
	assert.Equal(t, []string{"▁Hey", "▁", "▁friend"}, got)

	dec, _, err := buildDecoder(raw)
	require.NoError(t, err)
	assert.Equal(t, []string{"Hey", " ", " friend"}, dec.decodeChain([]string{"▁Hey", "▁", "▁friend"}))
}

// Normalized added tokens match the normalized text with a normalized
// pattern (tokenizers' second pass); the others match the raw text first.
func TestNormalizedAddedTokens(t *testing.T) {
	tj := `{"added_tokens": [
		{"id": 5, "content": "[RAW]", "special": true, "normalized": false},
		{"id": 6, "content": "mark", "special": false, "normalized": true}],
		"normalizer": {"type": "Lowercase"}, "pre_tokenizer": null, "decoder": null,
		"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "[": 2, "]": 3, "x": 4}, "merges": []}}`
	tok, err := parseTokenizerJSON([]byte(tj))
	require.NoError(t, err)
	// "MARK" lowercases to "mark" and then matches; "[RAW]" matches before
	// lowercasing, "[raw]" never does.
	assert.Equal(t, []int32{0, 6, 5, 1}, tok.Encode("aMARK[RAW]b"))
	// Characters outside the vocabulary ("r", "w") are dropped: no unk_token.
	assert.Equal(t, []int32{2, 0, 3}, tok.Encode("[raw]"))
}
