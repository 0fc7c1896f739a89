"""Regenerate semantics.json: small Jinja snippets rendered by jinja2 in the
environment transformers' apply_chat_template builds
(ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]), transformers' tojson, raise_exception), so the Go
renderer can be checked feature by feature.

    python3 gen_semantics.py > semantics.json     (jinja2 3.1.6, Python 3.11)
"""
import json

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

VARS = {
    "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi  "},
             {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": [1.5, None, True]}}}]},
             {"role": "tool", "content": "R"}],
    "d": {"z": 1, "a": "x", "m": {"k": [1, 2]}},
    "s": "  Hello, World!\n",
    "n": 7, "f": 2.5, "big": 1e20, "small": 1e-7, "neg": -3, "none": None, "t": True, "e": "",
    "uni": "héllo \"q\" <a&b> 'x' \\ \t\u2028 世界",
    "nums": [3, 1, 2, 3],
    "people": [{"name": "bob", "age": 30}, {"name": "Al", "age": 25}, {"name": "cy"}],
}

SNIPPETS = [
    # output and Python printing
    "{{ n }}|{{ f }}|{{ big }}|{{ small }}|{{ neg }}|{{ none }}|{{ t }}|{{ e }}|{{ undefined_name }}",
    "{{ nums }}|{{ d }}|{{ msgs[2].tool_calls[0].function.arguments }}|{{ [1, 'a', none, true, 2.0] }}",
    "{{ uni }}|{{ [uni] }}",
    "{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2.5 }} {{ 3 * 'ab' }} {{ 10 / 5 }}",
    "{{ 'a' ~ 1 ~ none ~ true }}|{{ 'x' + 'y' }}|{{ [1] + [2, 3] }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ 'ab' < 'b' }}",
    "{{ 'ell' in 'hello' }} {{ 2 in nums }} {{ 'z' in d }} {{ 'q' not in d }} {{ 5 not in nums }}",
    "{{ not none }} {{ none or 'x' }} {{ 0 and 1 }} {{ 'a' if t else 'b' }} {{ 'a' if none }}|",
    # tojson
    "{{ d | tojson }}|{{ msgs[2] | tojson }}|{{ uni | tojson }}",
    "{{ d | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}",
    "{{ [1.0, 0.1, 1e16, 1e-5, 123456789.125, -0.0] | tojson }}",
    "{{ d | tojson(sort_keys=true) }}",
    # filters
    "[{{ s | trim }}]|[{{ 'xxhixx' | trim('x') }}]|{{ s | length }}|{{ nums | length }}|{{ d | length }}|{{ d | count }}",
    "{{ 'abc' | list }}|{{ d | list }}|{{ d | items | list }}|{{ nums | first }}|{{ nums | last }}|{{ 'hey' | first }}",
    "{{ nums | join(', ') }}|{{ people | join('-', attribute='name') }}|{{ nums | join }}",
    "{{ people | selectattr('age') | map(attribute='name') | list }}|{{ people | rejectattr('age') | list }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | list }}|{{ nums | select('odd') | list }}|{{ nums | reject('equalto', 3) | list }}",
    "{{ people | map(attribute='age', default=0) | list }}|{{ ['a', 'B'] | map('upper') | list }}",
    "{{ undefined_x | default('dflt') }}|{{ '' | default('dflt') }}|{{ '' | default('dflt', true) }}|{{ none | default('d') }}",
    "{{ 'Hello World' | lower }} {{ 'hello world' | upper }} {{ 'hELLO wORLD-x1y' | title }} {{ 'hELLO' | capitalize }}",
    "{{ 'a-b-c' | replace('-', '+') }}|{{ -5 | abs }}|{{ '42' | int }}|{{ 3.9 | int }}|{{ 'x' | int }}|{{ '2.5' | float }}|{{ 3 | float }}",
    "{{ nums | unique | list }}|{{ 5 | string }}|{{ none | string }}|{{ nums | string }}",
    # tests
    "{{ n is number }} {{ f is number }} {{ t is number }} {{ n is integer }} {{ f is float }} {{ t is boolean }} {{ none is none }}",
    "{{ s is string }} {{ d is mapping }} {{ nums is iterable }} {{ s is iterable }} {{ n is iterable }} {{ nums is sequence }}",
    "{{ undefined_x is defined }} {{ n is defined }} {{ undefined_x is undefined }} {{ t is true }} {{ 1 is true }} {{ false is false }}",
    "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'ab' is lower }} {{ 'AB' is upper }}",
    "{{ 3 is eq 3 }} {{ 3 is ne 3 }} {{ 2 is in nums }} {{ n is gt 5 }} {{ n is le 5 }} {{ none is not none }} {{ n is not string }}",
    # string methods
    "{{ s.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ '\\n\\nhi\\n'.rstrip('\\n') }}|{{ '  x '.lstrip() }}",
    "{{ 'a,b,,c'.split(',') }}|{{ '  a  b c '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a.b.c'.rsplit('.', 1) }}",
    "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'ab cd'.title() }}",
    "{{ 'a-b'.replace('-', '_') }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }}",
    "{{ msgs[1].content.split('i')[0] }}|{{ '<think>x</think>\\n\\nrest'.split('</think>')[-1].lstrip('\\n') }}",
    # subscripts and slices
    "{{ nums[0] }} {{ nums[-1] }} {{ nums[10] }}|{{ nums[1:] }} {{ nums[:-1] }} {{ nums[::-1] }} {{ nums[::2] }} {{ nums[-2:] }} {{ nums[3:1:-1] }}",
    "{{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ d['a'] }} {{ d.a }} {{ d['missing'] }}| {{ d.m.k[1] }}",
    "{{ d.items() | list }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('a') }} {{ d.get('q', 'dflt') }} {{ d.get('q') }}",
    # statements
    "{% for m in msgs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}:{{ m.role }} {% endfor %}",
    "{% for m in msgs %}[{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if loop.nextitem is defined else '-' }}]{% endfor %}",
    "{% for x in nums if x > 1 %}{{ x }}{{ loop.index }}{{ loop.cycle('a', 'b') }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
    "{% for x in nums %}{% if x == 1 %}{% continue %}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'ab' %}{{ c }}.{% endfor %}",
    "{% set x = 1 %}{% for i in nums %}{% set x = i %}{% endfor %}{{ x }}|{% set ns = namespace(x=1, y='a') %}{% for i in nums %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}{{ ns.y }}",
    "{% if n > 10 %}big{% elif n > 5 %}mid{% else %}small{% endif %}|{% if none %}x{% elif e %}y{% endif %}|",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', '?') }} {{ greet(name='Cy', punct='.') }}",
    "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k }}*{{ fact(k - 1) }}{% endif %}{% endmacro %}{{ fact(4) }}",
    "{% set block_var %}inside {{ n }}{% endset %}[{{ block_var }}]",
    "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {% for i in range(2) %}{{ i }}{% endfor %}",
    "{{ raise_exception('boom: ' ~ n) }}",
    # whitespace control
    "a\n  {% if t %}\n    b\n  {% endif %}\nc\n",
    "a  {% if t %}  b  {% endif %}  c",
    "a\n  {%- if t -%}\n  b\n  {%- endif %}\n  c",
    "x\n    {{ n }}\n    {# comment #}\n    y\n  {%+ if t %}z{% endif %}",
    "{% for i in nums %}\n  {{ i }}\n{% endfor %}\n",
    "line1\r\nline2\n{{ 'lit\\r\\nx' }}\n\n",
    "{{- '  lead' -}}   \n  {{ 'tail' }}  ",
    "{# leading comment #}\n{% set a = 1 %}\n\n{{ a }}\n",
    # string literal escapes and concatenation
    "{{ 'tab\\tnl\\nq\\'dq\\\"bs\\\\' }}|{{ \"it's\" }}|{{ 'a' 'b' }}|{{ '\\u4e16\\x41' }}",
    "{{ '%s and %d' % ('x', 3) }}|{{ '%s!' % 'y' }}|{{ '{} {}'.format('a', 1) }}|{{ '{0}-{name}'.format('z', name='w') }}",
    "{{ nums | sort | list }}|{{ nums | sort(reverse=true) | list }}|{{ people | sort(attribute='name') | map(attribute='name') | list }}|{{ nums | reverse | list }}|{{ 'abc' | reverse }}",
    "{{ nums | sum }} {{ nums | min }} {{ nums | max }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 7 | round }}",
    "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(4, true) }}|{{ d | dictsort }}",
    "{% raw %}{{ not rendered }} {% if %}{% endraw %}|{{ n }}",
]


def main():
    cases = []
    for src in SNIPPETS:
        case = {"template": src}
        try:
            case["expected"] = env.from_string(src).render(**VARS)
        except jinja2.exceptions.TemplateError as e:
            case["expected_error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    print(json.dumps({"generator": "gen_semantics.py, jinja2 " + jinja2.__version__, "vars": VARS, "cases": cases},
                     ensure_ascii=False, indent=1))


main()
