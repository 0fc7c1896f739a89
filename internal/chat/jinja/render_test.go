package jinja

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const templateTestdata = "../../../testdata/chat-templates"

// fixedClock makes strftime_now deterministic.
func fixedClock() time.Time { return time.Date(2024, time.July, 26, 12, 0, 0, 0, time.UTC) }

func readJSONFixture(t *testing.T, name string) *Dict {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(templateTestdata, "expected", name))
	require.NoError(t, err)
	v, err := FromJSON(data)
	require.NoError(t, err)
	return v.(*Dict)
}

func str(d *Dict, key string) string {
	v, _ := d.Get(key)
	s, _ := v.(string)
	return s
}

// TestRenderExpected renders every case of hf_jinja2_rendered.json (made
// with jinja2 in transformers' environment) and compares byte for byte.
func TestRenderExpected(t *testing.T) {
	fixture := readJSONFixture(t, "hf_jinja2_rendered.json")
	casesV, _ := fixture.Get("cases")
	cases := casesV.([]Value)
	require.Len(t, cases, 118)
	parsed := map[string]*Template{}
	for _, cv := range cases {
		c := cv.(*Dict)
		t.Run(str(c, "id"), func(t *testing.T) {
			path := strings.TrimPrefix(str(c, "template"), "chat-templates/")
			tmpl, ok := parsed[path]
			if !ok {
				src, err := os.ReadFile(filepath.Join(templateTestdata, path))
				require.NoError(t, err)
				tmpl, err = Parse(string(src))
				require.NoError(t, err)
				parsed[path] = tmpl
			}
			vars := map[string]Value{"documents": nil}
			for _, k := range []string{"messages", "tools", "add_generation_prompt"} {
				vars[k], _ = c.Get(k)
			}
			extra, _ := c.Get("extra_context")
			for _, k := range extra.(*Dict).Keys() {
				vars[k], _ = extra.(*Dict).Get(k)
			}
			got, err := tmpl.Render(vars, RenderOptions{Now: fixedClock})
			if want, isErr := c.Get("expected_error"); isErr {
				require.Error(t, err)
				assert.Equal(t, want, err.Error())
				return
			}
			require.NoError(t, err)
			want, _ := c.Get("expected")
			assert.Equal(t, want, got)
		})
	}
}

// TestRenderLlamaCppCases renders the three cases transcribed from
// llama.cpp's test-chat-template.cpp.
func TestRenderLlamaCppCases(t *testing.T) {
	fixture := readJSONFixture(t, "llama.cpp_test-chat-template.json")
	messages, _ := fixture.Get("messages")
	agp, _ := fixture.Get("add_generation_prompt")
	casesV, _ := fixture.Get("cases")
	require.Len(t, casesV.([]Value), 3)
	for _, cv := range casesV.([]Value) {
		c := cv.(*Dict)
		t.Run(str(c, "name"), func(t *testing.T) {
			tmpl, err := Parse(str(c, "template"))
			require.NoError(t, err)
			got, err := tmpl.Render(map[string]Value{
				"messages": messages, "add_generation_prompt": agp,
				"bos_token": str(c, "bos_token"), "eos_token": str(c, "eos_token"),
			}, RenderOptions{})
			require.NoError(t, err)
			assert.Equal(t, str(c, "expected_output"), got)
		})
	}
}

// TestSemantics renders the feature-by-feature snippets of semantics.json
// (rendered by jinja2 in transformers' environment) and compares.
func TestSemantics(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(templateTestdata, "semantics", "semantics.json"))
	require.NoError(t, err)
	fixture, err := FromJSON(data)
	require.NoError(t, err)
	varsV, _ := fixture.(*Dict).Get("vars")
	vars := map[string]Value{}
	for _, k := range varsV.(*Dict).Keys() {
		vars[k], _ = varsV.(*Dict).Get(k)
	}
	casesV, _ := fixture.(*Dict).Get("cases")
	require.NotEmpty(t, casesV)
	for i, cv := range casesV.([]Value) {
		c := cv.(*Dict)
		src := str(c, "template")
		t.Run(fmt.Sprintf("%02d", i), func(t *testing.T) {
			tmpl, err := Parse(src)
			require.NoError(t, err, "template %q", src)
			got, err := tmpl.Render(vars, RenderOptions{Now: fixedClock})
			if want, isErr := c.Get("expected_error"); isErr {
				require.Error(t, err, "template %q", src)
				assert.Equal(t, want, err.Error())
				return
			}
			require.NoError(t, err, "template %q", src)
			want, _ := c.Get("expected")
			assert.Equal(t, want, got, "template %q", src)
		})
	}
}

// FuzzParseAndRender: no template source makes Parse or Render panic.
func FuzzParseAndRender(f *testing.F) {
	for _, name := range []string{"qwen3/chat_template.jinja", "llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja",
		"llama.cpp/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"} {
		src, err := os.ReadFile(filepath.Join(templateTestdata, name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	for _, s := range []string{"{{ a[1:2:3] | tojson(indent=2) }}", "{% for x in y if x %}{% break %}{% endfor %}",
		"{% macro m(a=1) %}{{ m(a) }}{% endmacro %}{{ m() }}", "{{ 'a' * 3 ~ (1, 2) ~ {'k': [none]} }}",
		"{%- raw -%} {{ x }} {%- endraw %}", "{{ '%s %d' % ('a', 1) }}{{ '{}'.format(1) }}", "{{ 2 ** 62 ** 2 }}"} {
		f.Add(s)
	}
	vars := map[string]Value{"messages": []Value{}, "a": []Value{int64(1), "x"}, "y": "abc", "add_generation_prompt": true}
	f.Fuzz(func(t *testing.T, src string) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			tmpl, err := Parse(src)
			if err != nil {
				return
			}
			_, _ = tmpl.Render(vars, RenderOptions{Now: fixedClock})
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("Parse+Render of %q did not finish in 20s", src)
		}
	})
}

func TestRenderLimits(t *testing.T) {
	cases := map[string]string{
		"exponential macro": "{% macro m(n) %}{% if n > 0 %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(40) }}",
		"deep recursion":    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
		"huge repetition":   "{{ 'abc' * 100000000 }}",
		"huge output":       "{% for i in range(1000000) %}{{ 'x' * 1000 }}{% endfor %}",
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			tmpl, err := Parse(src)
			require.NoError(t, err)
			_, err = tmpl.Render(map[string]Value{}, RenderOptions{})
			assert.Error(t, err)
		})
	}
}

// TestRenderExtraTemplates renders four more real templates (DeepSeek-V3.1,
// GLM-4.5, Mistral Small 3.1, MiniMax-M2) on eight conversations and
// compares with jinja2. Where jinja2 raised a Python TypeError the renderer
// must fail too (the messages differ); TemplateErrors must match exactly.
func TestRenderExtraTemplates(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(templateTestdata, "extra", "extra_rendered.json"))
	require.NoError(t, err)
	fixture, err := FromJSON(data)
	require.NoError(t, err)
	casesV, _ := fixture.(*Dict).Get("cases")
	require.Len(t, casesV, 32)
	noon := func() time.Time { return time.Date(2024, 7, 26, 12, 0, 0, 0, time.Local) }
	for _, cv := range casesV.([]Value) {
		c := cv.(*Dict)
		t.Run(str(c, "template")+"/"+str(c, "scenario"), func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(templateTestdata, "extra", str(c, "template")))
			require.NoError(t, err)
			tmpl, err := Parse(string(src))
			require.NoError(t, err)
			varsV, _ := c.Get("vars")
			vars := map[string]Value{}
			for _, k := range varsV.(*Dict).Keys() {
				vars[k], _ = varsV.(*Dict).Get(k)
			}
			got, err := tmpl.Render(vars, RenderOptions{Now: noon})
			if want, isErr := c.Get("expected_error"); isErr {
				require.Error(t, err)
				if strings.HasPrefix(want.(string), "TemplateError") {
					assert.Equal(t, want, err.Error())
				}
				return
			}
			require.NoError(t, err)
			want, _ := c.Get("expected")
			assert.Equal(t, want, got)
		})
	}
}
