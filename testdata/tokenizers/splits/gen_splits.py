"""Regenerate splits.json: the pieces each pre-tokenizer split pattern cuts
the test strings into, computed with Python's `regex` module (which has the
look-ahead Go's regexp lacks). `\s`/`\S` are replaced by Unicode White_Space
(Rust regex's meaning) before compiling. Split behaviour is Isolated: matches
and the gaps between them are pieces, and a Sequence applies each Split to
every piece of the previous one.

    python3 gen_splits.py > splits.json      (regex 2026.5.9, Python 3.11)
"""
import json
import pathlib

import regex

WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

PATTERNS = {
    "gpt2": [r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"],
    "qwen2": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "llama3": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    # DeepSeek-V3 / R1 tokenizer.json pre_tokenizer (three Splits; CR and LF
    # are literal characters there, written as escapes here).
    "deepseek-v3": [
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ],
}

EXTRA = [
    "#include <stdio.h>\nint main() { return 0; }\n",
    "I'M HERE, YOU'RE THERE, WE'LL SEE'S 'D",
    "日本語のテキストとカタカナ、漢字123456789。",
    "tabs\t\tand  spaces   \n\n\t end   ",
    "e\u0301\u0301 combining marks, \u00a0nbsp\u3000ideographic space",
    "a--b__c!!d??e\r\nf\r\r\ng",
    "  \n  x",
    "12 345 6789 0.5 1e10 ٣٤٥",
]


def translate(pattern):
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            n = pattern[i + 1]
            if n == "s":
                out.append(WS if in_class else "[" + WS + "]")
            elif n == "S" and not in_class:
                out.append("[^" + WS + "]")
            else:
                out.append(c + n)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def split_isolated(rx, text):
    pieces, last = [], 0
    for m in rx.finditer(text):
        if m.start() == m.end():
            continue
        if m.start() > last:
            pieces.append(text[last:m.start()])
        pieces.append(m.group())
        last = m.end()
    if last < len(text):
        pieces.append(text[last:])
    return pieces


def main():
    here = pathlib.Path(__file__).parent
    inp = (here.parent / "vectors" / "ggml-vocab-qwen2.gguf.inp").read_text(encoding="utf-8")
    inputs = inp.split("\n__ggml_vocab_test__\n")[:-1] + EXTRA
    out = {"generator": "gen_splits.py with Python regex " + regex.__version__,
           "patterns": PATTERNS, "inputs": inputs, "splits": {}}
    for name, seq in PATTERNS.items():
        compiled = [regex.compile(translate(p)) for p in seq]
        rows = []
        for text in inputs:
            pieces = [text] if text else []
            for rx in compiled:
                pieces = [q for p in pieces for q in split_isolated(rx, p)]
            rows.append(pieces)
        out["splits"][name] = rows
    print(json.dumps(out, ensure_ascii=False, indent=1))


main()
