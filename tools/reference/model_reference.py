#!/usr/bin/env python3
"""Reference logits and greedy continuations from Hugging Face transformers.

Runs where `torch`, `transformers` and `tokenizers` are installed (not in CI):

  python3 tools/reference/model_reference.py --model_dir DIR --out_dir OUT [--name llama3-tiny]

For each prompt it tokenizes with the model's tokenizer.json (add special
tokens), then runs the model in float32 with eager attention on the CPU and
records, without a KV cache (every step a full forward pass):
  - steps 0..16: the last position's logits after the prompt and after each of
    the first 16 greedy tokens (teacher forcing along the greedy path);
  - the greedy continuation of 64 tokens (EOS does not stop it);
  - how many of those greedy choices HF's own bfloat16 model makes too,
    teacher-forced along the float32 path (a yardstick for bf16 paths).
Writes OUT/reference.json (ids, tokens, file digests, versions) and
OUT/logits.bin (float32 little-endian, [prompt][step][vocab]).
"""

import argparse
import hashlib
import json
import os
import struct
import sys

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! Numbers 12345 and 3.14159; unicode: caf\u00e9, \u4f60\u597d, \U0001F600.",
    ("Once upon a time, in a land far away, there lived a curious engineer who built "
     "machines that could talk. Every morning she would wake up, brew a pot of coffee, "
     "and ask the newest machine a question it had never heard before."),
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Q: What is the capital of France?\nA:",
    "\u0413\u0435\u0439\u043c \u0438 \u043c\u0438\u0440 \u2014 2026-11-21 \u00e0 9:30, \u00e9t\u00e9",
    "    for (int i = 0; i < 10; ++i) { total += values[i]; }",
    "a",
]
DECODE_STEPS = 16
GREEDY_TOKENS = 64


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fnv1a64(path):
    """FNV-1a 64 of a file, which the C++ tests recompute to check that the
    model they generate is the one these references were computed from."""
    h = 0xcbf29ce484222325
    with open(path, "rb") as f:
        data = f.read()
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--name", default="")
    args = parser.parse_args()

    import tokenizers
    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = tokenizers.Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.float32, attn_implementation="eager",
        output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(key):
            sys.exit(f"{args.model_dir}: {key}: {info[key]}")
    model.eval()
    model_bf16 = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.bfloat16, attn_implementation="eager").eval()
    vocab = model.config.vocab_size

    os.makedirs(args.out_dir, exist_ok=True)
    records = []
    with open(os.path.join(args.out_dir, "logits.bin"), "wb") as blob, torch.no_grad():
        for text in PROMPTS:
            ids = tok.encode(text, add_special_tokens=True).ids
            seq = list(ids)
            generated = []
            for step in range(GREEDY_TOKENS):
                logits = model(torch.tensor([seq])).logits[0, -1].float()
                if step <= DECODE_STEPS:
                    blob.write(struct.pack(f"<{vocab}f", *logits.tolist()))
                nxt = int(torch.argmax(logits).item())
                generated.append(nxt)
                seq.append(nxt)
            # The same model in bf16 (HF's own), teacher-forced along the f32
            # greedy path: how often its argmax agrees, the yardstick for a
            # bf16 implementation.
            full = torch.tensor([ids + generated[:-1]])
            bf16_logits = model_bf16(full).logits[0, len(ids) - 1:].float()
            bf16_choice = torch.argmax(bf16_logits, dim=-1).tolist()
            agree = sum(int(a == b) for a, b in zip(bf16_choice, generated))
            records.append({"text": text, "prompt_ids": ids, "greedy": generated,
                            "hf_bf16_agreement": agree})
            print(f"prompt of {len(ids)} tokens -> {generated[:8]}...", flush=True)

    digests = {}
    for name in sorted(os.listdir(args.model_dir)):
        if name.endswith((".json", ".safetensors")):
            path = os.path.join(args.model_dir, name)
            digests[name] = {"sha256": sha256(path), "fnv1a64": fnv1a64(path)}
    out = {
        "name": args.name,
        "vocab_size": vocab,
        "decode_steps": DECODE_STEPS,
        "logits_rows_per_prompt": DECODE_STEPS + 1,
        "greedy_tokens": GREEDY_TOKENS,
        "dtype": "float32",
        "attn_implementation": "eager",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "config": model.config.to_dict(),
        "files": digests,
        "prompts": records,
    }
    with open(os.path.join(args.out_dir, "reference.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    print(f"wrote {args.out_dir}")


if __name__ == "__main__":
    main()
