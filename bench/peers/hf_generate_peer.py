#!/usr/bin/env python3
"""End-to-end peer: Hugging Face transformers `generate()` with a static KV
cache on a model directory (e.g. make_model --preset=llama3-8b), greedy,
random prompts of a fixed length. Prints one JSON line per batch size:

  python3 bench/peers/hf_generate_peer.py --model_dir DIR --batch 1,16,64 \
      --prompt_len 512 --new_tokens 128

tokens/s counts generated tokens only (batch * new_tokens / wall time of
generate(), after one warm-up call per batch size).
"""

import argparse
import json
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--batch", default="1,16,64")
    parser.add_argument("--prompt_len", type=int, default=512)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    import transformers

    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.bfloat16).cuda().eval()
    vocab = model.config.vocab_size
    for batch in [int(b) for b in args.batch.split(",")]:
        ids = torch.randint(0, min(vocab, 1000), (batch, args.prompt_len), device="cuda")
        kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                      do_sample=False, cache_implementation="static",
                      pad_token_id=0)
        with torch.no_grad():
            model.generate(ids, **kwargs)  # warm-up (and static cache allocation)
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, **kwargs)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        generated = (out.shape[1] - args.prompt_len) * batch
        print(json.dumps({"peer": "hf_generate_static", "batch": batch,
                          "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                          "seconds": round(seconds, 4),
                          "tokens_per_s": round(generated / seconds, 1)}), flush=True)


if __name__ == "__main__":
    main()
