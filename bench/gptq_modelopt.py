"""ModelOpt 0.47's AWQ on the calibration tokens of bench/gptq_accuracy.py, exported as ModelOpt checkpoints.

Run in the scratch venv that has ModelOpt (never the project's)::

    /root/upstream-venv/bin/python bench/gptq_modelopt.py --model /root/smol-model --work /tmp/gq-bench

Writes ``outputs/modelopt-<ALGO>-<variant>`` (``export_hf_checkpoint``):

    NVFP4        rtn: NVFP4_DEFAULT_CFG (max calibration)    awq: NVFP4_AWQ_LITE_CFG    awq-clip: NVFP4_AWQ_CLIP_CFG
    W4A16_NVFP4  rtn: W4A16_NVFP4_CFG                        awq: W4A16_NVFP4_CFG with algorithm awq_lite
    INT4         rtn: INT4_BLOCKWISE_WEIGHT_ONLY_CFG         awq: INT4_AWQ_CFG (W4A16_AWQ)

``--model-class auto`` loads an encoder (``AutoModel``, fp32: all-MiniLM-L6-v2) and, with
``--embed``, measures ModelOpt's own quantized model (its simulated quantization, not an exported
checkpoint: ``export_hf_checkpoint`` targets decoders) on ``search_accuracy.SENTENCES`` as
``bench/int4_minilm.py embed`` does, into ``modelopt_cosines.json`` (read by its ``table``).

``lm_head`` stays unquantized (ModelOpt's default configs disable it). Calibration: every sample of
``calib.jsonl``, one forward each, on the device given. ModelOpt 0.47's NVFP4 fake quantization is CUDA-only
(``tensor_quant._dynamic_block_quantize_impl``: "amax must be a CUDA tensor for dynamic block
quantization"), so every NVFP4 config needs ``--device cuda`` (``bench/gptq_smol_gpu.sh`` runs it), or
``--cpu-nvfp4``: the CPU kernel of ModelOpt's ``tensorrt::dynamic_block_quantize_op`` is replaced by
:func:`fp4_fake_quant_block`, a torch replica of the arithmetic of its Hopper Triton kernel
(``fp4_kernel_hopper.fp4_fake_quant_kernel``: global scale ``amax / (6 * 448)``, e4m3 scales per 16
saturating at 448, scales under 1e-5 taken as 1, ModelOpt's E2M1 thresholds); ModelOpt's own code
does everything else (its AWQ search, calibration, export).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

# bench/kernels.py would shadow the `kernels` package transformers probes for: drop this folder from the path
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def configs(mtq) -> dict:
    w4a16_awq = copy.deepcopy(mtq.W4A16_NVFP4_CFG)
    w4a16_awq["algorithm"] = "awq_lite"
    return {("NVFP4", "rtn"): mtq.NVFP4_DEFAULT_CFG, ("NVFP4", "awq"): mtq.NVFP4_AWQ_LITE_CFG,
            ("NVFP4", "awq-clip"): mtq.NVFP4_AWQ_CLIP_CFG, ("W4A16_NVFP4", "rtn"): mtq.W4A16_NVFP4_CFG,
            ("W4A16_NVFP4", "awq"): w4a16_awq, ("INT4", "rtn"): mtq.INT4_BLOCKWISE_WEIGHT_ONLY_CFG,
            ("INT4", "awq"): mtq.INT4_AWQ_CFG}


def fp4_fake_quant_block(x, global_amax, block_size: int = 16):
    """ModelOpt 0.47's NVFP4 fake quantization (``fp4_fake_quant_kernel``), in torch on any device."""
    import torch

    shape, dtype = x.shape, x.dtype
    g = x.reshape(-1, shape[-1]).float().reshape(-1, shape[-1] // block_size, block_size)
    gs = float(global_amax.float().max()) / (6.0 * 448.0)
    gs = gs if gs > 0 else 1e-12
    a = g.abs()
    s = ((a.amax(-1, keepdim=True) / (6.0 * gs)).clamp(max=448.0).to(torch.float8_e4m3fn).float() * gs)
    s = torch.where(s >= 1e-5, s, torch.ones_like(s))
    q = a / s
    v = torch.where(q <= 0.25, 0.0, torch.where(q < 0.75, 0.5, torch.where(q <= 1.25, 1.0, torch.where(
        q < 1.75, 1.5, torch.where(q <= 2.5, 2.0, torch.where(q < 3.5, 3.0, torch.where(q <= 5.0, 4.0, 6.0)))))))
    y = torch.where(g >= 0, v * s, -v * s)
    return y.reshape(shape).to(dtype)


def use_cpu_nvfp4() -> None:
    """Point the CPU kernel of ModelOpt's dynamic block quantization at :func:`fp4_fake_quant_block`
    for NVFP4 (E2M1 values, E4M3 scales); every other format keeps ModelOpt's own implementation."""
    import warnings

    import torch
    from modelopt.torch.quantization import tensor_quant

    original = tensor_quant._dynamic_block_quantize_impl

    def impl(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
        if (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) == (4, 2, 8, 4) and amax is not None:
            return fp4_fake_quant_block(inputs, amax, block_size)
        return original(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        torch.library.impl("tensorrt::dynamic_block_quantize_op", "cpu")(impl)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--work", default="/tmp/gq-bench")
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", nargs="*", help="ALGO-variant names to make (default: all)")
    p.add_argument("--again", action="store_true")
    p.add_argument("--cpu-nvfp4", action="store_true", help="NVFP4 configs on the CPU (ModelOpt's fake quantization replaced: see the docstring)")
    p.add_argument("--model-class", choices=["causal", "auto"], default="causal", help="auto: AutoModel (an encoder), fp32")
    p.add_argument("--embed", action="store_true", help="measure the quantized model's sentence embeddings instead of exporting")
    a = p.parse_args()
    import modelopt
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModel, AutoModelForCausalLM

    if a.cpu_nvfp4:
        use_cpu_nvfp4()

    samples = [json.loads(line)["input_ids"] for line in open(os.path.join(a.work, "calib.jsonl"))]
    times, cosines, ref = {}, {}, None
    cls, dtype = (AutoModel, torch.float32) if a.model_class == "auto" else (AutoModelForCausalLM, torch.bfloat16)
    if a.embed:
        ref = _embed(cls.from_pretrained(a.model, dtype=dtype).eval(), a.model)
    for (algo, variant), cfg in configs(mtq).items():
        name = f"{algo}-{variant}"
        dst = os.path.join(a.work, "outputs", f"modelopt-{name}")
        if (a.only and name not in a.only) or (os.path.isdir(dst) and not a.again and not a.embed):
            continue
        model = cls.from_pretrained(a.model, dtype=dtype).to(a.device).eval()

        def loop(m):
            with torch.no_grad():
                for ids in samples:
                    m(input_ids=torch.tensor([ids], device=a.device))

        t0 = time.perf_counter()
        mtq.quantize(model, cfg, forward_loop=loop)
        times[name] = round(time.perf_counter() - t0, 1)
        if a.embed:
            c = torch.nn.functional.cosine_similarity(_embed(model, a.model), ref, dim=-1).double().tolist()
            n = sum(1 for _, m in model.named_modules() if getattr(getattr(m, "weight_quantizer", None), "is_enabled", False))
            cosines[f"modelopt-{name}"] = {"linears": n, "cos": c, "seconds": times[name]}
            json.dump(cosines, open(os.path.join(a.work, "modelopt_cosines.json"), "w"))
            print(f"modelopt {name}: {times[name]} s, {n} quantized Linears, mean cosine {sum(c) / len(c):.6f}", flush=True)
            continue
        export_hf_checkpoint(model, export_dir=dst)
        print(f"modelopt {name}: {times[name]} s", flush=True)
        path = os.path.join(a.work, "modelopt_times.json")
        old = json.load(open(path)) if os.path.exists(path) else {}
        json.dump({**old, f"modelopt-{name}": {"seconds": times[name]}}, open(path, "w"), indent=1)
    print(json.dumps({"modelopt": modelopt.__version__, "torch": torch.__version__, "seconds": times}))


def _embed(model, path: str):
    """[S, H] mean-pooled embeddings of search_accuracy.SENTENCES, one sentence per forward (bench/int4_minilm.py's)."""
    import importlib.util

    import torch
    from transformers import AutoTokenizer

    spec = importlib.util.spec_from_file_location("search_accuracy", os.path.join(os.path.dirname(os.path.abspath(__file__)), "search_accuracy.py"))
    sentences = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sentences)
    tok = AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return torch.stack([model(**tok(s, return_tensors="pt")).last_hidden_state[0].float().mean(0) for s in sentences.SENTENCES])


if __name__ == "__main__":
    main()
