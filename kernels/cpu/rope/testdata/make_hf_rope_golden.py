import sys, json, struct
import torch, transformers
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as ml
print("torch", torch.__version__, "transformers", transformers.__version__)
def hexs(t): return [format(struct.unpack('<I', struct.pack('<f', float(v)))[0], '08x') for v in t.flatten().tolist()]
out = {}
cfgs = {
 "default64": LlamaConfig(hidden_size=64*4, num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, max_position_embeddings=4096),
 "llama3_128": LlamaConfig(hidden_size=128*4, num_attention_heads=4, num_key_value_heads=1, rope_theta=500000.0, max_position_embeddings=131072,
     rope_scaling={"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}),
}
positions = [0, 1, 7, 100, 4095, 8191, 100000]
for name, cfg in cfgs.items():
  rope = ml.LlamaRotaryEmbedding(config=cfg)
  inv = rope.inv_freq
  d = cfg.hidden_size // cfg.num_attention_heads
  nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
  T = len(positions)
  q = torch.tensor([[[(((h*131 + i*17 + t*7) % 29) - 14) / 8.0 for i in range(d)] for h in range(nh)] for t in range(T)], dtype=torch.float32)
  k = torch.tensor([[[(((h*61 + i*13 + t*5) % 23) - 11) / 4.0 for i in range(d)] for h in range(nkv)] for t in range(T)], dtype=torch.float32)
  pos = torch.tensor([positions])
  x = torch.zeros(1, T, d)
  cos, sin = rope(x, pos)
  qe, ke = ml.apply_rotary_pos_emb(q.transpose(0,1).unsqueeze(0), k.transpose(0,1).unsqueeze(0), cos, sin)
  out[name] = {"inv_freq": hexs(inv), "cos": hexs(cos[0][:, :d//2]), "sin": hexs(sin[0][:, :d//2]),
               "q": hexs(qe[0].transpose(0,1)), "k": hexs(ke[0].transpose(0,1))}
json.dump(out, open(sys.argv[1], "w"))
print("ok")
