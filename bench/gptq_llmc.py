"""llm-compressor 0.14's GPTQ / AWQ / RTN on the calibration tokens of bench/gptq_accuracy.py.

Run in the scratch venv that has llm-compressor (never the project's)::

    /root/llmc-venv/bin/python bench/gptq_llmc.py --model /root/smol-model --work /tmp/gq-bench

For W4A16_NVFP4 (llm-compressor's ``NVFP4A16``), NVFP4 (``NVFP4``), INT4 (``W4A16``) and INT4_ASYM
(``W4A16_ASYM``) it writes
``outputs/llmc-<ALGO>-<variant>`` (compressed-tensors) for:

    rtn       QuantizationModifier
    gptq      GPTQModifier (block 128, dampening 0.01, actorder static: its defaults)
    awq       AWQModifier (its defaults: duo scaling, 20 grid points) + QuantizationModifier
    awq-gptq  AWQModifier + GPTQModifier

``lm_head`` is ignored, as the project leaves it unquantized. ``--model-class auto`` loads an encoder
(``AutoModel``, e.g. all-MiniLM-L6-v2's ``BertModel``) instead of ``AutoModelForCausalLM``. Calibration: every sample of
``calib.jsonl`` (the project's ``default`` samples as token ids), one per batch, on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# bench/kernels.py would shadow the `kernels` package transformers probes for: drop this folder from the path
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def recipe(variant: str, scheme: str):
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier

    quant = dict(targets="Linear", scheme=scheme, ignore=["lm_head"])
    return {"rtn": [QuantizationModifier(**quant)], "gptq": [GPTQModifier(**quant)],
            "awq": [AWQModifier(), QuantizationModifier(**quant)], "awq-gptq": [AWQModifier(), GPTQModifier(**quant)]}[variant]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--work", default="/tmp/gq-bench")
    p.add_argument("--algos", nargs="+", default=["W4A16_NVFP4", "NVFP4"])
    p.add_argument("--variants", nargs="+", default=["rtn", "gptq", "awq", "awq-gptq"])
    p.add_argument("--again", action="store_true")
    p.add_argument("--seq-len", type=int, default=512, help="max_seq_length (the samples' length)")
    p.add_argument("--model-class", choices=["causal", "auto"], default="causal", help="auto: AutoModel (an encoder)")
    a = p.parse_args()
    import torch
    from datasets import Dataset
    from transformers import AutoModel, AutoModelForCausalLM

    import llmcompressor
    from llmcompressor import oneshot

    if not torch.cuda.is_available():  # AWQ pins its cached activations, which needs an accelerator; on the CPU
        from llmcompressor.pipelines.cache import IntermediatesCache  # pinning is a no-op (no effect on the arithmetic)

        IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
    samples = [json.loads(line)["input_ids"] for line in open(os.path.join(a.work, "calib.jsonl"))]
    ds = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
    times = {}
    for algo in a.algos:
        scheme = {"W4A16_NVFP4": "NVFP4A16", "NVFP4": "NVFP4", "INT4": "W4A16", "INT4_ASYM": "W4A16_ASYM"}[algo]
        for variant in a.variants:
            dst = os.path.join(a.work, "outputs", f"llmc-{algo}-{variant}")
            if os.path.isdir(dst) and not a.again:
                continue
            cls = AutoModel if a.model_class == "auto" else AutoModelForCausalLM
            model = cls.from_pretrained(a.model, dtype=torch.bfloat16 if a.model_class == "causal" else torch.float32)
            t0 = time.perf_counter()
            oneshot(model=model, dataset=ds, recipe=recipe(variant, scheme), max_seq_length=a.seq_len,
                    num_calibration_samples=len(samples), shuffle_calibration_samples=False)
            times[f"llmc-{algo}-{variant}"] = {"seconds": round(time.perf_counter() - t0, 1)}
            model.save_pretrained(dst, save_compressed=True)
            print(f"llmc {algo} {variant}: {times[f'llmc-{algo}-{variant}']}", flush=True)
            path = os.path.join(a.work, "llmc_times.json")
            old = json.load(open(path)) if os.path.exists(path) else {}
            json.dump({**old, **times}, open(path, "w"), indent=1)
    print(json.dumps({"llmcompressor": llmcompressor.__version__, "torch": torch.__version__, "seconds": times}))


if __name__ == "__main__":
    main()
