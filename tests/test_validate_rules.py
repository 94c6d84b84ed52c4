"""Structured problems: rule ids that code branches on, and validate.py turning them into findings."""

import pytest

from quantize_cli import layouts
from quantize_cli.algorithms import ALGOS
from quantize_cli.problems import LAYOUT_NO_BYTES_MOVE, LAYOUT_UNSUPPORTED, Problem
from quantize_cli.plan.validate import layout_request
from quantize_cli.problems import ERROR, Finding


@pytest.mark.parametrize("layout", ["marlin", "cutlass", "flashinfer"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("moe", [False, True])
def test_layout_support_has_a_rule_and_the_message_supported_gives(layout, algo, moe):
    p = layouts.support(layout, algo, moe)
    assert (p.message if p else None) == layouts.supported(layout, algo, moe)
    if p is not None:
        assert p.rule in (LAYOUT_NO_BYTES_MOVE, LAYOUT_UNSUPPORTED)
        assert (p.rule == LAYOUT_NO_BYTES_MOVE) == p.message.startswith("no bytes move")


def test_layout_request_decides_on_the_rule():
    # CUTLASS FP8 dense moves no bytes but its MoE stacks are packed: accepted, dense written plain.
    assert layout_request("cutlass", "FP8", None) == (None, False)
    assert layout_request("cutlass", "NVFP4", None) == (None, True)
    # One rule for every algorithm whose dense kernel reads the plain bytes (issue 26): INT8 and
    # per-channel FP8 have no CUTLASS MoE kernel, yet their dense Linears are written plain as FP8's are.
    assert layout_request("cutlass", "INT8", None) == (None, False)
    assert layout_request("cutlass", "FP8_PER_CHANNEL_PER_TOKEN", None) == (None, False)
    assert layout_request("flashinfer", "FP8_PB_WO", None) == (None, False)
    refusal, dense = layout_request("flashinfer", "INT8", None)  # no kernel at all
    assert refusal.level == ERROR and refusal.code == "layout" and "no INT8 GEMM" in refusal.message and not dense
    refusal, _ = layout_request("marlin", "FP8", "config.json has no torch_dtype")
    assert refusal.message == "--layout marlin: config.json has no torch_dtype"


def test_finding_of_a_problem_keeps_rule_subject_and_message():
    f = Finding.of(ERROR, Problem("exclude-misread", "model.layers.0.mlp.gate", "model.layers.0.mlp.gate: ..."))
    assert f == Finding(ERROR, "exclude-misread", "model.layers.0.mlp.gate", "model.layers.0.mlp.gate: ...")


def test_expert_split_problems_name_the_tensor(tmp_path):
    from quantize_cli.checkpoint.safetensors_io import TensorInfo
    from quantize_cli.modules.experts import expand
    from quantize_cli.modules.recipe import load_recipe

    t = TensorInfo("model.layers.0.mlp.experts.gate_up_proj", "BF16", (4, 6, 8), "x", 0, 4 * 6 * 8 * 2)
    _, problems = expand({t.name: t}, load_recipe("llama", "llama"), lambda m: False)
    assert [(p.rule, p.subject) for p in problems] == [("expert-layout", t.name)]
    assert "does not declare" in problems[0].message


def test_report_does_not_import_plan():
    """The plan -> report dependency runs one way (plan.to_text renders through report)."""
    import subprocess
    import sys

    code = "import sys, quantize_cli.output.report; print('quantize_cli.plan.build' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == ["False"]


def test_compressed_tensors_block_rows_per_rank_are_a_shape_error(make_checkpoint):
    """formats/block_shapes.py computes the fact (a Problem); validate.py makes it an error finding."""
    from quantize_cli.checkpoint.source import open_source
    from quantize_cli.formats import COMPRESSED_TENSORS
    from quantize_cli.plan.build import build_plan
    from quantize_cli.modules.recipe import load_recipe
    from quantize_cli.schemes import get_scheme
    from tests.families import build, dense

    cfg, shapes = dense("llama")
    src = open_source(make_checkpoint(build(shapes), cfg))
    scheme = COMPRESSED_TENSORS.scheme(get_scheme("FP8_PB_WO").algo)
    ok = build_plan(src, scheme, load_recipe(None, "llama"), tp=2, fmt=COMPRESSED_TENSORS)
    assert not [f for f in ok.findings if f.level == ERROR]
    bad = build_plan(src, scheme, load_recipe(None, "llama"), tp=4, fmt=COMPRESSED_TENSORS)  # q_proj 256 rows -> 64 per rank
    rows = [f for f in bad.findings if f.level == ERROR and "FP8_BLOCK needs out-features" in f.message]
    assert {f.subject for f in rows} == {f"model.layers.{n}.self_attn.q_proj" for n in range(2)}
    assert all(f.code == "shape" and "multiples of 128 for --tp 4 column-parallel part" in f.message for f in rows)
