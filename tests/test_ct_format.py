"""--format compressed-tensors: static schemes, an independent dequantizer, MoE, CLI, resume, check, verify."""

from __future__ import annotations

import json
import os

import pytest
import torch
from click.testing import CliRunner

import quantize_cli.run.pipeline as pipeline
from quantize_cli.api import check, verify
from tests.conftest import convert
from quantize_cli.cli import main
from quantize_cli.errors import CheckFailed
from quantize_cli.checkpoint.example_weights import deepseek_config, deepseek_tensors, qwen3_moe_config, qwen3_moe_tensors
from quantize_cli.formats import CT_SCHEMES
from quantize_cli.formats.ct_config import PRESETS
from quantize_cli.schemes.numerics import sqnr_db
from tests.conftest import GOLDEN, assert_same_bytes, load_all
from tests.test_resume import files, interrupt_after

TINY = os.path.join(GOLDEN, "checkpoints", "tiny-llama")
CT_GOLDEN = os.path.join(GOLDEN, "compressed_tensors")
ALGOS = ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "INT8", "MXFP8"]
FUSED = {"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}


def ct(src, dst, algo, **kw):
    kw.setdefault("quiet", True)
    convert(str(src), str(dst), algo=algo, format="compressed-tensors", device="cpu", **kw)
    return load_all(dst)


def qconfig(folder) -> dict:
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)["quantization_config"]


# -- the static schemes (no llm-compressor golden: model_free_ptq cannot write static activations) --

def test_fp8_static_per_tensor(tmp_path):
    out = ct(TINY, tmp_path / "o", "FP8")
    for layer in (0, 1):
        for parent, members in FUSED.items():
            scales = [out[f"model.layers.{layer}.{parent}.{m}.weight_scale"] for m in members]
            assert all(s.dtype == torch.bfloat16 and s.shape == (1,) for s in scales)
            assert all(torch.equal(s, scales[0]) for s in scales)  # one scale per fused layer: no requantization in vLLM
            for m in members:
                x = out[f"model.layers.{layer}.{parent}.{m}.input_scale"]
                assert x.dtype == torch.bfloat16 and x.shape == (1,) and x.item() == 1.0
    q = qconfig(tmp_path / "o")
    assert q["config_groups"]["FP8"]["input_activations"]["dynamic"] is False
    assert q["config_groups"]["FP8"]["weights"]["strategy"] == "tensor"


def test_nvfp4_static_weights_equal_llm_compressors_nvfp4a16(tmp_path):
    """NVFP4 (W4A4) writes the NVFP4A16 weight tensors plus a static input_global_scale (6.0 = 2688/448)."""
    out = ct(TINY, tmp_path / "o", "NVFP4")
    golden = load_all(os.path.join(CT_GOLDEN, "tiny-llama-NVFP4A16"))
    n = 0
    for name, t in golden.items():
        if not name.startswith("model.embed_tokens"):
            assert_same_bytes(out[name], t, name)
            n += 1
    assert n == 14 * 3
    g = [v for k, v in out.items() if k.endswith("input_global_scale")]
    assert len(g) == 14 and all(t.dtype == torch.float32 and t.shape == (1,) and t.item() == 6.0 for t in g)
    assert qconfig(tmp_path / "o")["config_groups"]["NVFP4"]["input_activations"]["dynamic"] == "local"


def test_uncalibrated_warning_is_printed(capsys, tmp_path):
    convert(TINY, str(tmp_path / "o"), algo="NVFP4", format="compressed-tensors", device="cpu")
    assert "no calibration data" in capsys.readouterr().err


# -- an independent dequantizer (written from the compressed-tensors format description) -----------

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def independent_dequant(leaves: dict[str, torch.Tensor]) -> torch.Tensor:
    if "weight_packed" in leaves:
        p = leaves["weight_packed"].to(torch.int64)
        nib = torch.stack([p & 15, p >> 4], dim=-1).reshape(p.shape[0], -1)
        val = torch.tensor(E2M1, dtype=torch.float64)[nib & 7] * torch.where(nib >= 8, -1.0, 1.0).double()
        s = leaves["weight_scale"].double() / leaves["weight_global_scale"].double()
        return (val.reshape(val.shape[0], -1, 16) * s[:, :, None]).reshape(val.shape)
    if leaves["weight_scale"].dtype == torch.uint8:  # MXFP8: e8m0 exponents, one per 32 along K
        e = leaves["weight_scale"].to(torch.int64) - 127
        return leaves["weight"].double() * torch.pow(2.0, e.double()).repeat_interleave(32, 1)
    w, s = leaves["weight"].double(), leaves["weight_scale"].double()
    if s.dim() == 2 and s.shape[1] != 1 or (s.dim() == 2 and s.shape[0] != w.shape[0]):  # 128x128 blocks
        s = s.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
    return w * s


@pytest.mark.parametrize("algo", ALGOS)
def test_round_trip_through_an_independent_dequantizer(tmp_path, algo):
    out = ct(TINY, tmp_path / "o", algo)
    src = load_all(TINY)
    scheme = CT_SCHEMES[algo]
    mods = sorted({k.rsplit(".", 1)[0] for k in out if k.endswith("weight_scale")})
    assert len(mods) == 14
    for mod in mods:
        leaves = {k.rsplit(".", 1)[1]: v for k, v in out.items() if k.rsplit(".", 1)[0] == mod}
        ref = independent_dequant(leaves)
        ours = scheme.dequantize(leaves).double()
        assert torch.equal(ours, ref.to(ours.dtype)) or torch.allclose(ours, ref, rtol=1e-6, atol=0), mod
        assert sqnr_db(src[f"{mod}.weight"].float(), ref) > (12 if "NVFP4" in algo else 20), mod


# -- MoE: per-expert, fused 3-D, DeepSeek -----------------------------------------------------------

@pytest.mark.parametrize("algo", ALGOS)
def test_moe_fused_3d_experts_equal_per_expert(make_checkpoint, tmp_path, algo):
    cfg = qwen3_moe_config()
    a = make_checkpoint(qwen3_moe_tensors(cfg, seed=5), cfg, shards=2, name="per_expert")
    b = make_checkpoint(qwen3_moe_tensors(cfg, seed=5, fused_experts=True), cfg, shards=2, name="fused")
    oa, ob = ct(a, tmp_path / "oa", algo), ct(b, tmp_path / "ob", algo)
    assert open(tmp_path / "oa" / "config.json").read() == open(tmp_path / "ob" / "config.json").read()
    assert oa.keys() == ob.keys()
    for k in oa:
        assert_same_bytes(oa[k], ob[k], k)
    payload = "weight_packed" if "NVFP4" in algo else "weight"
    assert f"model.layers.1.mlp.experts.3.down_proj.{payload}" in oa  # experts split per expert, named as compressed-tensors
    ignore = qconfig(tmp_path / "oa")["ignore"]
    assert "model.layers.0.mlp.gate" in ignore and "lm_head" in ignore  # routers stay bf16 and are listed
    assert not any("experts" in e for e in ignore)


@pytest.mark.parametrize("algo", ["NVFP4", "FP8_PB_WO", "INT8"])
def test_deepseek_style_checkpoint(make_checkpoint, tmp_path, algo):
    cfg = deepseek_config()
    src = make_checkpoint(deepseek_tensors(cfg, seed=1), cfg, shards=2, name="ds")
    out = ct(src, tmp_path / "o", algo)
    q = qconfig(tmp_path / "o")
    mtp = f"model.layers.{cfg['num_hidden_layers']}"
    assert any(e.startswith(mtp) for e in q["ignore"])  # the MTP layer is kept, by exact names
    assert all(not e.startswith(("re:", "*")) and "*" not in e for e in q["ignore"])
    if algo == "NVFP4":  # MLA q_a_proj + kv_a_proj_with_mqa are fused by vLLM: one global scale
        a = out["model.layers.0.self_attn.q_a_proj.weight_global_scale"]
        assert torch.equal(a, out["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_global_scale"])
    assert verify(str(tmp_path / "o"), source=src).errors == []


# -- CLI, resume, check ------------------------------------------------------------------------------

def test_cli_format_and_layout_refusal(tmp_path):
    r = CliRunner().invoke(main, ["convert", TINY, "-o", str(tmp_path / "o"), "--algo", "int8", "--format", "compressed-tensors"])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "o" / "hf_quant_config.json").exists()
    assert qconfig(tmp_path / "o")["config_groups"].keys() == {"W8A8"}
    r = CliRunner().invoke(main, ["convert", TINY, "-o", str(tmp_path / "p"), "--algo", "W4A16_NVFP4", "--format",
                                  "compressed-tensors", "--layout", "marlin"])
    assert r.exit_code == 2 and "--layout marlin --format compressed-tensors" in r.output and not (tmp_path / "p").exists()
    r = CliRunner().invoke(main, ["convert", TINY, "-o", str(tmp_path / "q"), "--algo", "FP8", "--format", "gguf"])
    assert r.exit_code == 2


def test_dry_run_lists_compressed_tensors_names(capsys):
    res = convert(TINY, None, algo="W4A16_NVFP4", format="compressed-tensors", dry_run=True, quiet=True)
    assert "model.layers.0.mlp.down_proj.weight_packed" in res.plan.outputs
    assert res.plan.outputs["model.layers.0.mlp.down_proj.weight_global_scale"].shape == (1,)
    assert res.plan.exclude_modules == ["lm_head"]


def test_resume_gives_identical_bytes(tmp_path, monkeypatch):
    convert(TINY, str(tmp_path / "ref"), algo="INT8", format="compressed-tensors", quiet=True, max_shard_size="1MB")
    interrupt_after(monkeypatch, 8)
    with pytest.raises(KeyboardInterrupt):
        convert(TINY, str(tmp_path / "out"), algo="INT8", format="compressed-tensors", quiet=True, max_shard_size="1MB")
    monkeypatch.undo()
    assert not (tmp_path / "out").exists()
    convert(TINY, str(tmp_path / "out"), algo="INT8", format="compressed-tensors", quiet=True, max_shard_size="1MB", resume=True)
    assert files(tmp_path / "out") == files(tmp_path / "ref")


@pytest.mark.parametrize("algo", ALGOS)
def test_check_predicts_what_vllm_decided(tmp_path, algo, capsys):
    """vllm_decisions.json: vLLM 0.33 parsing our configs (bench/ct_vllm_decisions.py, scratch venv)."""
    with open(os.path.join(CT_GOLDEN, "vllm_decisions.json")) as f:
        want = json.load(f)[algo]
    res = check(TINY, algo, format="compressed-tensors", json=str(tmp_path / "c.json"))
    assert res.errors == []
    doc = json.load(open(tmp_path / "c.json"))
    assert doc["format"] == "compressed-tensors"
    for prefix, decision in want.items():
        assert doc["vllm_schemes"][prefix] == decision, prefix


def test_check_int8_no_longer_warns_about_vllm(capsys):
    res = check(TINY, "INT8", format="compressed-tensors")
    assert not [f for f in res.findings if f.code == "int8-vllm"]
    assert [f for f in check(TINY, "INT8").findings if f.code == "int8-vllm"]  # ModelOpt W8A16 still does


def test_router_substring_is_no_trap_in_compressed_tensors(make_checkpoint, capsys):
    """ModelOpt's substring rule makes ``mlp.gate`` hit ``mlp.gate_up_proj``; compressed-tensors matches exactly."""
    cfg = qwen3_moe_config()
    src = make_checkpoint(qwen3_moe_tensors(cfg, seed=1), cfg, name="moe")
    res = check(src, "FP8_PB_WO", format="compressed-tensors")
    assert not [f for f in res.findings if f.code == "exclude-misread"]


# -- verify ------------------------------------------------------------------------------------------

def test_verify_ours_and_llm_compressors(tmp_path, capsys):
    ct(TINY, tmp_path / "o", "W4A16_NVFP4")
    res = verify(str(tmp_path / "o"), source=TINY)
    assert res.errors == [] and res.algo == "W4A16_NVFP4" and len(res.errors_by_tensor) == 14
    with pytest.raises(CheckFailed):  # llm-compressor quantized the embedding: vLLM cannot load that
        verify(os.path.join(CT_GOLDEN, "tiny-llama-W8A8"))
    (tmp_path / "o" / "hf_quant_config.json").write_text("{}")
    with pytest.raises(CheckFailed):
        verify(str(tmp_path / "o"))


def test_verify_finds_a_wrong_scale_shape(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    ct(TINY, tmp_path / "o", "INT8")
    path = tmp_path / "o" / "model.safetensors"
    t = load_file(path)
    t["model.layers.0.mlp.down_proj.weight_scale"] = t["model.layers.0.mlp.down_proj.weight_scale"].reshape(-1)
    save_file(t, path)
    with pytest.raises(CheckFailed):
        verify(str(tmp_path / "o"))


def test_presets_are_the_documented_table():
    assert {s.preset for s in CT_SCHEMES.values()} == set(PRESETS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_reference_equals_cpu(algo, dtype):
    """The compressed-tensors references run as torch on the GPU (no Triton kernel): same bytes as the CPU."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(384, 256, generator=g) * 0.05).to(dtype)
    w[3] = 0
    scheme = CT_SCHEMES[algo]
    cpu = scheme.quantize(w)
    gpu = scheme.quantize(w.cuda())
    for k in cpu:
        assert_same_bytes(gpu[k].cpu(), cpu[k], k)


def test_fp8_block_shapes_follow_vllm(make_checkpoint, tmp_path, capsys):
    """A ragged last member (DeepSeek kv_a_proj_with_mqa [192, 256]) is written, as vLLM allows;
    a ragged first member, or a ragged in-features, is refused with the fix."""
    cfg = deepseek_config()
    src = make_checkpoint(deepseek_tensors(cfg, seed=1), cfg, shards=2, name="ds")
    out = ct(src, tmp_path / "o", "FP8_PB_WO")
    assert out["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale"].shape == (2, 2)  # 192 rows: 2 blocks
    assert verify(str(tmp_path / "o"), source=src).errors == []
    with pytest.raises(CheckFailed):
        check(src, "FP8_PB_WO", format="compressed-tensors", tp=2, json=str(tmp_path / "tp2.json"))
    msgs = [f["message"] for f in json.load(open(tmp_path / "tp2.json"))["findings"] if f["level"] == "error"]
    assert any("column-parallel" in m for m in msgs)
    t = deepseek_tensors(cfg, seed=1)
    t["model.layers.0.self_attn.q_a_proj.weight"] = t["model.layers.0.self_attn.q_a_proj.weight"][:96].contiguous()
    bad = make_checkpoint(t, cfg, name="bad")
    with pytest.raises(CheckFailed):
        check(bad, "FP8_PB_WO", format="compressed-tensors", json=str(tmp_path / "bad.json"))
    msgs = [f["message"] for f in json.load(open(tmp_path / "bad.json"))["findings"] if f["level"] == "error"]
    assert msgs and all("q_a_proj" in m for m in msgs) and any("other than the last" in m and "--exclude" in m for m in msgs)


def test_kv_cache_scheme_is_what_vllm_accepts(tmp_path):
    """vLLM's validate_kv_cache_scheme: type float, 8 bits, strategy tensor or attn_head, symmetric."""
    ct(TINY, tmp_path / "o", "FP8_PER_CHANNEL_PER_TOKEN", kv_cache_dtype="fp8")
    kv = qconfig(tmp_path / "o")["kv_cache_scheme"]
    assert (kv["type"], kv["num_bits"], kv["strategy"], kv["symmetric"], kv["dynamic"]) == ("float", 8, "tensor", True, False)


def test_the_dry_run_plan_line_names_what_the_chosen_format_writes():
    """Noticed in session 7: `--format compressed-tensors --dry-run` said quant_algo 'W8A16' (ModelOpt's name)."""
    from click.testing import CliRunner

    from quantize_cli.cli import main

    def plan_line(*args):
        r = CliRunner().invoke(main, ["convert", "example:tiny-llama", "--dry-run", *args])
        assert r.exit_code == 0, r.output
        return next(line for line in r.output.splitlines() if line.startswith("plan: "))

    assert "INT8 (compressed-tensors preset 'W8A8')" in plan_line("--algo", "INT8", "--format", "compressed-tensors")
    assert "INT4 (compressed-tensors preset 'W4A16')" in plan_line("--algo", "INT4", "--format", "compressed-tensors")
    assert "INT8 (quant_algo 'W8A16')" in plan_line("--algo", "INT8")
