"""End-to-end benchmark, side by side, in one run: I/O floor, a naive serial pipeline,
``quantize convert`` and llm-compressor's ``model_free_ptq`` on the same synthetic checkpoint.

Default input: the Llama-3-8B-shaped bf16 checkpoint of the shared peer benchmark (16 layers,
4 shards, 9.1 GB). For each phase (``cold``: page cache dropped before every run, so the disk is
the limit; ``warm``: the input is in the page cache, so writing the output is the limit) it
measures:

- the I/O floor: reading the input while writing as many bytes as each algorithm's output, on the
  same disk at the same time (``cat`` + ``dd conv=fsync`` in parallel), and each alone;
- the naive serial pipeline (safe_open a shard, quantize 128x128 FP8 with torch, save_file);
- ``quantize convert`` for each algorithm, as a whole process: wall time, input GB/s, peak RSS,
  peak GPU memory;
- llm-compressor ``model_free_ptq`` with the matching scheme (FP8_PB_WO: FP8_BLOCK, INT8: W8A8,
  NVFP4: NVFP4A16) and each worker count, as a whole process.

Every run ends with ``sync``: the bytes are on disk. Prints a markdown table; ``--json`` saves all.
``--baseline DIR`` times a second checkout right after ours (before/after a change, same run).
Python's bytecode should be cached as an installed package has it: the GPU machines ship torch
without ``.pyc`` files and set ``PYTHONDONTWRITEBYTECODE``, which costs every process seconds of
compiling; ``bench/pipeline_profile.sh`` and ``gpu_batch.sh e2e`` set ``PYTHONPYCACHEPREFIX`` first.
Needs root for ``/proc/sys/vm/drop_caches`` in the cold phase.

    python bench/e2e.py --json /tmp/e2e.json                      # GPU machine, full
    python bench/e2e.py --device cpu --layers 2 --vocab 32000 --phases warm --algos FP8_PB_WO \
        --llmc-python /path/to/venv/bin/python --workers 1,2       # CPU-only, ~1.5 GB
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proc  # noqa: E402  (bench/proc.py: every command with a timeout)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLMC_SCHEME = {"FP8_PB_WO": "FP8_BLOCK", "INT8": "W8A8", "NVFP4": "NVFP4A16"}

# Runs one conversion in a fresh process and reports what only that process can see.
_CHILD = r"""
import json, sys, time

def peak_rss_gb():
    # VmHWM: this process's own peak RSS. (ru_maxrss would include the parent's RSS at fork time.)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9

t0 = time.perf_counter()
kind, src, dst, algo, device, workers = sys.argv[1:7]
import torch
if kind == "quantize":
    from quantize_cli.api import ConvertOptions, convert
    res = convert(ConvertOptions(src, dst, algo=algo, device=device, quiet=True, overwrite=True, memory_budget=sys.argv[7]))
    stages = res.report["timings_s"]
else:
    stages = {}
    from llmcompressor import model_free_ptq
    model_free_ptq(src, dst, scheme=algo, ignore=["lm_head", "re:.*embed_tokens$"], max_workers=int(workers),
                   device="cuda:0" if device == "cuda" else "cpu")
gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
print("RESULT " + json.dumps({"inner_s": time.perf_counter() - t0, "rss_GB": peak_rss_gb(),
                               "gpu_GB": gpu / 1e9, "timings": stages}))
sys.stdout.flush()
import os
os._exit(0)  # like the quantize CLI after a run: skip the CUDA / pinned-memory teardown (both tools alike)
"""


# Runs the real command line (`python -m quantize_cli convert ...`, what a user times) and reports its
# peak RSS. This wrapper imports nothing heavy, so the RSS it passes on at fork is a few MB.
_WRAP = r"""
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print("RSS_KB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)
sys.exit(rc)
"""


def sh(cmd: str) -> None:
    proc.run(cmd, shell=True, check=True)


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f.endswith(".safetensors"))


def make_checkpoint(src: str, layers: int, vocab: int, device: str, moe: bool = False) -> None:
    """The peer benchmark's Llama-8B-shaped checkpoint (H 4096, I 14336, KV 1024), 4 shards; with
    `moe`, a Qwen3-30B-A3B-shaped one instead (H 2048, 128 experts of I 768 as transformers-5 fused
    3-D tensors gate_up_proj [E, 2I, H] and down_proj [E, H, I]; ~1.2 GB of experts per layer)."""
    import torch
    from safetensors.torch import save_file

    if os.path.exists(os.path.join(src, "config.json")):
        return
    os.makedirs(src, exist_ok=True)
    h, i, kv = (2048, 768, 512) if moe else (4096, 14336, 1024)
    shapes = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
              "self_attn.o_proj.weight": (h, h), "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    if moe:
        shapes.update({"mlp.gate.weight": (128, h), "mlp.experts.gate_up_proj": (128, 2 * i, h),
                       "mlp.experts.down_proj": (128, h, i)})
    else:
        shapes.update({"mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i)})
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, device=dev, generator=gen, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()

    shards = 4 if layers >= 4 else 1
    per = -(-layers // shards)
    wmap = {}
    for s in range(shards):
        ts = {}
        if s == 0:
            ts["model.embed_tokens.weight"] = rnd(vocab, h)
        for layer in range(per * s, min(layers, per * s + per)):
            for k, shp in shapes.items():
                ts[f"model.layers.{layer}.{k}"] = rnd(*shp) if len(shp) >= 2 else torch.ones(shp, dtype=torch.bfloat16)
        if s == shards - 1:
            ts["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
            ts["lm_head.weight"] = rnd(vocab, h)
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(ts, os.path.join(src, name), metadata={"format": "pt"})
        wmap.update({k: name for k in ts})
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": du(src)}, "weight_map": wmap}, f)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": i,
           "num_hidden_layers": layers, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
           "vocab_size": vocab, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    if moe:
        cfg.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_attention_heads=16, num_key_value_heads=4,
                   moe_intermediate_size=i, num_experts=128, num_experts_per_tok=8, intermediate_size=6144)
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f)


def synthetic_args(p: argparse.ArgumentParser, work: str, samples: int) -> None:
    """The options of the scripts that run on :func:`make_checkpoint`'s input with random token ids
    (calibrate.py, eval_speed.py, gptq_gpu.py)."""
    p.add_argument("--work", default=work)
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--samples", type=int, default=samples)
    p.add_argument("--seq-len", type=int, default=512)


def synthetic_input(a, name: str, seed: int) -> tuple[str, str]:
    """(the checkpoint of `a`'s layers and vocabulary, made once; a jsonl of `a.samples` x `a.seq_len`
    random token ids from `seed`, ``WORK/NAME-SxL.jsonl``)."""
    src = os.path.join(a.work, f"src-l{a.layers}-v{a.vocab}")
    make_checkpoint(src, a.layers, a.vocab, a.device)
    data = os.path.join(a.work, f"{name}-{a.samples}x{a.seq_len}.jsonl")
    rng = random.Random(seed)
    with open(data, "w") as f:
        for _ in range(a.samples):
            f.write(json.dumps({"input_ids": [rng.randrange(a.vocab) for _ in range(a.seq_len)]}) + "\n")
    return src, data


class Bench:
    def __init__(self, args):
        self.a = args
        self.src = os.path.join(args.work, "src")
        self.res: dict = {"runs": []}

    def prepare(self, phase: str) -> None:
        """Make the page cache cold (drop it) or warm (read the input once) before a run."""
        os.sync()
        if phase == "cold":
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        else:
            sh(f"cat {self.src}/*.safetensors > /dev/null")

    def timed(self, phase: str, fn) -> float:
        self.prepare(phase)
        t = time.perf_counter()
        fn()
        os.sync()
        return time.perf_counter() - t

    def floors(self, phase: str, out_bytes: dict[str, int]) -> None:
        w = os.path.join(self.a.work, "floor.bin")
        read = f"cat {self.src}/*.safetensors > /dev/null"

        def write(n):
            return f"dd if=/dev/zero of={w} bs=16M count={max(1, n // (16 << 20))} conv=fsync status=none"

        self.record(phase, "read alone", "-", self.timed(phase, lambda: sh(read)))
        for algo, n in out_bytes.items():
            self.record(phase, f"write alone ({n / 1e9:.2f} GB)", algo, self.timed(phase, lambda: sh(write(n))))
            self.record(phase, "I/O floor (read || write)", algo, self.timed(phase, lambda: sh(f"{read} & {write(n)}; wait")))
            os.remove(w)

    def naive(self, phase: str) -> None:
        import torch
        from safetensors.torch import safe_open, save_file

        dev = torch.device(self.a.device)
        out = os.path.join(self.a.work, "naive")

        def run():
            os.makedirs(out, exist_ok=True)
            for fn in sorted(f for f in os.listdir(self.src) if f.endswith(".safetensors")):
                res = {}
                with safe_open(os.path.join(self.src, fn), "pt") as f:
                    for k in f.keys():
                        x = f.get_tensor(k)
                        if x.ndim == 2 and "embed" not in k and "lm_head" not in k:
                            m, kk = x.shape
                            v = x.to(dev).view(m // 128, 128, kk // 128, 128).float()
                            amax = v.abs().amax(dim=(1, 3), keepdim=True)
                            s = torch.where(amax == 0, torch.ones_like(amax), amax / 448.0)
                            res[k] = (v / s).clamp(-448, 448).to(torch.float8_e4m3fn).view(m, kk).cpu()
                            res[k + "_scale"] = s.view(m // 128, kk // 128).cpu()
                        else:
                            res[k] = x
                save_file(res, os.path.join(out, fn))

        self.record(phase, "naive serial pipeline (torch, FP8 block)", "FP8_PB_WO", self.timed(phase, run))
        shutil.rmtree(out)

    def child(self, phase: str, kind: str, algo: str, workers: int = 1, tree: str = ROOT) -> int:
        dst = os.path.join(self.a.work, f"out-{kind}-{algo}-{workers}")
        py = sys.executable if kind == "quantize" else (self.a.llmc_python or sys.executable)
        arg = algo if kind == "quantize" else LLMC_SCHEME[algo]
        env = {**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", "")}
        info = {}

        report = os.path.join(self.a.work, f"report-{algo}.json")

        def run():
            if kind == "quantize":  # the command a user runs, start-up included
                cmd = [py, "-c", _WRAP, py, "-m", "quantize_cli", "convert", self.src, "-o", dst, "--algo", arg, "--device",
                       self.a.device, "--memory-budget", self.a.budget, "--overwrite", "--quiet", "--report", report]
            else:
                cmd = [py, "-c", _CHILD, kind, self.src, dst, arg, self.a.device, str(workers), self.a.budget]
            p = proc.run(cmd, capture_output=True, text=True, env=env, cwd=tree)  # cwd: `-m` puts it first on sys.path
            if p.returncode:
                raise RuntimeError(f"{kind} {algo} failed:\n{p.stderr[-3000:]}")
            if kind == "quantize":
                rep = json.load(open(report))
                info.update(inner_s=rep["timings_s"]["total_s"], rss_GB=int(p.stdout.split("RSS_KB")[-1]) * 1024 / 1e9,
                            timings=rep["timings_s"],
                            in_flight_GB=(rep["bytes"].get("peak_in_flight") or 0) / 1e9)
            else:
                info.update(json.loads(p.stdout.split("RESULT ")[-1]))

        try:
            secs = self.timed(phase, run)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            self.res.setdefault("errors", []).append(str(exc)[:2000])
            return 0
        out = du(dst)
        label = f"llm-compressor {arg}, {workers} worker(s)"
        if kind == "quantize":
            label = "quantize convert" if tree == ROOT else "quantize convert (baseline)"
        self.record(phase, label, algo, secs, out_GB=out / 1e9, **info)
        shutil.rmtree(dst, ignore_errors=True)
        return out

    def record(self, phase, what, algo, secs, **extra) -> None:
        row = {"phase": phase, "what": what, "algo": algo, "s": secs, "input_GBps": self.res["input_GB"] / secs, **extra}
        self.res["runs"].append(row)
        print(json.dumps(row), flush=True)

    def run(self) -> dict:
        import torch

        t = time.perf_counter()
        make_checkpoint(self.src, self.a.layers, self.a.vocab, self.a.device if self.a.device != "cpu" else "cpu", self.a.moe)
        os.sync()  # the input's own writeback must not land inside the first timed run
        self.res.update(input_GB=du(self.src) / 1e9, generate_s=time.perf_counter() - t, device=self.a.device,
                        torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
        try:
            import triton

            self.res["triton"] = triton.__version__
        except ImportError:
            pass
        algos = self.a.algos.split(",")
        for phase in self.a.phases.split(","):
            outs = {}
            for algo in algos:  # this checkout and the baseline one after the other, on the same page cache state,
                for rep in range(self.a.repeat):  # in turns (ABBA...): going first or second must not decide the comparison
                    trees = [ROOT] + ([os.path.abspath(self.a.baseline)] if self.a.baseline else [])
                    for tree in trees if rep % 2 == 0 else trees[::-1]:
                        out = self.child(phase, "quantize", algo, tree=tree)
                        if tree == ROOT:
                            outs[algo] = out
            self.floors(phase, {a: n for a, n in outs.items() if n})
            if not self.a.skip_naive:
                self.naive(phase)
            if self.a.llmc:
                for algo in algos:
                    for w in [int(x) for x in self.a.workers.split(",")]:
                        self.child(phase, "llmc", algo, w)
        return self.res


def _median_run(runs: list[dict]) -> dict:
    """The run of median time among repeats (the lower middle one for an even count), {} for none."""
    return sorted(runs, key=lambda r: r["s"])[(len(runs) - 1) // 2] if runs else {}


def table(res: dict) -> str:
    """Markdown: per phase and algorithm, our time vs the floor and llm-compressor's best."""
    lines = [f"input {res['input_GB']:.2f} GB, device {res.get('gpu') or 'cpu'}, torch {res.get('torch')}, triton {res.get('triton')}",
             "", "| phase | run | algo | s | input GB/s | peak RSS GB | peak GPU GB |", "|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['phase']} | {r['what']} | {r['algo']} | {r['s']:.2f} | {r['input_GBps']:.2f} | "
                     f"{r.get('rss_GB', 0):.2f} | {r.get('gpu_GB', 0):.2f} |")
    lines += ["", "| phase | algo | ours s (whole process) | in-process s | floor s | whole / floor (speed) | in-process / floor | "
              "peak RSS GB | best llm-compressor s | speed-up | baseline s | baseline / floor |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for phase in dict.fromkeys(r["phase"] for r in res["runs"]):
        for algo in dict.fromkeys(r["algo"] for r in res["runs"] if r["what"] == "quantize convert"):
            pick = [r for r in res["runs"] if r["phase"] == phase and r["algo"] == algo]
            mine = _median_run([r for r in pick if r["what"] == "quantize convert"])
            ours, inner = mine.get("s"), mine.get("inner_s") or 0
            floor = next((r["s"] for r in pick if r["what"].startswith("I/O floor")), None)
            peer = min((r["s"] for r in pick if r["what"].startswith("llm-compressor")), default=None)
            base = _median_run([r for r in pick if r["what"] == "quantize convert (baseline)"]).get("s")
            if ours:
                lines.append(f"| {phase} | {algo} | {ours:.2f} | {inner:.2f} | {floor or 0:.2f} | {(floor or 0) / ours:.0%} | "
                             f"{(floor or 0) / inner if inner else 0:.0%} | {mine.get('rss_GB', 0):.2f} | {peer or 0:.2f} | "
                             f"{(peer / ours) if peer else 0:.2f}x | {base or 0:.2f} | {(floor or 0) / base if base else 0:.0%} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/quantize-e2e")
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--moe", action="store_true", help="a Qwen3-MoE-shaped input (fused 3-D experts) instead of Llama")
    p.add_argument("--phases", default="cold,warm")
    p.add_argument("--algos", default="FP8_PB_WO,NVFP4,INT8")
    p.add_argument("--budget", default="4GB", help="quantize --memory-budget")
    p.add_argument("--llmc", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--llmc-python", help="python of a venv with llmcompressor (default: this one)")
    p.add_argument("--workers", default="1,4")
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--repeat", type=int, default=1, help="times each of ours (and --baseline's) runs, in turns; the table "
                   "takes the median")
    p.add_argument("--baseline", help="another checkout (e.g. a `git archive` of main) timed right after ours, same phase")
    p.add_argument("--json")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    res = Bench(a).run()
    print(table(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
