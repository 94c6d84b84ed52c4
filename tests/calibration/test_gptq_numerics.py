"""GPTQ's numerics on the CPU: the same bytes whatever the thread count (issue 36 item 2), and a
Hessian the solver cannot use refused as a one-line error naming the module (issue 35 item 14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from quantize_cli.calibration import gptq
from quantize_cli.calibration.grid import fixed_grid
from quantize_cli.cli import main
from quantize_cli.schemes import SCHEMES
from tests.calibration import builders

# A MiniLM-shaped intermediate.dense ([1536, 384], INT4) whose Hessian is accumulated over 8192
# tokens in one batch, as forward.BATCH_TOKENS gives: with MKL the token sum of x^T x and the Cholesky
# factors split by thread count there, and the old solver's codes differed between 1 and 4 threads.
_SOLVE = """
import hashlib, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from quantize_cli.calibration import gptq
from quantize_cli.calibration.grid import fixed_grid
from quantize_cli.calibration.hessian import BlockStats
from quantize_cli.schemes import SCHEMES
g = torch.Generator().manual_seed(0)
n, k = 1536, 384
w = torch.randn(n, k, generator=g).to(torch.bfloat16)
x = (torch.randn(8192, k, generator=g) @ (torch.randn(k, k, generator=g) / k**0.5 + torch.eye(k))).to(torch.bfloat16)
x[:, : k // 8] *= 6
stats = BlockStats()
stats.record("m", x)
h = stats.of("m").mean_hessian()
grid = fixed_grid(SCHEMES["INT4"], w, None)
sol = gptq.solve(w, h, [grid])
for t in (h, sol.values, grid.codes):
    print(hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest())
assert torch.get_num_threads() == int(sys.argv[1]), "the thread count is restored after the solve"
"""


def _run(code: str, threads: int, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    r = subprocess.run([sys.executable, "-c", code, str(threads), *args], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_hessian_and_solver_bytes_do_not_depend_on_the_thread_count():
    one, four = _run(_SOLVE, 1), _run(_SOLVE, 4)
    names = ("Hessian", "GPTQ values", "GPTQ codes")
    assert one.split() == four.split(), [n for n, a, b in zip(names, one.split(), four.split()) if a != b]


def test_a_non_finite_hessian_is_a_hessian_error():
    w = torch.randn(8, 16).to(torch.bfloat16)
    h = torch.eye(16)
    h[3, 3] = float("inf")
    with pytest.raises(gptq.HessianError, match="non-finite"):
        gptq.solve(w, h, [fixed_grid(SCHEMES["INT8"], w, None)])
    h[3, 3] = -1e30  # finite, never positive definite
    with pytest.raises(gptq.HessianError, match="not positive definite even with damping"):
        gptq.solve(w, h, [fixed_grid(SCHEMES["INT8"], w, None)])


def test_overflowing_mlp_weights_are_a_one_line_error_naming_the_module(tmp_path):
    """A source whose MLP weights overflow (x1e30): the activations after them are inf, so is the
    Hessian of down_proj; the run stops with exit 1 naming the module, the rule and the fix."""
    from safetensors.torch import load_file, save_file

    src = builders.llama(str(tmp_path / "src"))
    for f in os.listdir(src):
        if f.endswith(".safetensors"):
            t = load_file(os.path.join(src, f))
            t = {k: (v * 1e30 if "layers.1.mlp.up_proj" in k or "layers.1.mlp.gate_proj" in k else v) for k, v in t.items()}
            save_file(t, os.path.join(src, f), metadata={"format": "pt"})
    data = tmp_path / "calib.jsonl"
    data.write_text("".join(json.dumps({"input_ids": s}) + "\n" for s in ([5, 17, 99, 3, 250, 7, 8, 9], [1, 2, 3, 200, 100, 50])))
    r = CliRunner().invoke(main, ["convert", src, "-o", str(tmp_path / "out"), "--algo", "W4A16_NVFP4", "--rounding", "gptq",
                                  "--calib-data", str(data), "--device", "cpu", "--quiet"])
    assert r.exit_code == 1, r.output
    err = r.output.strip().splitlines()
    assert len(err) == 1 and "internal error" not in err[0], r.output
    assert "model.layers.1.mlp.down_proj" in err[0] and "non-finite" in err[0] and "--exclude model.layers.1.mlp.down_proj" in err[0]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("algo", ["INT4", "W4A16_NVFP4", "INT8"])
def test_row_slices_give_the_bytes_of_the_whole(algo):
    """GPTQ solved 1, 7 or 100 rows at a time (the CPU working set bounded, issue 37 goal 3) writes
    the bytes of the unsliced solve, fused members included (two grids stacked by rows)."""
    g = torch.Generator().manual_seed(1)
    n, k = 100, 256  # 100 rows: a partial 64-row tile; 256 columns: two blocks, so the lazy update runs
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    x = torch.randn(1024, k, generator=g) @ (torch.randn(k, k, generator=g) / k**0.5 + torch.eye(k))
    x[:, :9] *= 8
    h = x.t() @ x / x.shape[0]
    results = {}
    for rows in (None, 1, 7, n):
        grids = [fixed_grid(SCHEMES[algo], p, None) for p in (w[:60], w[60:])]
        sol = gptq.solve(w, h, grids, rows=rows)
        results[rows] = (sol, [{k: _bits(v) for k, v in gr.outputs().items()} for gr in grids])
    whole, outs = results[None]
    for rows, (sol, o) in results.items():
        assert torch.equal(sol.values.view(torch.int32), whole.values.view(torch.int32)), f"rows={rows}"
        assert all(torch.equal(a[name], b[name]) for a, b in zip(o, outs) for name in a), f"rows={rows}"
        assert sol.error == pytest.approx(whole.error, rel=1e-5) and sol.rtn_error == pytest.approx(whole.rtn_error, rel=1e-5)


def test_slice_rows_follow_the_memory_budget():
    assert gptq.slice_rows(4096, None) is None
    assert gptq.slice_rows(4096, 4 * 2**30) == 8192  # a quarter of the default 4 GB, 8 fp32 copies of a 4096-wide row
    assert gptq.slice_rows(14336, 2**30) * 8 * 4 * 14336 <= 2**30 // 4
    assert gptq.slice_rows(10**9, 1) == 1


def test_the_memory_budget_reaches_the_solver(tmp_path, monkeypatch):
    src = builders.llama(str(tmp_path / "src"))
    data = tmp_path / "calib.jsonl"
    data.write_text(json.dumps({"input_ids": [5, 17, 99, 3, 250, 7, 8, 9]}) + "\n")
    seen = []
    solve = gptq.solve
    monkeypatch.setattr(gptq, "solve", lambda w, h, grids, rows=None, **kw: seen.append((h.shape[0], rows)) or solve(w, h, grids, rows=rows, **kw))
    r = CliRunner().invoke(main, ["convert", src, "-o", str(tmp_path / "out"), "--algo", "INT8", "--rounding", "gptq",
                                  "--calib-data", str(data), "--device", "cpu", "--memory-budget", "64MB", "--quiet"])
    assert r.exit_code == 0, r.output
    assert seen and all(rows == gptq.slice_rows(k, 64 * 10**6) for k, rows in seen), seen


def test_the_lazy_update_of_a_row_does_not_depend_on_the_rows_around_it():
    """The property row slicing rests on, at a MiniLM shape: MKL's GEMM gives a row other bits
    alone (M=1) than inside the whole matrix; the fixed 64-row tiles of gptq._update do not."""
    g = torch.Generator().manual_seed(2)
    E, U = torch.randn(1536, 128, generator=g), torch.randn(128, 384, generator=g)
    W = torch.randn(1536, 384, generator=g)
    whole = W.clone()
    gptq._update(whole, E, U)
    for rows in (1, 7, 100):
        sliced = W.clone()
        for r0 in range(0, 1536, rows):
            gptq._update(sliced[r0 : r0 + rows], E[r0 : r0 + rows], U)
        assert torch.equal(sliced.view(torch.int32), whole.view(torch.int32)), f"rows={rows}"


def test_a_minilm_shaped_gptq_conversion_writes_the_same_bytes_with_1_and_4_threads(tmp_path):
    """Issue 36 item 2 end to end: `convert --rounding gptq` of a MiniLM-shaped BERT (hidden 384,
    intermediate 1536) on 8192 calibration tokens, in processes with 1 and with 4 threads."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=1, num_attention_heads=12,
                     vocab_size=builders.VOCAB, max_position_embeddings=512)
    src = builders.save(BertModel(cfg), str(tmp_path / "src"), shard="2MB")
    g = torch.Generator().manual_seed(0)
    data = tmp_path / "calib.jsonl"
    data.write_text("".join(json.dumps({"input_ids": torch.randint(0, builders.VOCAB, (512,), generator=g).tolist()}) + "\n"
                            for _ in range(16)))
    out = {}
    for threads in (1, 4):
        dst = tmp_path / f"out{threads}"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        r = subprocess.run([sys.executable, "-m", "quantize_cli", "convert", src, "-o", str(dst), "--algo", "INT4",
                            "--rounding", "gptq", "--calib-data", str(data), "--calib-samples", "16", "--calib-seq-len", "512",
                            "--device", "cpu", "--quiet"], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        out[threads] = {f: open(dst / f, "rb").read() for f in sorted(os.listdir(dst)) if f.endswith(".safetensors")}
    assert out[1] and out[1] == out[4], [f for f in out[1] if out[1][f] != out[4].get(f)]
