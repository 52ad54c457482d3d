#!/usr/bin/env python3
"""Tokenizer fixtures from Hugging Face `tokenizers` (not run in CI).

  python3 tools/reference/tokenizer_fixtures.py --strings tools/reference/tokenizer_strings.json \
      --tokenizer_dir MODEL_DIR --out OUT.json

Each entry of the strings file is {"text": ...} or {"bytes_hex": ...}; bytes
are decoded with errors="replace" (what the C++ tokenizer does with invalid
UTF-8). The output embeds tokenizer.json and tokenizer_config.json verbatim,
so the fixture is self-contained, and for every string records the ids with
and without special tokens and the decode of the latter.
"""

import argparse
import json
import os


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strings", required=True)
    parser.add_argument("--tokenizer_dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import tokenizers

    tok_path = os.path.join(args.tokenizer_dir, "tokenizer.json")
    cfg_path = os.path.join(args.tokenizer_dir, "tokenizer_config.json")
    tok = tokenizers.Tokenizer.from_file(tok_path)
    with open(args.strings, encoding="utf-8") as f:
        strings = json.load(f)
    cases = []
    for entry in strings:
        if "bytes_hex" in entry:
            text = bytes.fromhex(entry["bytes_hex"]).decode("utf-8", errors="replace")
        else:
            text = entry["text"]
        with_special = tok.encode(text, add_special_tokens=True).ids
        without = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "input": entry,
            "text": text,
            "encode_with_special": with_special,
            "encode_without_special": without,
            "decode": tok.decode(without, skip_special_tokens=False),
            "decode_skip_special": tok.decode(without, skip_special_tokens=True),
        })
    with open(tok_path, encoding="utf-8") as f:
        tokenizer_json = f.read()
    tokenizer_config_json = ""
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            tokenizer_config_json = f.read()
    out = {
        "tokenizers_version": tokenizers.__version__,
        "tokenizer_json": tokenizer_json,
        "tokenizer_config_json": tokenizer_config_json,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
