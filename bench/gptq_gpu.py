"""GPTQ time and memory on the GPU: ``convert --rounding gptq`` on the Llama-3-8B-shaped synthetic
checkpoint of ``bench/e2e.py`` (16 layers, H 4096, I 14336, random bf16 weights) with N x L random
token ids, and llm-compressor's GPTQModifier on the same checkpoint and tokens beside it.

Each run is a fresh process, so its peak RSS (VmHWM) and peak GPU memory
(``torch.cuda.max_memory_allocated``) are its own. One JSON line per run; ``--json`` saves all.

    python bench/gptq_gpu.py --json /tmp/gptq-gpu.json                                   # ours, W4A16_NVFP4
    python bench/gptq_gpu.py --algo NVFP4 --smooth awq --json /tmp/awq-gpu.json          # AWQ + GPTQ, W4A4
    python bench/gptq_gpu.py --algo INT4 --json /tmp/gptq-int4-gpu.json                  # INT4 W4A16 group 128
    python bench/gptq_gpu.py --llmc-python /path/to/llmc-venv/bin/python --json /tmp/gptq-gpu.json   # + llm-compressor
    python bench/gptq_gpu.py --device cpu --layers 1 --vocab 32000 --samples 2 --seq-len 64      # smoke test

The llm-compressor venv needs llmcompressor 0.14.0.1 and a CUDA torch; it never imports this
package (the child runs from /tmp, so ``bench/kernels.py`` cannot shadow the ``kernels`` module).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import proc  # noqa: E402  (bench/proc.py: every command with a timeout)

_OURS = r"""
import json, sys, time
t0 = time.perf_counter()
src, data, dst, device, algo, rounding, smooth, samples, seq_len, loop = sys.argv[1:11]
import torch
if loop == "torch":  # the solver's reference loop instead of the block kernel (same bytes, slower)
    from quantize_cli.calibration import gptq
    gptq.use_kernel = lambda *a: False
from quantize_cli.api import ConvertOptions, convert
res = convert(ConvertOptions(src, dst, algo=algo, device=device, quiet=True, overwrite=True, calib_data=data,
              calib_samples=int(samples), calib_seq_len=int(seq_len), rounding=rounding, smooth=smooth,
              report=dst + ".report.json"))
conv = json.load(open(dst + "/hf_quant_config.json"))["converter"]["weights"]
rss = max(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
print("RESULT " + json.dumps({"who": "quantize", "wall_s": time.perf_counter() - t0, "timings": res.report.get("timings"),
      "weights": conv, "peak_rss_GB": rss / 1e9, "peak_gpu_GB": gpu / 1e9,
      "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "torch": torch.__version__}))
sys.stdout.flush()
import os
os._exit(0)
"""

_LLMC = r"""
import json, sys, time
t0 = time.perf_counter()
src, data, dst, scheme, samples, seq_len = sys.argv[1:7]
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
import llmcompressor
from llmcompressor import oneshot
from llmcompressor.modifiers.gptq import GPTQModifier
ids = [json.loads(l)["input_ids"][: int(seq_len)] for l in open(data)][: int(samples)]
ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(s) for s in ids]})
model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
t1 = time.perf_counter()
# the synthetic checkpoint has no tokenizer and the tokens are ids already; oneshot still wants a processor
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                              unk_token="<unk>", pad_token="<unk>")
oneshot(model=model, dataset=ds, processor=tok, recipe=[GPTQModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])],
        max_seq_length=int(seq_len), num_calibration_samples=len(ids), shuffle_calibration_samples=False)
t2 = time.perf_counter()
model.save_pretrained(dst, save_compressed=True)
rss = max(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
print("RESULT " + json.dumps({"who": "llm-compressor " + llmcompressor.__version__, "wall_s": time.perf_counter() - t0,
      "oneshot_s": t2 - t1, "save_s": time.perf_counter() - t2, "peak_rss_GB": rss / 1e9, "peak_gpu_GB": gpu / 1e9,
      "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "torch": torch.__version__}))
sys.stdout.flush()
import os
os._exit(0)
"""


def main() -> None:
    from e2e import synthetic_args, synthetic_input

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    synthetic_args(p, "/tmp/quantize-e2e", 128)
    p.add_argument("--algo", default="W4A16_NVFP4")
    p.add_argument("--rounding", default="gptq")
    p.add_argument("--smooth", default="none")
    p.add_argument("--llmc-python", help="a python with llmcompressor 0.14 (and CUDA torch): run its GPTQModifier too")
    p.add_argument("--loop", choices=["auto", "torch"], default="auto",
                   help="torch: GPTQ's column loop in torch even on a GPU (the reference; default: the Triton block kernel)")
    p.add_argument("--dst", help="our output folder (default WORK/gptq-ALGO-SMOOTH)")
    p.add_argument("--only", choices=["ours", "llmc"], help="run one side (two device calls on one warm machine)")
    p.add_argument("--json")
    a = p.parse_args()
    src, data = synthetic_input(a, "calib", 0)
    common = {"layers": a.layers, "samples": a.samples, "seq_len": a.seq_len, "algo": a.algo,
              "one_layer_GB": 2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096) / 1e9,
              "one_layer_hessians_GB": 4 * (3 * 4096 * 4096 + 14336 * 14336) / 1e9,
              "checkpoint_GB": sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src)) / 1e9}
    results = []
    dst = a.dst or os.path.join(a.work, f"gptq-{a.algo}-{a.smooth}")
    if a.only != "llmc":
        results.append({**proc.result([sys.executable, "-c", _OURS, src, data, dst, a.device, a.algo, a.rounding, a.smooth,
                                str(a.samples), str(a.seq_len), a.loop], "ours", cwd=ROOT), **common})
        print(json.dumps(results[-1]), flush=True)
    if a.llmc_python and a.only != "ours":
        scheme = {"W4A16_NVFP4": "NVFP4A16", "NVFP4": "NVFP4", "INT4": "W4A16"}[a.algo]
        results.append({**proc.result([a.llmc_python, "-c", _LLMC, src, data, os.path.join(a.work, f"llmc-gptq-{a.algo}"), scheme,
                                str(a.samples), str(a.seq_len)], "llm-compressor", cwd="/tmp"), **common})
        print(json.dumps(results[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
