"""How long ``quantize convert`` takes to refuse, as whole commands (issue 26: under 0.5 s).

Each refusal that needs no tensor data runs in a fresh process, ``--repeat`` times after one
warm-up run; the table gives the median wall time, the exit code and whether the process
imported torch (it must not: importing it alone costs 1.5-3 s). The source is a tiny synthetic
checkpoint written here, and a destination that already exists; nothing is downloaded.

    python bench/refusals.py                          # this checkout
    PYTHONPATH=/path/to/other/checkout python bench/refusals.py   # another version, same table
    python bench/refusals.py --json /tmp/refusals.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Runs the CLI and appends "torch" to stderr's last line when it was imported.
RUNNER = ("import sys\nfrom quantize_cli.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
          "    code = e.code\nprint('torch' if 'torch' in sys.modules else 'no-torch', file=sys.stderr)\nsys.exit(code)\n")


def write_source(root: str) -> str:
    """A 1-layer Llama folder (bf16 zeros, config.json) written without torch."""
    import struct

    h, i, v = 256, 512, 512
    shapes = {"model.embed_tokens.weight": [v, h], "lm_head.weight": [v, h], "model.norm.weight": [h]}
    for name, shape in (("self_attn.q_proj", [h, h]), ("self_attn.k_proj", [h // 2, h]), ("self_attn.v_proj", [h // 2, h]),
                        ("self_attn.o_proj", [h, h]), ("mlp.gate_proj", [i, h]), ("mlp.up_proj", [i, h]),
                        ("mlp.down_proj", [h, i])):
        shapes[f"model.layers.0.{name}.weight"] = shape
    shapes["model.layers.0.input_layernorm.weight"] = [h]
    shapes["model.layers.0.post_attention_layernorm.weight"] = [h]
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 2 * (shape[0] * (shape[1] if len(shape) > 1 else 1))
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + bytes(offset))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": i,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": v,
              "torch_dtype": "bfloat16"}
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(config, f)
    return root


def cases(src: str, tmp: str) -> dict[str, list[str]]:
    """The refusals of issue 26, and those added with it; each needs no tensor data."""
    exists = os.path.join(tmp, "exists")
    os.makedirs(exists, exist_ok=True)
    out = os.path.join(tmp, "out")
    return {
        "DST exists": ["convert", src, "-o", exists, "--algo", "FP8"],
        "--max-shard-size 5XB": ["convert", src, "-o", out, "--algo", "FP8", "--max-shard-size", "5XB"],
        "missing SRC": ["convert", os.path.join(tmp, "missing"), "-o", out, "--algo", "FP8"],
        "--layout flashinfer --algo INT8": ["convert", src, "-o", out, "--algo", "INT8", "--layout", "flashinfer"],
        "--layout cutlass --algo INT8 --strict": ["convert", src, "-o", out, "--algo", "INT8", "--layout", "cutlass", "--strict"],
        "--exclude typo --strict": ["convert", src, "-o", out, "--algo", "FP8_PB_WO", "--exclude", "*.q_prj", "--strict"],
        "--calib-samples 0": ["convert", src, "-o", out, "--algo", "FP8", "--calib-data", "default", "--calib-samples", "0"],
        "--calib-data missing.jsonl": ["convert", src, "-o", out, "--algo", "FP8", "--calib-data", "calib/nonexistent.jsonl"],
    }


def run(args: list[str]) -> tuple[float, int, bool]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", RUNNER, *args], capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t
    return wall, r.returncode, r.stderr.rstrip().rsplit("\n", 1)[-1] == "torch"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also save the numbers here")
    a = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = write_source(os.path.join(tmp, "src"))
        for name, args in cases(src, tmp).items():
            run(args)  # warm-up: page cache, .pyc files
            walls, code, torch = [], 0, False
            for _ in range(a.repeat):
                wall, code, torch = run(args)
                walls.append(wall)
            rows[name] = {"median_s": round(statistics.median(walls), 3), "max_s": round(max(walls), 3), "exit": code, "torch": torch}
    print("| refusal | median s | max s | exit | imports torch |\n|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| `{name}` | {r['median_s']:.2f} | {r['max_s']:.2f} | {r['exit']} | {'yes' if r['torch'] else 'no'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
