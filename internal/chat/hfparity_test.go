package chat_test

// Parity with the real Hugging Face stack (issue 24 item 2): ortrain's
// tokenizer and chat-template renderer against references that
// transformers, tokenizers and apply_chat_template wrote
// (scripts/hfparity/hf_parity.py, run by scripts/check-hf-parity in the
// forky root). The tests skip unless ORTRAIN_HF_REFERENCE names the
// reference directory; once it is set, a missing or incomplete directory
// fails them. With ORTRAIN_HF_PARITY_RESULTS set they also write their
// numbers there (JSON rows for check-hf-parity's summary table).

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/chat/jinja"
)

const (
	hfReferenceEnv = "ORTRAIN_HF_REFERENCE"
	hfResultsEnv   = "ORTRAIN_HF_PARITY_RESULTS"
)

type hfManifest struct {
	Transformers string `json:"transformers"`
	Tokenizers   string `json:"tokenizers"`
	Parts        struct {
		Tokenizers *struct {
			Corpus    string `json:"corpus"`
			Documents int    `json:"documents"`
			Fixtures  []struct {
				Name string `json:"name"`
				File string `json:"file"`
				Dir  string `json:"dir"`
			} `json:"fixtures"`
		} `json:"tokenizers"`
		Templates *struct {
			Cases string `json:"cases"`
			Count int    `json:"count"`
		} `json:"templates"`
	} `json:"parts"`
}

// hfReference returns the reference directory and its manifest, skipping
// the test when ORTRAIN_HF_REFERENCE is unset.
func hfReference(t *testing.T) (string, hfManifest) {
	t.Helper()
	dir := os.Getenv(hfReferenceEnv)
	if dir == "" {
		t.Skipf("%s is not set: run scripts/check-hf-parity (in the forky root) to compare with Hugging Face", hfReferenceEnv)
	}
	var m hfManifest
	readJSON(t, filepath.Join(dir, "manifest.json"), &m)
	return dir, m
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err, "%s=%s is incomplete", hfReferenceEnv, os.Getenv(hfReferenceEnv))
	require.NoError(t, json.Unmarshal(b, v), "%s", path)
}

// hfRow is one row of check-hf-parity's summary table.
type hfRow struct {
	Part      string `json:"part"`
	Case      string `json:"case"`
	Metric    string `json:"metric"`
	Value     any    `json:"value"`
	Threshold any    `json:"threshold"`
	OK        bool   `json:"ok"`
	Note      string `json:"note"`
}

var hfResults struct {
	sync.Mutex
	rows []hfRow
}

// hfRecord logs a row and, with ORTRAIN_HF_PARITY_RESULTS set, rewrites
// that file with every row so far.
func hfRecord(t *testing.T, r hfRow) {
	t.Helper()
	mark := "ok  "
	if !r.OK {
		mark = "FAIL"
	}
	t.Logf("%s %-12s %-40s %-28s %v (<= %v) %s", mark, r.Part, r.Case, r.Metric, r.Value, r.Threshold, r.Note)
	path := os.Getenv(hfResultsEnv)
	if path == "" {
		return
	}
	hfResults.Lock()
	defer hfResults.Unlock()
	hfResults.rows = append(hfResults.rows, r)
	b, err := json.MarshalIndent(map[string]any{"results": hfResults.rows}, "", " ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// TestHFParityTokenizers: ortrain's ids for every document of the corpus
// equal transformers.AutoTokenizer's (add_special_tokens=False) for every
// tokenizer fixture and init-model's tokenizer. The `tokenizers` library's
// ids are compared too; a document where the two Hugging Face libraries
// disagree with each other is counted, not failed on that side.
func TestHFParityTokenizers(t *testing.T) {
	dir, m := hfReference(t)
	p := m.Parts.Tokenizers
	require.NotNil(t, p, "%s/manifest.json has no tokenizers part", dir)
	require.NotEmpty(t, p.Fixtures, "%s/manifest.json lists no tokenizer", dir)
	var docs []string
	readJSON(t, filepath.Join(dir, p.Corpus), &docs)
	require.Len(t, docs, p.Documents, "corpus")
	nonNFC := make([]bool, len(docs))
	for i, d := range docs {
		nonNFC[i] = !norm.NFC.IsNormalString(d)
	}
	for _, f := range p.Fixtures {
		t.Run(f.Name, func(t *testing.T) {
			var ref struct {
				Note              string             `json:"note"`
				TransformersClass string             `json:"transformers_class"`
				Transformers      [][]int32          `json:"transformers"`
				TokenizersDiffers map[string][]int32 `json:"tokenizers_differs"`
			}
			readJSON(t, filepath.Join(dir, f.File), &ref)
			require.Len(t, ref.Transformers, len(docs), "%s: one id list per document", f.File)
			tok, err := chat.LoadTokenizer(f.Dir)
			if err != nil {
				hfRecord(t, hfRow{Part: "tokenizers", Case: f.Name, Metric: "ortrain loads it", Value: "error", Threshold: "loads", Note: err.Error()})
				t.Fatalf("load %s: %v", f.Dir, err)
			}
			got := encodeAll(tok, docs)
			var vsHF, vsTK, vsTKAgreeing, refsDisagree, vsHFNonNFC, tokens int
			var examples []string
			for i := range docs {
				hf := ref.Transformers[i]
				tk, differ := ref.TokenizersDiffers[fmt.Sprint(i)]
				if !differ {
					tk = hf
				} else {
					refsDisagree++
				}
				tokens += len(hf)
				if !slices.Equal(got[i], hf) {
					vsHF++
					if nonNFC[i] {
						vsHFNonNFC++
					}
					if len(examples) < 3 {
						examples = append(examples, describeIDDiff(tok, i, docs[i], got[i], hf))
					}
				}
				if !slices.Equal(got[i], tk) {
					vsTK++
					if !differ {
						vsTKAgreeing++
					}
				}
			}
			note := fmt.Sprintf("%d documents, %d tokens; %s", len(docs), tokens, ref.TransformersClass)
			if vsHF > 0 {
				note += fmt.Sprintf("; %d of the differing documents are not NFC", vsHFNonNFC)
			}
			hfRecord(t, hfRow{Part: "tokenizers", Case: f.Name, Metric: "docs != transformers", Value: vsHF, Threshold: 0, OK: vsHF == 0, Note: note})
			// ortrain can match `tokenizers` only where it agrees with
			// transformers: a difference on another document is a failure.
			hfRecord(t, hfRow{Part: "tokenizers", Case: f.Name, Metric: "docs != tokenizers", Value: vsTK,
				Threshold: fmt.Sprintf("%d (HF libs disagree)", refsDisagree), OK: vsTKAgreeing == 0,
				Note: fmt.Sprintf("%d where tokenizers agrees with transformers", vsTKAgreeing)})
			for _, e := range examples {
				t.Log(e)
			}
			if vsHF > 0 {
				t.Errorf("%s: %d of %d documents tokenize differently from transformers %s (%d not in NFC)",
					f.Name, vsHF, len(docs), m.Transformers, vsHFNonNFC)
			}
		})
	}
}

// encodeAll encodes every document, on all CPUs.
func encodeAll(tok *chat.Tokenizer, docs []string) [][]int32 {
	out := make([][]int32, len(docs))
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = tok.Encode(docs[i])
			}
		}()
	}
	for i := range docs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// describeIDDiff names the first token where ortrain and transformers
// part, with the pieces around it.
func describeIDDiff(tok *chat.Tokenizer, doc int, text string, got, want []int32) string {
	k := 0
	for k < len(got) && k < len(want) && got[k] == want[k] {
		k++
	}
	pieces := func(ids []int32) string {
		lo, hi := max(0, k-2), min(len(ids), k+4)
		var parts []string
		for _, id := range ids[lo:hi] {
			s, _ := tok.Token(id)
			parts = append(parts, fmt.Sprintf("%d:%q", id, s))
		}
		return strings.Join(parts, " ")
	}
	// Where in the text: the length of what ortrain's first k tokens decode
	// to (exact for byte-level BPE without a normalizer, near otherwise).
	at := min(len(text), len(tok.DecodeLikeTransformers(got[:k], false)))
	ctx := runeSafe(text, at-20, at+30)
	return fmt.Sprintf("document %d (NFC: %v): first difference at token %d of %d/%d, near %q\n  ortrain:      %s\n  transformers: %s",
		doc, norm.NFC.IsNormalString(text), k, len(got), len(want), ctx, pieces(got), pieces(want))
}

// runeSafe is text[lo:hi], clamped, with both ends moved back to rune starts.
func runeSafe(text string, lo, hi int) string {
	lo, hi = max(0, lo), min(len(text), hi)
	for lo > 0 && !utf8.RuneStart(text[lo]) {
		lo--
	}
	for hi < len(text) && hi > lo && !utf8.RuneStart(text[hi]) {
		hi--
	}
	return text[lo:hi]
}

type hfTemplateCase struct {
	ID                  string            `json:"id"`
	TemplateFile        string            `json:"template_file"`
	ModelDir            string            `json:"model_dir"`
	Special             map[string]string `json:"special"`
	Now                 time.Time         `json:"now"`
	Messages            []hfMessage       `json:"messages"`
	Tools               []hfTool          `json:"tools"`
	AddGenerationPrompt bool              `json:"add_generation_prompt"`
	Kwargs              map[string]any    `json:"kwargs"`
	Expected            *string           `json:"expected"`
	Error               string            `json:"error"`
}

type hfMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	ToolCalls        []struct {
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"tool_calls"`
	Name       string `json:"name"`
	ToolCallID string `json:"tool_call_id"`
}

type hfTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

func (m hfMessage) message(t *testing.T) chat.Message {
	out := chat.Message{Role: m.Role, ReasoningContent: m.ReasoningContent, Name: m.Name, ToolCallID: m.ToolCallID}
	c := strings.TrimSpace(string(m.Content))
	switch {
	case c == "" || c == "null":
		out.NullContent = true
	case c[0] == '"':
		require.NoError(t, json.Unmarshal(m.Content, &out.Content))
	default:
		out.ContentJSON = m.Content
	}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, chat.ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
	}
	return out
}

// TestHFParityTemplates: every chat template fixture (and init-model's)
// renders multi-turn tool-calling conversations byte for byte as
// transformers' apply_chat_template does, or raises where it raises.
func TestHFParityTemplates(t *testing.T) {
	dir, m := hfReference(t)
	p := m.Parts.Templates
	require.NotNil(t, p, "%s/manifest.json has no templates part", dir)
	var ref struct {
		Transformers string           `json:"transformers"`
		Cases        []hfTemplateCase `json:"cases"`
	}
	readJSON(t, filepath.Join(dir, p.Cases), &ref)
	require.Len(t, ref.Cases, p.Count, "template cases")
	type tally struct{ n, same, bothErr, diff int }
	byTemplate := map[string]*tally{}
	var order []string
	var diffs []string
	for _, c := range ref.Cases {
		name := c.ID[:strings.Index(c.ID, "/"+firstConv(c.ID))]
		tl := byTemplate[name]
		if tl == nil {
			tl = &tally{}
			byTemplate[name] = tl
			order = append(order, name)
		}
		tl.n++
		got, err := renderCase(t, c)
		switch {
		case c.Expected == nil && err != nil:
			tl.bothErr++
		case c.Expected != nil && err == nil && got == *c.Expected:
			tl.same++
		default:
			tl.diff++
			diffs = append(diffs, describeRenderDiff(c, got, err))
		}
	}
	for _, name := range order {
		tl := byTemplate[name]
		note := fmt.Sprintf("%d renderings, %d identical, %d raise in both", tl.n, tl.same, tl.bothErr)
		hfRecord(t, hfRow{Part: "templates", Case: name, Metric: "renderings != HF", Value: tl.diff, Threshold: 0, OK: tl.diff == 0, Note: note})
	}
	for i, d := range diffs {
		if i == 12 {
			t.Errorf("... and %d more", len(diffs)-i)
			break
		}
		t.Error(d)
	}
}

// firstConv returns the conversation part of a case id
// "<template>/<conversation>/agp=.../tools=...".
func firstConv(id string) string {
	parts := strings.Split(id, "/")
	for i, s := range parts {
		if strings.HasPrefix(s, "agp=") && i > 0 {
			return parts[i-1]
		}
	}
	return parts[len(parts)-1]
}

func renderCase(t *testing.T, c hfTemplateCase) (string, error) {
	t.Helper()
	var src string
	special := c.Special
	if c.ModelDir != "" {
		tok, err := chat.LoadTokenizer(c.ModelDir)
		if err != nil {
			return "", fmt.Errorf("load tokenizer: %w", err)
		}
		s, ok := tok.ChatTemplate("")
		if !ok {
			return "", errors.New("no chat template")
		}
		src, special = s, tok.SpecialStrings()
	} else {
		b, err := os.ReadFile(c.TemplateFile)
		require.NoError(t, err)
		src = string(b)
	}
	now := c.Now
	tmpl, err := chat.NewTemplate(src, special, func() time.Time { return now })
	if err != nil {
		return "", err
	}
	msgs := make([]chat.Message, len(c.Messages))
	for i, m := range c.Messages {
		msgs[i] = m.message(t)
	}
	var tools []chat.Tool
	for _, tl := range c.Tools {
		tools = append(tools, chat.Tool{Name: tl.Name, Description: tl.Description, Parameters: tl.Parameters})
	}
	return tmpl.Render(msgs, tools, c.AddGenerationPrompt, c.Kwargs)
}

func describeRenderDiff(c hfTemplateCase, got string, err error) string {
	switch {
	case c.Expected == nil && err == nil:
		return fmt.Sprintf("%s: transformers raises %q, ortrain renders %d bytes", c.ID, c.Error, len(got))
	case c.Expected != nil && err != nil:
		var te *jinja.TemplateError
		kind := "error"
		if errors.As(err, &te) {
			kind = "raise_exception"
		}
		return fmt.Sprintf("%s: ortrain fails (%s: %v), transformers renders %d bytes", c.ID, kind, err, len(*c.Expected))
	}
	want := *c.Expected
	k := 0
	for k < len(got) && k < len(want) && got[k] == want[k] {
		k++
	}
	return fmt.Sprintf("%s: differs at byte %d of %d/%d:\n  ortrain:      %q\n  transformers: %q",
		c.ID, k, len(got), len(want), runeSafe(got, k-40, k+60), runeSafe(want, k-40, k+60))
}
