"""GPU check (not a test; needs a CUDA GPU and vLLM): vLLM loads and runs what `quantize` writes.

docs/support.md says "parsed, not served" for every vLLM row: vLLM 0.33's config classes read our
files on the CPU, but no run served one. This converts ``example:tiny-llama`` (it ships a
tokenizer) with every algorithm in both formats, loads each output with ``vllm.LLM`` and greedily
generates a few tokens, next to the bf16 source: a row says whether vLLM loaded it, the quantization
method it chose and how many of the generated tokens equal the source's.

    python bench/vllm_serve_check.py --json /tmp/vllm_serve.json          # GPU machine, vLLM installed
    python bench/vllm_serve_check.py --algos NVFP4 MXFP8 --formats compressed-tensors

Each output is served in a fresh subprocess (vLLM keeps GPU memory for the life of a process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ALGOS = ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "INT8", "MXFP8"]
PROMPTS = ["The capital of France is", "def add(a, b):", "Quantization keeps"]

SERVE = r"""
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], enforce_eager=True, gpu_memory_utilization=0.3, max_model_len=256)
outs = llm.generate(json.loads(sys.argv[2]), SamplingParams(temperature=0, max_tokens=8))
method = getattr(llm.llm_engine.model_config, "quantization", None)
print("RESULT " + json.dumps({"method": method, "tokens": [list(o.outputs[0].token_ids) for o in outs]}))
"""


def serve(folder: str) -> dict:
    isolated = ["-P"] if sys.version_info >= (3, 11) else []  # the checkout's kernels/ must not shadow the `kernels` package
    r = subprocess.run([sys.executable, *isolated, "-c", SERVE, folder, json.dumps(PROMPTS)], capture_output=True, text=True,
                       timeout=900)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if r.returncode or line is None:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        return {"ok": False, "error": tail[:200]}
    return {"ok": True, **json.loads(line[len("RESULT "):])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", nargs="+", default=ALGOS)
    ap.add_argument("--formats", nargs="+", default=["modelopt", "compressed-tensors"])
    ap.add_argument("--json")
    a = ap.parse_args()
    from quantize_cli.checkpoint.examples import example_path

    src = example_path("tiny-llama")
    ref = serve(src)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in a.formats:
            for algo in a.algos:
                dst = os.path.join(tmp, f"{fmt}-{algo}")
                conv = subprocess.run([sys.executable, "-m", "quantize_cli", "convert", "example:tiny-llama", "-o", dst,
                                       "--algo", algo, "--format", fmt, "-q"], capture_output=True, text=True, timeout=600)
                if conv.returncode:
                    rows.append({"format": fmt, "algo": algo, "ok": False, "error": "convert: " + conv.stderr.strip()[-200:]})
                    continue
                got = serve(dst)
                same = None
                if got.get("ok") and ref.get("ok"):
                    same = sum(x == y for a_, b_ in zip(got["tokens"], ref["tokens"]) for x, y in zip(a_, b_))
                rows.append({"format": fmt, "algo": algo, **got, "same_tokens": same})
    print(f"source: {'ok' if ref.get('ok') else ref.get('error')}")
    print("| format | algo | vLLM loads | method | tokens equal to the source's |\n|---|---|---|---|---|")
    total = len(PROMPTS) * 8
    for r in rows:
        print(f"| {r['format']} | {r['algo']} | {'yes' if r['ok'] else 'no: ' + r.get('error', '')} | {r.get('method')} | "
              f"{r.get('same_tokens')}/{total} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"source": ref, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
