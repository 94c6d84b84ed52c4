"""Reading a converted output back, independently of the converter: what its bytes hold, what its
config files, model card and report claim, and what the options ask for.

Nothing here imports the converter's tables: the per-module algorithm is read from the tensors
themselves (which leaves exist, their dtypes and shapes), the expected activation scales are
computed by hand from SCALES.json (amax / 448 for FP8, amax / (6 * 448) for NVFP4, the max over a
fused group; design.md §4.5), so a table that is wrong in the converter cannot also be wrong here.
Every ``check_*`` function appends human-readable problems to a list instead of stopping at the
first, so one failing cell reports everything it got wrong.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field

import torch

from tests.conftest import load_all

STATIC = {"FP8": 448.0, "NVFP4": 6.0 * 448.0}  # algorithms with a static input scale: amax / this
CONSTANT = {"FP8": 1.0, "NVFP4": 1.0 / 6.0}  # the calibration-free input scale (activation amax 448)
FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
CT = "compressed-tensors"
PACKED_SUFFIXES = ("_marlin", "_cutlass", "_flashinfer")  # a packed layout's tensors: <name>_<layout>


@dataclass
class Output:
    """A finished output folder as files: tensors, configs, card, index."""

    folder: str
    tensors: dict
    config: dict
    hqc: dict | None
    card: str
    index: dict | None
    names: set = field(default_factory=set)

    @classmethod
    def read(cls, folder: str) -> "Output":
        def doc(name):
            path = os.path.join(folder, name)
            return json.load(open(path)) if os.path.isfile(path) else None

        card = os.path.join(folder, "README.md")
        return cls(folder, load_all(folder), doc("config.json") or {}, doc("hf_quant_config.json"),
                   open(card, encoding="utf-8").read() if os.path.isfile(card) else "", doc("model.safetensors.index.json"),
                   set(os.listdir(folder)))


def linear_modules(layers: int = 2) -> list[str]:
    """The quantizable Linears of example:tiny-llama (lm_head is kept by the llama recipe)."""
    return [f"model.layers.{i}.{m}" for i in range(layers) for m in LINEARS]


def expected_algos(algo: str, rule: str | None, layers: int = 2) -> dict[str, str]:
    """Module -> algorithm the options ask for (``--algo`` and one ``--algo-for PATTERN=ALGO``, fnmatch)."""
    pattern, _, other = (rule or "").partition("=")
    return {m: other if rule and fnmatch.fnmatchcase(m, pattern) else algo for m in linear_modules(layers)}


# -- the bytes ----------------------------------------------------------------------------------------------
def leaves(tensors: dict) -> dict[str, dict]:
    """Module -> {leaf: tensor}."""
    out: dict[str, dict] = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        out.setdefault(module, {})[leaf] = t
    return out


def algo_in_bytes(parts: dict) -> str | None:
    """The algorithm a module's tensors encode (either format, plain or Marlin), None when unquantized."""
    if "weight_scale_2" in parts or "weight_global_scale" in parts:
        return "NVFP4"
    scale = parts.get("weight_scale")
    if scale is None:
        return None
    return "FP8" if scale.numel() == 1 else "FP8_PB_WO"


def algos_in_bytes(out: Output) -> dict[str, str]:
    return {m: a for m, parts in leaves(out.tensors).items() if (a := algo_in_bytes(parts))}


def input_scales(out: Output, fmt: str) -> dict[str, float]:
    """Module -> static input scale in ModelOpt's sense (CT NVFP4 stores its reciprocal, input_global_scale)."""
    got = {}
    for m, parts in leaves(out.tensors).items():
        if "input_scale" in parts:
            got[m] = float(parts["input_scale"].float().reshape(-1)[0])
        elif "input_global_scale" in parts:
            got[m] = 1.0 / float(parts["input_global_scale"].reshape(-1)[0])
    return got


def kv_scales(out: Output) -> dict[str, float]:
    """``...k_proj.k_scale`` / ``...v_proj.v_scale`` -> value."""
    return {n: float(t.float().reshape(-1)[0]) for n, t in out.tensors.items() if n.endswith((".k_scale", ".v_scale"))}


def expected_input_scale(module: str, algo: str, amax: dict[str, float] | None) -> float:
    """ModelOpt's input_scale for `module`: the constant, or fp32(group amax) / (448 | 2688) in fp32."""
    if amax is None:
        return float(torch.tensor(CONSTANT[algo], dtype=torch.float32))
    prefix, _, leaf = module.rpartition(".")
    group = [f"{prefix}.{m}" for m in FUSED if FUSED[m] == FUSED[leaf]] if leaf in FUSED else [module]
    a = max(amax[m] for m in group)  # a fused group shares one scale: the max over its members (design §5)
    return float(torch.tensor(a, dtype=torch.float32) / torch.tensor(STATIC[algo], dtype=torch.float32))


def close(got: float, want: float, fmt: str) -> bool:
    """Exact for ModelOpt (fp32 written as computed); bf16-close for compressed-tensors' FP8 scales."""
    if fmt == CT:
        return abs(got - want) <= 2 ** -7 * abs(want)
    return got == want


def straddling_groups(out: Output) -> list[str]:
    """Fused groups (q/k/v, gate/up) whose members' weights sit in different output shards (from the index)."""
    if not out.index:
        return []
    where: dict[tuple, set] = {}
    for name, shard in out.index["weight_map"].items():
        module, _, leaf = name.rpartition(".")
        prefix, _, member = module.rpartition(".")
        if member in FUSED and leaf.startswith("weight"):
            where.setdefault((prefix, FUSED[member]), set()).add(shard)
    return sorted(f"{p}.{g}" for (p, g), shards in where.items() if len(shards) > 1)


# -- the documents --------------------------------------------------------------------------------------
def algos_in_config(out: Output, fmt: str) -> dict[str, str]:
    """Module -> algorithm as config.json (and hf_quant_config.json) tell a loader."""
    q = out.config.get("quantization_config") or {}
    mods = linear_modules()
    if fmt == CT:
        groups = q.get("config_groups") or {}

        def group_of(m):
            exact = [g for g in groups.values() if m in g.get("targets", [])]
            return (exact or [g for g in groups.values() if "Linear" in g.get("targets", [])] or [None])[0]

        def algo(g):
            w = (g or {}).get("weights") or {}
            return {4: "NVFP4"}.get(w.get("num_bits")) or {"block": "FP8_PB_WO", "tensor": "FP8"}.get(w.get("strategy"))

        return {m: algo(group_of(m)) for m in mods if m not in q.get("ignore", [])}
    nested = (out.hqc or {}).get("quantization") or {}
    if nested.get("quant_algo") == "MIXED_PRECISION":
        return {m: str(v.get("quant_algo")).upper() for m, v in (nested.get("quantized_layers") or {}).items()}
    return {m: str(nested.get("quant_algo")).upper() for m in mods if m not in nested.get("exclude_modules", [])}


def check_config(out: Output, fmt: str, kv: bool, layout: str, calibrated: bool, problems: list) -> None:
    """config.json / hf_quant_config.json against the bytes: per-module algorithm, KV cache, layout, calibration record."""
    q = out.config.get("quantization_config") or {}
    in_bytes = algos_in_bytes(out)
    said = algos_in_config(out, fmt)
    if said != in_bytes:
        diff = {m: (said.get(m), in_bytes.get(m)) for m in set(said) | set(in_bytes) if said.get(m) != in_bytes.get(m)}
        problems.append(f"config: per-module algorithm (config, bytes) differs: {dict(sorted(diff.items())[:4])}")
    if fmt == CT:
        if q.get("quant_method") != CT or out.hqc is not None:
            problems.append(f"config: compressed-tensors output has quant_method {q.get('quant_method')!r}, hf_quant_config.json {out.hqc is not None}")
        if ("kv_cache_scheme" in q and q["kv_cache_scheme"] is not None) != kv:
            problems.append(f"config: kv_cache_scheme is {q.get('kv_cache_scheme')!r} with --kv-cache-dtype {'fp8' if kv else '(none)'}")
        return
    nested = (out.hqc or {}).get("quantization") or {}
    if q.get("quant_method") != "modelopt" or q.get("quant_algo") != nested.get("quant_algo"):
        problems.append(f"config: config.json says {q.get('quant_method')}/{q.get('quant_algo')}, hf_quant_config.json {nested.get('quant_algo')}")
    if nested.get("kv_cache_quant_algo") != ("FP8" if kv else None) or ("kv_cache_scheme" in q) != kv:
        problems.append(f"config: KV cache {nested.get('kv_cache_quant_algo')!r} / kv_cache_scheme {q.get('kv_cache_scheme')!r} "
                        f"with --kv-cache-dtype {'fp8' if kv else '(none)'}")
    record = ((out.hqc or {}).get("converter") or {}).get("calibration")  # what `verify` reads back: which scales are calibrated
    if (input_scales(out, fmt) or kv_scales(out)) and calibrated != bool(isinstance(record, dict) and record.get("calibrated")):
        problems.append(f"config: hf_quant_config.json records calibration {str(record)[:80]!r}, the run was {'' if calibrated else 'not '}calibrated")
    packed = sorted({n.rpartition("_")[2] for n in out.tensors if n.endswith(PACKED_SUFFIXES)})  # the layouts the bytes are in
    if ((q.get("layout") or {}).get("name", "plain") != layout) or packed != ([layout] if layout != "plain" else []):
        problems.append(f"config: layout {q.get('layout', {}).get('name', 'plain')!r}, packed tensors of {packed}, written layout {layout}")


def check_scales(out: Output, fmt: str, want_algos: dict, amax: dict | None, kv_amax: dict | None, kv: bool, problems: list) -> None:
    """Static input scales and KV scales in the bytes against the hand-computed expectation."""
    got = input_scales(out, fmt)
    static = {m for m, a in want_algos.items() if a in STATIC}
    if set(got) != static:
        problems.append(f"scales: input scales on {sorted(set(got) ^ static)[:3]}... (static modules: {len(static)}, with a scale: {len(got)})")
    for m in sorted(static & set(got)):
        want = expected_input_scale(m, want_algos[m], amax)
        if not close(got[m], want, fmt):
            problems.append(f"scales: {m} input scale {got[m]:.6g}, want {want:.6g} ({'calibrated' if amax else 'the constant'})")
            break
    kvs = kv_scales(out)
    if kv and kv_amax:
        want_kv = {f"{attn}.k_proj.k_scale": e["k_amax"] for attn, e in kv_amax.items()}
        want_kv |= {f"{attn}.v_proj.v_scale": e["v_amax"] for attn, e in kv_amax.items()}
        want_kv = {n: float(torch.tensor(a, dtype=torch.float32) / 448.0) for n, a in want_kv.items()}
        if kvs != want_kv:
            problems.append(f"scales: KV scales {dict(list(kvs.items())[:2])} ..., want the calibrated {dict(list(want_kv.items())[:2])} ...")
    elif kvs:
        problems.append(f"scales: KV scale tensors without calibrated KV amax: {sorted(kvs)[:2]}")


# -- the card -------------------------------------------------------------------------------------------
def card_rows(card: str) -> dict[str, list[str]]:
    """``| key | value |`` rows of the card's table, key -> values."""
    rows: dict[str, list[str]] = {}
    for line in card.splitlines():
        m = re.match(r"^\| (algorithm|format|layout|KV cache|size) \| (.*) \|$", line)
        if m:
            rows.setdefault(m.group(1), []).append(m.group(2))
    return rows


def card_command(card: str) -> list[str]:
    m = re.search(r"## How it was made\s+```bash\n(.*?)\n```", card, re.S)
    return shlex.split(m.group(1)) if m else []


def flags_of(argv: list[str]) -> dict[str, list[str]]:
    """``--flag value`` pairs of a command line (repeatable flags keep every value; switches map to [])."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.setdefault(a, []).append(argv[i + 1])
                i += 2
                continue
            out.setdefault(a, [])
        i += 1
    return out


def section(card: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |^<!--)", card, re.S | re.M)
    return m.group(1).strip() if m else ""


def check_card(out: Output, fmt: str, kv: bool, layout: str, calibrated: bool, wanted_flags: dict, problems: list) -> None:
    """The model card against the bytes: algorithms and counts, format, layout, KV, calibration, command line."""
    card = out.card
    if not card:
        problems.append("card: README.md missing")
        return
    rows = card_rows(card)
    in_bytes = Counter(algos_in_bytes(out).values())
    said = Counter()
    for row in rows.get("algorithm", []):
        m = re.match(r"`(\w+)` on (\d+) Linear", row)
        if m:
            said[m.group(1)] = int(m.group(2))
    if said != in_bytes:
        problems.append(f"card: algorithms {dict(said)}, bytes {dict(in_bytes)}")
    fmt_row = (rows.get("format") or [""])[0]
    # the name hf_quant_config.json holds (FP8_PB_WO is written fp8_pb_wo), MIXED_PRECISION for a mix
    quant_algo = "MIXED_PRECISION" if len(in_bytes) > 1 else ((out.hqc or {}).get("quantization") or {}).get("quant_algo")
    if not (fmt_row.startswith(f"{fmt} (") and (fmt == CT or f"`quant_algo: {quant_algo}`" in fmt_row)):
        problems.append(f"card: format row {fmt_row!r} (bytes: {fmt}, {quant_algo})")
    if (rows.get("layout") or [""])[0].split(" ")[0] != layout:
        problems.append(f"card: layout row {rows.get('layout')} for --layout {layout}")
    kv_row = (rows.get("KV cache") or [""])[0]
    if kv != kv_row.startswith("FP8") or (kv_scales(out) and "no scales" in kv_row):
        problems.append(f"card: KV cache row {kv_row!r} (--kv-cache-dtype {'fp8' if kv else '(none)'}, KV scale tensors: {len(kv_scales(out))})")
    cal = section(card, "Calibration")
    static = input_scales(out, fmt)
    if static and calibrated and not cal.startswith("Calibrated on"):
        problems.append(f"card: calibration says {cal[:90]!r} but the input scales are calibrated")
    elif static and not calibrated:
        # one value ("every `input_scale` is 1") or one per algorithm ("... of each layer is its algorithm's constant, 1 (FP8) or ...")
        m = re.search(r"`input_scale`(?: of each layer)? is (?:its algorithm's constant, )?(.*?), the calibration-free", cal, re.S)
        said = [float(x) for x in re.findall(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", m.group(1))] if m else []
        values = sorted(set(static.values()))
        if not said or any(min(abs(x - v) for x in said) > 1e-5 * v for v in values):
            problems.append(f"card: calibration says {cal[:90]!r}; the bytes hold input scales {[f'{v:.6g}' for v in values]}")
    elif not static and not kv_scales(out) and not cal.startswith("None needed"):
        problems.append(f"card: calibration says {cal[:90]!r}; the bytes hold no static activation scale")
    flags = flags_of(card_command(card))
    for flag, want in wanted_flags.items():
        if flags.get(flag, []) != want:
            problems.append(f"card: its command line has {flag} {flags.get(flag)}, the run used {want}")
    if layout == "plain" and ("no stock loader" in card or "serve None" in card):
        problems.append("card: serve lines name no loader: " + next(ln for ln in card.splitlines() if "no stock loader" in ln))


def serve_block(card: str) -> str:
    m = re.search(r"## Serve it\s+```bash\n(.*?)\n```", card, re.S)
    return m.group(1) if m else ""


def check_serve_lines(card: str, where: str, kv: bool, layout: str, problems: list) -> None:
    """The card's serve lines point at `where` and keep the KV flag (what a push rewrites)."""
    block = serve_block(card)
    if layout != "plain":
        if "quantize unpack" not in block:
            problems.append(f"card: packed layout without the unpack line: {block!r}")
        return
    vllm = [ln for ln in block.splitlines() if ln.startswith("vllm serve ")]
    where = where if "/" in where and not os.path.isabs(where) else f"./{os.path.basename(where)}"  # never a local path
    if not vllm or where not in vllm[0]:
        problems.append(f"card: no `vllm serve {where}` line: {block!r}")
    elif kv != ("--kv-cache-dtype fp8" in vllm[0]):
        problems.append(f"card: serve line {vllm[0]!r} with --kv-cache-dtype {'fp8' if kv else '(none)'}")
