#!/usr/bin/env python3
"""Writes a self-contained Hugging Face `tokenizers` reference fixture.

Runs where the `tokenizers` package is installed (only it and the standard
library are used):

  python3 tools/reference/tokenizer_fixtures.py \
      --strings tools/reference/tokenizer_strings.json \
      --tokenizer_dir /tmp/llama3_tok --out tests/fixtures/tokenizer/llama3.json

`--tokenizer_dir` holds tokenizer.json (and, optionally, tokenizer_config.json),
e.g. as written by `bazel run //tools/make_model/tokenizer_gen:write_tokenizer`.
The output embeds both files verbatim plus, for every input string, the ids
with and without special tokens and the decode of the latter; the C++ test
//common/tokenizer:tokenizer_fixture_test replays it.

Input strings are {"text": ...} or {"bytes_hex": ...}; bytes are decoded with
errors="replace" (as the C++ Tokenizer::Encode does with invalid UTF-8).
"""

import argparse
import json
import os
import sys

import tokenizers


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--strings', required=True, help='JSON list of {"text"} / {"bytes_hex"}')
  parser.add_argument('--tokenizer_dir', required=True, help='directory with tokenizer.json')
  parser.add_argument('--out', required=True, help='fixture file to write')
  args = parser.parse_args()

  json_path = os.path.join(args.tokenizer_dir, 'tokenizer.json')
  config_path = os.path.join(args.tokenizer_dir, 'tokenizer_config.json')
  with open(json_path, encoding='utf-8') as f:
    tokenizer_json = f.read()
  tokenizer_config_json = ''
  if os.path.exists(config_path):
    with open(config_path, encoding='utf-8') as f:
      tokenizer_config_json = f.read()
  tokenizer = tokenizers.Tokenizer.from_file(json_path)

  with open(args.strings, encoding='utf-8') as f:
    inputs = json.load(f)
  cases = []
  for entry in inputs:
    if 'text' in entry:
      text = entry['text']
    elif 'bytes_hex' in entry:
      text = bytes.fromhex(entry['bytes_hex']).decode('utf-8', errors='replace')
    else:
      sys.exit(f'tokenizer_fixtures: bad entry {entry!r}: expected "text" or "bytes_hex"')
    with_special = tokenizer.encode(text, add_special_tokens=True).ids
    without_special = tokenizer.encode(text, add_special_tokens=False).ids
    cases.append({
        'input': entry,
        'encode_with_special': with_special,
        'encode_without_special': without_special,
        'decode': tokenizer.decode(without_special, skip_special_tokens=False),
    })

  fixture = {
      'tokenizers_version': tokenizers.__version__,
      'tokenizer_dir': os.path.basename(os.path.normpath(args.tokenizer_dir)),
      'tokenizer_json': tokenizer_json,
      'tokenizer_config_json': tokenizer_config_json,
      'cases': cases,
  }
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump(fixture, f, ensure_ascii=False, indent=1)
    f.write('\n')
  print(f'wrote {len(cases)} cases to {args.out} (tokenizers {tokenizers.__version__})')


if __name__ == '__main__':
  main()
