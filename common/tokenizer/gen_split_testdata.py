#!/usr/bin/env python3
"""Generates testdata/split_cases.json: expected pieces of the three split
patterns (split_pattern.h) computed with the Python `regex` module, whose
semantics for these patterns match Oniguruma's (HF tokenizers' engine).

  python3 common/tokenizer/gen_split_testdata.py > common/tokenizer/testdata/split_cases.json

Inputs: tools/reference/tokenizer_strings.json plus a few extra edge cases.
"""

import json
import os
import sys

import regex

PATTERNS = {
    'gpt2': r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    'llama3': r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    'qwen2': r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}

EXTRA = [
    "a\t\n\t b", " \t\n", "x \r\n\t y", "  \n\n  x", "'ll've", "''s", "' s", "hi\u00a0\u00a0there",
    ".\n\n", "!\r\n\r\nx", " ?!\n", "a\n", "\n a", "1234567", " 12 345", "\u00a0x", "\u3000中",
]


def split(pattern, text):
  pieces, last = [], 0
  for m in regex.finditer(pattern, text):
    if m.start() > last:
      pieces.append(text[last:m.start()])
    if m.end() > m.start():
      pieces.append(m.group())
    last = m.end()
  if last < len(text):
    pieces.append(text[last:])
  return pieces


def main():
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
  with open(os.path.join(root, 'tools', 'reference', 'tokenizer_strings.json')) as f:
    entries = json.load(f)
  texts = []
  for e in entries:
    if 'text' in e:
      texts.append(e['text'])
    else:
      texts.append(bytes.fromhex(e['bytes_hex']).decode('utf-8', errors='replace'))
  texts += EXTRA
  cases = []
  for name, pattern in PATTERNS.items():
    for text in texts:
      cases.append({'pattern': name, 'text': text, 'pieces': split(pattern, text)})
  json.dump(cases, sys.stdout, ensure_ascii=True, indent=0)
  sys.stdout.write('\n')


if __name__ == '__main__':
  main()
