"""ModelOpt 0.47's AWQ on the calibration tokens of bench/gptq_accuracy.py, exported as ModelOpt checkpoints.

Run in the scratch venv that has ModelOpt (never the project's)::

    /root/upstream-venv/bin/python bench/gptq_modelopt.py --model /root/smol-model --work /tmp/gq-bench

Writes ``outputs/modelopt-<ALGO>-<variant>`` (``export_hf_checkpoint``):

    NVFP4        rtn: NVFP4_DEFAULT_CFG (max calibration)    awq: NVFP4_AWQ_LITE_CFG    awq-clip: NVFP4_AWQ_CLIP_CFG
    W4A16_NVFP4  rtn: W4A16_NVFP4_CFG                        awq: W4A16_NVFP4_CFG with algorithm awq_lite

``lm_head`` stays unquantized (ModelOpt's default configs disable it). Calibration: every sample of
``calib.jsonl``, one forward each, on the device given. ModelOpt 0.47's NVFP4 fake quantization is CUDA-only
(``tensor_quant._dynamic_block_quantize_impl``: "amax must be a CUDA tensor for dynamic block
quantization"), so every NVFP4 config needs ``--device cuda``: ``bench/modelopt_gpu.sh`` runs it.
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
            ("W4A16_NVFP4", "awq"): w4a16_awq}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--work", default="/tmp/gq-bench")
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", nargs="*", help="ALGO-variant names to make (default: all)")
    p.add_argument("--again", action="store_true")
    a = p.parse_args()
    import modelopt
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM

    samples = [json.loads(line)["input_ids"] for line in open(os.path.join(a.work, "calib.jsonl"))]
    times = {}
    for (algo, variant), cfg in configs(mtq).items():
        name = f"{algo}-{variant}"
        dst = os.path.join(a.work, "outputs", f"modelopt-{name}")
        if (a.only and name not in a.only) or (os.path.isdir(dst) and not a.again):
            continue
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).to(a.device).eval()

        def loop(m):
            with torch.no_grad():
                for ids in samples:
                    m(input_ids=torch.tensor([ids], device=a.device))

        t0 = time.perf_counter()
        mtq.quantize(model, cfg, forward_loop=loop)
        times[name] = round(time.perf_counter() - t0, 1)
        export_hf_checkpoint(model, export_dir=dst)
        print(f"modelopt {name}: {times[name]} s", flush=True)
        path = os.path.join(a.work, "modelopt_times.json")
        old = json.load(open(path)) if os.path.exists(path) else {}
        json.dump({**old, f"modelopt-{name}": {"seconds": times[name]}}, open(path, "w"), indent=1)
    print(json.dumps({"modelopt": modelopt.__version__, "torch": torch.__version__, "seconds": times}))


if __name__ == "__main__":
    main()
