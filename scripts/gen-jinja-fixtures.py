#!/usr/bin/env python3
"""Regenerate testdata/chat-templates/jinja-completeness/completeness.json:
Jinja snippets for the constructs chat templates in the wild use (issue 11,
item 4), rendered by jinja2 in the environment transformers'
apply_chat_template builds (ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols]), transformers' tojson,
raise_exception), so the Go renderer can be checked byte for byte.

    python3 scripts/gen-jinja-fixtures.py > testdata/chat-templates/jinja-completeness/completeness.json

(jinja2 3.1.6, Python 3.11; no network, no other inputs.)
"""
import json
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson (chat_template_utils._compile_jinja_template)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

VARS = {
    "d": {"z": 1, "a": "x", "m": {"k": [1, 2]}, "u": "é<>&"},
    "s": "  Hello, World!\n",
    "n": 7,
    "uni": "héllo \"q\" <a&b> 'x' \\ \t\u2028 世界 🦙",
    "nums": [3, 1, 2, 3, 5, 8, 1],
    "people": [{"name": "bob", "age": 30}, {"name": "Al", "age": 25}, {"name": "cy", "age": 30}, {"name": "Di"}],
    "rows": [{"a": 2, "b": "x"}, {"a": 1, "b": "z"}, {"a": 2, "b": "a"}, {"a": 1, "b": "b"}],
    "text": "The quick brown fox jumps over the lazy dog and keeps running far away",
}

# (construct, snippet): each construct of the item 4 has at least one.
SNIPPETS = [
    ("tojson separators", "{{ d | tojson(separators=(',', ':')) }}|{{ [1, {'a': none}] | tojson(separators=(', ', ' = ')) }}"),
    ("tojson ensure_ascii", "{{ uni | tojson(ensure_ascii=true) }}|{{ d | tojson(ensure_ascii=false) }}"),
    ("tojson indent string", "{{ d | tojson(indent='\\t') }}|{{ [1, [2]] | tojson(indent='--') }}"),
    ("tojson indent int", "{{ [1, [2, {}], []] | tojson(indent=0) }}|{{ {'a': [1, 2]} | tojson(indent=3) }}"),
    ("tojson sort_keys", "{{ d | tojson(sort_keys=true, indent=1, separators=(',', ': ')) }}"),
    ("escape", "{{ uni | e }}|{{ '<a href=\"x\">&\\'' | escape }}|{{ 5 | e }}|{{ none | escape }}|{{ d.u | e }}"),
    ("int float strings", "{{ '3.7' | int }}|{{ '-2.5' | int }}|{{ ' 42 ' | int }}|{{ '1e3' | int }}|{{ 'z' | int(-1) }}|{{ '12_000' | int }}|{{ 4.99 | int }}"),
    ("int base", "{{ '0x1A' | int(0, 16) }}|{{ '1a' | int(base=16) }}|{{ '0b101' | int(0, 2) }}|{{ '777' | int(base=8) }}|{{ '0o17' | int(base=8) }}|{{ '9' | int(base=8) }}"),
    ("big integers", "{{ 2 ** 64 }}|{{ 9223372036854775807 + 1 }}|{{ 12345678901234567890123 }}|{{ (2 ** 70) // 3 }}|{{ -(2 ** 65) }}|{{ 2 ** 64 > 2 ** 63 }}"),
    ("big integers 2", "{{ 99999999999999999999 * 99999999999999999999 }}|{{ (2 ** 64) % 7 }}|{{ 2 ** 64 == 18446744073709551616 }}|{{ [2 ** 64, -(2 ** 64)] | tojson }}|{{ (2 ** 64) | string | length }}|{{ 2 ** 64 - 2 ** 64 }}|{{ -9223372036854775807 - 2 }}"),
    ("loop.changed", "{% for p in people %}{% if loop.changed(p.age) %}[{{ p.age }}]{% endif %}{{ p.name }} {% endfor %}"),
    ("loop.cycle", "{% for x in nums %}{{ loop.cycle('odd', 'even', 'third') }}{{ x }} {% endfor %}"),
    ("with", "{% with a = 1, b = n %}{{ a }}{{ b }}{% endwith %}[{{ a }}]|{% with %}{% set q = 5 %}{{ q }}{% endwith %}[{{ q }}]|{% with n = n + 1 %}{{ n }}{% endwith %}{{ n }}"),
    ("filter block", "{% filter upper %}hello {{ s }}{% endfilter %}|{% filter replace('a', 'o') | trim %} banana {% endfilter %}|{% filter tojson %}{{ n }}x{% endfilter %}"),
    ("call block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ n }}{% endcall %}"),
    ("call block with arguments", "{% macro each(xs) %}{% for x in xs %}{{ caller(x, loop.index) }}{% endfor %}{% endmacro %}{% call(item, i) each(nums) %}{{ i }}={{ item }};{% endcall %}"),
    ("macro varargs kwargs", "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4, y='z') }}|{{ m(0) }}"),
    ("macro varargs join", "{% macro m() %}{{ varargs | join(',') }}:{{ kwargs.k }}{% endmacro %}{{ m(1, 2, k='v') }}"),
    ("format filter", "{{ '%s-%d' | format('a', 3) }}|{{ '%(x)s!' | format(x=1) }}|{{ '%5.2f|%-4s|%03d' | format(3.14159, 'ab', 7) }}"),
    ("groupby", "{% for g in people | groupby('age', default=0) %}{{ g.grouper }}:{{ g.list | map(attribute='name') | join(',') }};{% endfor %}|{% for k, items in rows | groupby('a') %}{{ k }}={{ items | length }} {% endfor %}"),
    ("batch", "{{ nums | batch(3) | list }}|{{ nums | batch(3, 'x') | list }}"),
    ("slice", "{{ nums | slice(3) | list }}|{{ [1, 2, 3, 4] | slice(3, 0) | list }}"),
    ("truncate", "{{ text | truncate(20) }}|{{ text | truncate(12, true) }}|{{ 'short' | truncate(10) }}|{{ 'Hello world foo' | truncate(11, false, '..', 0) }}|{{ text | truncate(30, false, '>>') }}"),
    ("wordwrap", "{{ text | wordwrap(20) }}|{{ 'a verylongwordindeed b' | wordwrap(8) }}|{{ text | wordwrap(25, wrapstring='<br>') }}"),
    ("center", "[{{ 'ab' | center(7) }}][{{ 'abc' | center(8) }}][{{ 'abcd' | center(2) }}]"),
    ("attr", "[{{ d | attr('a') }}][{{ d | attr('items') is defined }}][{{ none | attr('x') }}]"),
    ("sort by attribute list", "{{ rows | sort(attribute='a,b') | map(attribute='b') | join }}|{{ rows | sort(attribute='a', reverse=true) | map(attribute='b') | join }}|{{ people | sort(attribute='name', case_sensitive=true) | map(attribute='name') | join(',') }}"),
    ("min max unique by attribute", "{{ (rows | min(attribute='b')).b }}|{{ (rows | max(attribute='a')).b }}|{{ rows | unique(attribute='a') | map(attribute='b') | join }}"),
    ("splitlines", "{{ 'a\\nb\\r\\nc\\n'.splitlines() }}|{{ 'a\\n\\nb'.splitlines(true) }}|{{ ''.splitlines() }}"),
    ("rfind index", "{{ 'hello'.rfind('l') }}|{{ 'hello'.index('l') }}|{{ 'hello'.rindex('l') }}|{{ 'hello'.find('l', 3) }}|{{ 'hello'.rfind('z') }}|{{ 'héllo'.index('l') }}"),
    ("is methods", "{{ '123'.isdigit() }}{{ '12a'.isdigit() }}{{ 'abc'.isalpha() }}{{ 'a1'.isalnum() }}{{ '  '.isspace() }}{{ 'ab'.islower() }}{{ 'AB'.isupper() }}{{ 'Ab Cd'.istitle() }}{{ ''.isdigit() }}{{ '12'.isnumeric() }}{{ '1.5'.isdecimal() }}"),
    ("lower upper tests", "{{ '' is lower }}{{ '123' is upper }}{{ 'ab1' is lower }}{{ 5 is lower }}{{ 'ǅ' is upper }}{{ 'ǅ'.islower() }}{{ 'ÀB' is upper }}"),
    ("zfill ljust rjust center", "{{ '42'.zfill(5) }}|{{ '-42'.zfill(5) }}|{{ 'ab'.ljust(5, '*') }}|{{ 'ab'.rjust(5) }}|{{ 'ab'.center(7, '-') }}"),
    ("partition", "{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|{{ 'abc'.partition('x') }}|{{ 'abc'.rpartition('x') }}"),
    ("removeprefix removesuffix", "{{ 'prefix_x'.removeprefix('prefix_') }}|{{ 'x.json'.removesuffix('.json') }}|{{ 'abc'.removeprefix('z') }}"),
    ("casefold swapcase", "{{ 'Straße'.casefold() }}|{{ 'ΣΑΣ'.casefold() }}|{{ 'Hello'.swapcase() }}"),
    ("unicode case mapping", "{{ 'straße'.upper() }}|{{ 'ﬁx'.upper() }}|{{ 'straße' | upper }}|{{ 'ß'.capitalize() }}|{{ 'ΌΣΟΣ'.lower() }}|{{ 'ǆemal'.title() }}|{{ 'ŉ'.upper() }}"),
]


def main():
    cases = []
    for construct, src in SNIPPETS:
        case = {"construct": construct, "template": src}
        case["expected"] = env.from_string(src).render(**VARS)
        cases.append(case)
    json.dump({"generator": "scripts/gen-jinja-fixtures.py, jinja2 " + jinja2.__version__ + ", Python " + sys.version.split()[0],
               "vars": VARS, "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
