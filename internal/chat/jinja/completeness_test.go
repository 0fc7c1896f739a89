package jinja

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCompleteness renders the snippets of completeness.json (one or more
// per construct real chat templates use; rendered by jinja2 with
// scripts/gen-jinja-fixtures.py) and compares byte for byte.
func TestCompleteness(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(templateTestdata, "jinja-completeness", "completeness.json"))
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
	for _, cv := range casesV.([]Value) {
		c := cv.(*Dict)
		src := str(c, "template")
		t.Run(str(c, "construct"), func(t *testing.T) {
			tmpl, err := Parse(src)
			require.NoError(t, err, "template %q", src)
			got, err := tmpl.Render(vars, RenderOptions{Now: fixedClock})
			require.NoError(t, err, "template %q", src)
			want, _ := c.Get("expected")
			assert.Equal(t, want, got, "template %q", src)
		})
	}
}

// TestUnsupportedNamesConstructAndLine: what the renderer does not
// implement fails with the construct's name and its template line.
func TestUnsupportedNamesConstructAndLine(t *testing.T) {
	cases := []struct {
		name, src string
		parse     bool // fails in Parse (else in Render)
		want      []string
	}{
		{"statement", "a\n{% nosuch x %}{% endnosuch %}", true, []string{"line 2", "unsupported statement {% nosuch %}"}},
		{"filter", "a\nb\n{{ x | nosuch(1) }}", true, []string{"line 3", `unsupported filter "nosuch"`}},
		{"filter block", "{% filter nosuch %}x{% endfilter %}", true, []string{"line 1", `unsupported filter "nosuch"`}},
		{"test", "\n{% if x is nosuch %}{% endif %}", true, []string{"line 2", `unsupported test "nosuch"`}},
		{"string method", "\n\n{{ 'a'.encode('utf-8') }}", false, []string{"line 3", "'encode' is undefined"}},
		{"inside a loop", "{% for m in [1] %}\n{% if m %}\n{{ m.nosuch() }}\n{% endif %}\n{% endfor %}", false, []string{"line 3", "'nosuch' is undefined"}},
		{"not iterable", "x\n{% for c in 5 %}{% endfor %}", false, []string{"line 2", "'int' object is not iterable"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Parse(tc.src)
			if !tc.parse {
				require.NoError(t, err)
				_, err = tmpl.Render(map[string]Value{}, RenderOptions{})
				var le *LineError
				require.ErrorAs(t, err, &le)
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	// raise_exception's message is the template's own: no line added.
	tmpl, err := Parse("\n{{ raise_exception('boom') }}")
	require.NoError(t, err)
	_, err = tmpl.Render(map[string]Value{}, RenderOptions{})
	assert.EqualError(t, err, "TemplateError: boom")
}

// TestFilterAndTestNames: every name the parser accepts is implemented.
func TestFilterAndTestNames(t *testing.T) {
	for _, name := range filterNames() {
		_, err := applyFilter(name, "x", []Value{"upper"}, map[string]Value{})
		if err != nil {
			assert.NotContains(t, err.Error(), "no filter named", name)
		}
	}
	for _, name := range testNames() {
		_, err := applyTest(name, "x", []Value{"x"})
		if err != nil {
			assert.NotContains(t, err.Error(), "no test named", name)
		}
	}
	_, err := applyFilter("nosuch", "x", nil, nil)
	assert.ErrorContains(t, err, "no filter named")
}

// TestCompletenessLimits: the new filters and methods refuse sizes that
// would exhaust memory, and stay linear on long input.
func TestCompletenessLimits(t *testing.T) {
	for _, src := range []string{
		"{{ 'a'.ljust(10 ** 12) }}", "{{ 'a'.zfill(10 ** 12) }}", "{{ 'a' | center(10 ** 12) }}",
		"{{ [1] | batch(10 ** 12, 0) | list }}", "{{ [1] | slice(10 ** 12) | list }}", "{{ 2 ** 100000 }}", "{{ 62 ** (2 ** 62) }}", "{{ (2 ** 40) ** (2 ** 40) }}",
	} {
		tmpl, err := Parse(src)
		require.NoError(t, err)
		_, err = tmpl.Render(map[string]Value{}, RenderOptions{})
		assert.Error(t, err, src)
	}
	tmpl, err := Parse("{{ ('x' * 200000) | wordwrap(3) | length }}")
	require.NoError(t, err)
	got, err := tmpl.Render(map[string]Value{}, RenderOptions{})
	require.NoError(t, err)
	assert.Equal(t, "266666", got, "200000 characters in lines of 3 joined by newlines")
}
