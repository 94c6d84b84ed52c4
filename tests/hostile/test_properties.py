"""Property tests (hypothesis): the exclude matcher against a reference of vLLM's rules, and
``check`` against ``convert --dry-run`` on generated checkpoints (same decision for every module)."""

from __future__ import annotations

import fnmatch
import re
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint
from quantize_cli.modules.matching import MixedFusedShards, vllm_is_excluded, vllm_rewrite

from .helpers import invoke

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


# -- a reference of vLLM 0.33's rules, written from its source (ModelOptQuantConfigBase.is_layer_excluded,
# quant_utils.is_layer_skipped in "exact" mode, apply_vllm_mapper) as a plain transcription of the rules --
def ref_excluded(prefix: str, entries: list[str], packed: dict) -> bool:
    """True/False as vLLM decides, or raises ValueError where vLLM raises."""
    if not entries:
        return False
    last = prefix.split(".")[-1]
    if last in packed:
        if prefix in entries:
            skipped = True
        else:
            answers = [prefix.replace(last, member) in entries for member in packed[last]]
            if any(answers) and not all(answers):
                raise ValueError("some but not all shards")
            skipped = answers[0]
    elif "experts" in prefix:
        skipped = any(prefix in e for e in entries if "experts" in e)
    else:
        skipped = prefix in entries
    if skipped:
        return True
    for e in entries:
        bare = prefix[len("language_model."):] if prefix.startswith("language_model.") else None
        if e != prefix and (e in prefix or (bare is not None and e in bare)):
            return True
    return any(fnmatch.fnmatch(prefix, e) for e in entries)


def ref_rewrite(entries: list[str]) -> list[str]:
    out = []
    for e in entries:
        if len(e) >= 2 and e.endswith("*") and not e.endswith(".*"):
            out += [e[:-1], e[:-1] + ".*"]
        else:
            out.append(e)
    return out


PARTS = ["model", "language_model", "layers", "0", "1", "10", "self_attn", "q_proj", "k_proj", "v_proj", "qkv_proj",
         "o_proj", "mlp", "gate_proj", "up_proj", "gate_up_proj", "down_proj", "experts", "3", "lm_head", "gate"]
names = st.lists(st.sampled_from(PARTS), min_size=1, max_size=6).map(".".join)


@st.composite
def patterns(draw):
    base = draw(names)
    how = draw(st.sampled_from(["as-is", "star", "dotstar", "lead", "slice", "qmark", "class", "brackets"]))
    if how == "star":
        return base + "*"
    if how == "dotstar":
        return base + ".*"
    if how == "lead":
        return "*" + base
    if how == "slice":
        i = draw(st.integers(0, len(base)))
        return base[i : i + draw(st.integers(1, 12))] or base
    if how == "qmark":
        i = draw(st.integers(0, len(base) - 1))
        return base[:i] + "?" + base[i + 1 :]
    if how == "class":
        return re.sub(r"\d", "[0-9]", base)
    if how == "brackets":
        return base + "["  # an unclosed class: fnmatch treats it literally
    return base


@settings(max_examples=600, deadline=None, derandomize=True)
@given(prefix=names, entries=st.lists(patterns(), max_size=4))
def test_matcher_equals_vllm_reference(prefix, entries):
    try:
        want = ref_excluded(prefix, entries, PACKED)
    except ValueError:
        want = "raises"
    try:
        got = vllm_is_excluded(prefix, entries, PACKED)
    except MixedFusedShards:
        got = "raises"
    assert got == want, (prefix, entries)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(entries=st.lists(patterns(), max_size=5))
def test_rewrite_equals_vllm_reference(entries):
    assert vllm_rewrite(entries) == ref_rewrite(entries)


# -- check and convert --dry-run agree on every module --------------------------------------------------------------
EXCLUDES = ["lm_head", "model.layers.0.*", "*q_proj", "model.layers.1", "*.mlp.*", "model.layers.0.self_attn.qkv_proj",
            "*down_proj", "model.layers.1.mlp.gate_proj", "*[0-1].self_attn.*", "model.layers.?.mlp.up_proj", "*",
            "model.embed_tokens", "gate", "*o_proj*"]
ALGOS = ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "INT8"]


def _table(text: str, header: str, stops: tuple[str, ...]) -> dict[str, str]:
    """{module: decision} from the module table of `check` or `--dry-run` output."""
    rows, inside = {}, False
    for line in text.splitlines():
        if line.startswith(header):
            inside = True
            continue
        if inside:
            if line.startswith(stops) or not line.strip():
                break
            parts = line.split()
            rows[parts[0]] = parts[1]
    return rows


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(hidden=st.sampled_from([128, 192, 256]), inter=st.sampled_from([128, 256, 320]), layers=st.integers(1, 2),
       kv=st.sampled_from([1, 2]), tied=st.booleans(), algo=st.sampled_from(ALGOS),
       exclude=st.lists(st.sampled_from(EXCLUDES), max_size=3, unique=True))
def test_check_and_dry_run_agree_on_every_module(hidden, inter, layers, kv, tied, algo, exclude):
    cfg = llama_config(hidden=hidden, intermediate=inter, layers=layers, heads=2, kv_heads=kv, vocab=256)
    t = llama_tensors(cfg, seed=0)
    if tied:
        t.pop("lm_head.weight", None)
        cfg = dict(cfg, tie_word_embeddings=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = write_checkpoint(f"{tmp}/src", t, cfg)
        ex = [a for p in exclude for a in ("--exclude", p)]
        chk = invoke("check", src, "--algo", algo, *ex)
        dry = invoke("convert", src, "--algo", algo, "--dry-run", *ex)
    assert chk.exit_code in (0, 1) and dry.exit_code in (0, 1), (chk.output, dry.output)
    checked = _table(chk.stdout, "module ", ("patterns:", "exclude_modules"))
    planned = _table(dry.stdout, "module ", ("fused groups", "exclude_modules", "totals", "warning", "problem"))
    assert checked, chk.output
    for module, decision in checked.items():
        assert planned.get(module) == decision, (module, decision, planned.get(module))
    assert {m for m, d in planned.items() if d != "keep"} == {m for m, d in checked.items() if d != "keep"}
    written = [ln for ln in chk.stdout.splitlines() if ln.startswith("exclude_modules to write")]
    listed = [ln for ln in dry.stdout.splitlines() if ln.startswith("exclude_modules (")]
    assert written[0].split(": ", 1)[1] == listed[0].split(": ", 1)[1]
    # a plan convert refuses is never one check passes
    assert not (dry.exit_code == 1 and chk.exit_code == 0), (dry.output, chk.output)
