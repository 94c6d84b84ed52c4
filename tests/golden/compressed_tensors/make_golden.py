"""Generator of the compressed-tensors golden outputs (run by hand; never imported by the tests).

Runs llm-compressor's ``model_free_ptq`` (llmcompressor 0.14.0.1, compressed-tensors 0.19.0,
torch 2.13.0 CPU) with ``device="cpu"`` and ``ignore=["lm_head"]`` on

* ``tests/golden/checkpoints/tiny-llama`` (the shared golden model) -> ``tiny-llama-<PRESET>/``
* ``edge/`` (written here, seed 0): one Linear per edge case -> ``edge-<PRESET>/``

for the presets FP8_BLOCK, FP8_DYNAMIC, W8A8, NVFP4A16 and MXFP8 (edge FP8_BLOCK also ignores the
[200, 96] ``model.layers.0.mlp.down_proj``, on which llm-compressor crashes), and two mixed-precision
configs (several config groups, the ``Linear`` group last, as ``quantize --algo-for`` writes them):

* ``tiny-llama-mixed/``: NVFP4A16 for every Linear, FP8_BLOCK for the attention projections
  (``--algo W4A16_NVFP4 --algo-for 'self_attn*=FP8_PB_WO'``);
* ``moe-mixed/``: the Qwen3-MoE of ``quantize_cli.example.qwen3_moe_tensors`` (MOE_CONFIG, seed
  5, rebuilt here and by the test), FP8_BLOCK for the dense Linears, NVFP4A16 for the experts
  (``--algo FP8_PB_WO --algo-for '*experts*=W4A16_NVFP4'``; the experts as one ``re:`` target per
  MoE layer), ignoring lm_head and the routers.

Then it drops the copied bf16 tensors
that equal the source byte for byte (lm_head, norms: checked before dropping) to keep the files
small, and removes the tokenizer/generation sidecars. Usage, from the repository root:

    /root/llmc-venv/bin/python tests/golden/compressed_tensors/make_golden.py [PRESET|mixed ...]

(no argument: everything; e.g. ``MXFP8 mixed`` regenerates only those; ``W4A16 W4A16_ASYM`` the INT4
presets on ``tiny-llama`` and ``int4-edge/``, whose weights have K in whole 128-groups).
"""

import glob
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "..", "checkpoints", "tiny-llama")
PRESETS = ["FP8_BLOCK", "FP8_DYNAMIC", "W8A8", "NVFP4A16", "MXFP8"]
INT4_PRESETS = ["W4A16", "W4A16_ASYM"]  # run on tiny-llama and int4-edge (K in whole 128-groups), not edge
MOE_CONFIG = dict(hidden=256, moe_intermediate=64, experts=2, layers=1, vocab=64)  # quantize_cli.example.qwen3_moe_config
MOE_SEED = 5


def edge_tensors() -> dict:
    """Edge cases: zero rows / blocks / groups, a group whose NVFP4 scale underflows e4m3, -0.0,
    E2M1 and int8 rounding ties, a non-128 shape, and fp16 / fp32 weights (scales follow the dtype)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 96, generator=g) * 0.05
    w[3] = 0.0  # an all-zero row
    w[5] = -0.0  # negative zeros
    w[7, :16] = 1e-30  # a group far below every other (scale underflows, int8/fp8 codes 0)
    w[9] = torch.linspace(-1, 1, 96)  # evenly spaced: many exact ties after scaling
    w[130:, 16:32] = 0.0  # zero NVFP4 groups
    big = torch.randn(256, 256, generator=g) * 0.02
    big[:128, :128] = 0.0  # an all-zero 128x128 block
    big[128:, 128:] *= 100.0  # a block with a very different scale
    return {
        "model.layers.0.mlp.down_proj.weight": w.to(torch.bfloat16),
        "model.layers.0.self_attn.o_proj.weight": big.to(torch.bfloat16),
        "model.layers.0.mlp.fp16_proj.weight": (torch.randn(64, 128, generator=g) * 3).to(torch.float16),
        "model.layers.0.mlp.fp32_proj.weight": torch.randn(64, 128, generator=g) * 1e-3,
        "model.norm.weight": torch.ones(256, dtype=torch.bfloat16),
        "lm_head.weight": (torch.randn(64, 256, generator=g) * 0.02).to(torch.bfloat16),
    }


def mx_edge_tensors() -> dict:
    """MXFP8 exponent edge cases, one 32-group each (row 0 of each weight), in bf16 / fp16 / fp32:
    a zero group, an amax of exactly 1.75 * 2^e (compressed-tensors rounds up, ModelOpt does not),
    just below it, sub-normal amaxes, fp16 amaxes whose scale underflows fp16 (becomes 1.0), and
    values far apart inside one group."""
    g = torch.Generator().manual_seed(1)
    out = {}
    cases = {
        torch.bfloat16: [0.0, 0.0546875, 0.0544, 1e-38, 3e-39, 1e30, 448.0 * 4],
        torch.float16: [0.0, 0.0546875, 1e-6, 3e-5, 60000.0, 1.75],
        torch.float32: [0.0, 1.75 * 2.0**-20, 1e-40, 1e-30, 3e35, 0.0546875 * (1 + 2**-23)],
    }
    for i, (dtype, amaxes) in enumerate(cases.items()):
        w = torch.randn(64, 32 * len(amaxes) + 64, generator=g) * 0.02
        for j, a in enumerate(amaxes):
            grp = torch.rand(32, generator=g) * 2 - 1
            grp = grp / grp.abs().max() * a if a else grp * 0
            grp[5] = -a  # the amax itself, negative
            w[0, 32 * j: 32 * (j + 1)] = grp
        w[1, :32] = -0.0
        w[2, :32] = torch.tensor([1e-3] * 31 + [100.0])
        out[f"model.layers.0.mlp.mx{i}_proj.weight"] = w.to(dtype)
    out["lm_head.weight"] = (torch.randn(64, 128, generator=g) * 0.02).to(torch.bfloat16)
    return out


def int4_edge_tensors() -> dict:
    """INT4 (group 128) edge cases in bf16 / fp16 / fp32: an all-zero row and group, -0.0, groups
    whose scale underflows the dtype (eps), evenly spaced values (rounding ties after the bf16
    quotient), all-positive / all-negative / constant groups (the asymmetric zero point at both
    clamps), one outlier dwarfing its group, and groups of very different magnitudes."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(256, 384, generator=g) * 0.05
    w *= torch.exp2(torch.randint(-8, 3, (256, 3), generator=g).float()).repeat_interleave(128, dim=1)
    w[3] = 0.0  # all-zero row
    w[5] = -0.0
    w[7, :128] = 1e-38  # scale under bf16's smallest normal / 7.5: eps
    w[9] = torch.linspace(-1, 1, 384)
    w[11, :128] = torch.rand(128, generator=g) + 0.5  # all positive: lo = 0, zero point -8
    w[11, 128:256] = -torch.rand(128, generator=g) - 0.5  # all negative: zero point 7
    w[11, 256:] = 0.25  # constant
    w[13, 5] = 40.0  # one outlier
    w[15, :128] = 0.0  # an all-zero group
    return {
        "model.layers.0.mlp.down_proj.weight": w.to(torch.bfloat16),
        "model.layers.0.self_attn.o_proj.weight": (torch.randn(128, 256, generator=g) * 0.02).to(torch.bfloat16),
        "model.layers.0.mlp.fp16_proj.weight": (torch.randn(64, 128, generator=g) * 3).to(torch.float16),
        "model.layers.0.mlp.fp32_proj.weight": torch.randn(64, 128, generator=g) * 1e-3,
        "model.norm.weight": torch.ones(256, dtype=torch.bfloat16),
        "lm_head.weight": (torch.randn(64, 256, generator=g) * 0.02).to(torch.bfloat16),
    }


def write_int4_edge(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    save_file(int4_edge_tensors(), os.path.join(folder, "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 64}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def write_mx_edge(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    save_file(mx_edge_tensors(), os.path.join(folder, "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 64}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def write_edge(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    save_file(edge_tensors(), os.path.join(folder, "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 64}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def mixed_config(groups: dict, ignore):
    """A compressed-tensors QuantizationConfig with one group per preset: {preset: targets}, in order."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    return QuantizationConfig(config_groups={p: preset_name_to_scheme(p, list(t)) for p, t in groups.items()},
                              ignore=list(ignore))


def source_names(src: str) -> list[str]:
    names = []
    for f in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        names += [n[: -len(".weight")] for n in load_file(f) if n.endswith(".weight")]
    return sorted(names)  # quantize writes a group's exact targets sorted


def write_moe(folder: str) -> None:
    """The Qwen3-MoE source of moe-mixed (not kept: the test rebuilds it from quantize_cli.example)."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))
    from quantize_cli.example import qwen3_moe_config, qwen3_moe_tensors

    cfg = qwen3_moe_config(**MOE_CONFIG)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    save_file(qwen3_moe_tensors(cfg, seed=MOE_SEED), os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def run(src: str, dst: str, preset, ignore=("lm_head",)) -> None:
    """`preset`: a preset name, or a QuantizationConfig (mixed precision; `ignore` is then unused)."""
    from llmcompressor import model_free_ptq

    shutil.rmtree(dst, ignore_errors=True)
    if isinstance(preset, str):
        model_free_ptq(src, dst, scheme=preset, ignore=list(ignore), max_workers=1, device="cpu")
    else:
        model_free_ptq(src, dst, config=preset, max_workers=1, device="cpu")
    source = {}
    for f in glob.glob(os.path.join(src, "*.safetensors")):
        source.update(load_file(f))
    for f in glob.glob(os.path.join(dst, "*.safetensors")):
        tensors = load_file(f)
        kept = {}
        for name, t in tensors.items():
            s = source.get(name)
            if s is not None and s.dtype == t.dtype and torch.equal(s.view(torch.uint8), t.view(torch.uint8)):
                continue  # a byte-identical copy of the source: not needed as golden data
            kept[name] = t
        save_file(kept, f)
    for name in os.listdir(dst):
        if name not in ("config.json", "model.safetensors.index.json") and not name.endswith(".safetensors"):
            os.remove(os.path.join(dst, name))


def run_mixed() -> None:
    attn = [n for n in source_names(TINY) if ".self_attn." in n and n.endswith("_proj")]
    run(TINY, os.path.join(HERE, "tiny-llama-mixed"), mixed_config({"FP8_BLOCK": attn, "NVFP4A16": ["Linear"]}, ["lm_head"]))
    moe = os.path.join("/tmp", "ct-golden-moe-src")
    write_moe(moe)
    names = source_names(moe)
    assert any(".mlp.experts." in n for n in names)
    experts = [r"re:model\.layers\.0\.mlp\.experts\.\d+\.(?:down_proj|gate_proj|up_proj)$"]  # one per MoE layer, as quantize writes it
    routers = [n for n in names if n.endswith(".mlp.gate")]
    run(moe, os.path.join(HERE, "moe-mixed"), mixed_config({"NVFP4A16": experts, "FP8_BLOCK": ["Linear"]}, ["lm_head"] + routers))


def main() -> None:
    wanted = sys.argv[1:] or PRESETS + INT4_PRESETS + ["mixed"]
    edge = os.path.join(HERE, "edge")
    if not os.path.exists(edge):
        write_edge(edge)
    for preset in [p for p in PRESETS if p in wanted]:
        run(TINY, os.path.join(HERE, f"tiny-llama-{preset}"), preset)
        # FP8_BLOCK of the [200, 96] weight crashes llm-compressor 0.14 (its cropped weight is not
        # contiguous and safetensors refuses to save it): that weight is ignored for FP8_BLOCK.
        extra = ("model.layers.0.mlp.down_proj",) if preset == "FP8_BLOCK" else ()
        run(edge, os.path.join(HERE, f"edge-{preset}"), preset, ("lm_head",) + extra)
    if "MXFP8" in wanted:
        mx_edge = os.path.join(HERE, "mx-edge")
        write_mx_edge(mx_edge)
        run(mx_edge, os.path.join(HERE, "mx-edge-MXFP8"), "MXFP8")
    for preset in [p for p in INT4_PRESETS if p in wanted]:
        int4_edge = os.path.join(HERE, "int4-edge")
        write_int4_edge(int4_edge)
        run(TINY, os.path.join(HERE, f"tiny-llama-{preset}"), preset)
        run(int4_edge, os.path.join(HERE, f"int4-edge-{preset}"), preset)
    if "mixed" in wanted:
        run_mixed()
    import compressed_tensors
    import llmcompressor

    print("made with llmcompressor", llmcompressor.__version__, "compressed-tensors", compressed_tensors.__version__,
          "torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
