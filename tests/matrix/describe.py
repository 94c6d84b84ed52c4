"""Reading a converted output back, independently of the converter: what its bytes hold, what its
config files, model card and report claim, and what the options ask for.

Nothing here imports the converter's tables: the per-module algorithm is read from the tensors
themselves (which leaves exist, their dtypes and shapes; every algorithm of both formats), the
Linears of a model from its source's safetensors headers (dense or MoE), the expected activation
scales are computed by hand from SCALES.json (amax / 448 for FP8, amax / (6 * 448) for NVFP4, the max
over a fused group; design.md §4.5) and each algorithm's tensor shapes from the source's (group
sizes as the formats' documents state them), so a table that is wrong in the converter cannot also
be wrong here.
Every ``check_*`` function appends human-readable problems to a list instead of stopping at the
first, so one failing cell reports everything it got wrong.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shlex
import struct
from collections import Counter
from dataclasses import dataclass, field

import torch

from tests.conftest import load_all, output_files, same_bytes

STATIC = {"FP8": 448.0, "NVFP4": 6.0 * 448.0}  # algorithms with a static input scale: amax / this
CONSTANT = {"FP8": 1.0, "NVFP4": 1.0 / 6.0}  # the calibration-free input scale (activation amax 448)
# fused members share one scale (vLLM's fused layers): q/k/v and gate/up, per layer and per expert
FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
FUSED_NAMES = {"qkv": "qkv_proj", "gate_up": "gate_up_proj"}  # vLLM's module names for the fused groups
SHARED_GLOBAL = {"FP8": "weight_scale", "NVFP4": ("weight_scale_2", "weight_global_scale"),
                 "W4A16_NVFP4": ("weight_scale_2", "weight_global_scale")}  # the per-tensor scale a fused group shares
NOT_QUANTIZED = ("embed_tokens", "lm_head")  # 2-D weights that are not quantizable Linears
ROUTERS = (".mlp.gate", ".router")  # MoE routers: every engine keeps them in 16 bits (like embeddings and norms)
MODELOPT_NAMES = {"W4A16_AWQ": "INT4", "W8A16": "INT8"}  # ModelOpt's quant_algo names that are not the --algo names
CT = "compressed-tensors"
PACKED_SUFFIXES = ("_marlin", "_cutlass", "_flashinfer")  # a packed layout's tensors: <name>_<layout>
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


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


@functools.lru_cache(maxsize=None)
def source_weights(source: str = "tiny-llama") -> dict[str, tuple[str, tuple]]:
    """Module -> (dtype, shape) of every 2-D ``.weight`` in an example's safetensors headers (read here, not
    through the converter)."""
    from quantize_cli.checkpoint.examples import example_path

    folder, out = example_path(source), {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with open(os.path.join(folder, name), "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            out |= {k[: -len(".weight")]: (v["dtype"], tuple(v["shape"])) for k, v in header.items()
                    if k.endswith(".weight") and len(v.get("shape", ())) == 2}
    return out


def linear_modules(source: str = "tiny-llama") -> list[str]:
    """The quantizable Linears of an example, from its headers: every 2-D weight but the embeddings, the output
    head and MoE routers (per-expert Linears of an MoE model included)."""
    return sorted(m for m in source_weights(source) if not m.endswith(NOT_QUANTIZED) and not m.endswith(ROUTERS))


def expected_algos(algo: str, rule: str | None, source: str = "tiny-llama", exclude: str | None = None) -> dict[str, str]:
    """Module -> algorithm the options ask for (``--algo``, one ``--algo-for PATTERN=ALGO`` and one ``--exclude
    PATTERN``, fnmatch): an excluded module is absent."""
    pattern, _, other = (rule or "").partition("=")
    return {m: other if rule and fnmatch.fnmatchcase(m, pattern) else algo for m in linear_modules(source)
            if not (exclude and fnmatch.fnmatchcase(m, exclude))}


def listed(module: str, entries) -> bool:
    """`module` is named by an exclusion list (vLLM's rules: the exact name, a wildcard, a parent module, or the
    fused module it belongs to)."""
    prefix, _, leaf = module.rpartition(".")
    fused = f"{prefix}.{FUSED_NAMES[FUSED[leaf]]}" if leaf in FUSED else None
    return any(module == e or fused == e or module.startswith(e + ".") or fnmatch.fnmatchcase(module, e)
               for e in entries or [] if isinstance(e, str))


# -- the bytes ----------------------------------------------------------------------------------------------
def leaves(tensors: dict) -> dict[str, dict]:
    """Module -> {leaf: tensor}."""
    out: dict[str, dict] = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        out.setdefault(module, {})[leaf] = t
    return out


def algo_in_bytes(parts: dict) -> str | None:
    """The algorithm a module's tensors encode (either format, plain or a packed layout), None when unquantized.

    Zero points: INT4_ASYM. A per-tensor fp32 global scale: NVFP4 with an input scale, else W4A16_NVFP4.
    Packed int32 codes (compressed-tensors) or int4 pairs in uint8 beside a 2-D scale (ModelOpt): INT4.
    e8m0 (uint8) scales: MXFP8. int8 codes: INT8. FP8 codes: one scale (FP8), one per output row
    (FP8_PER_CHANNEL_PER_TOKEN) or one per 128 x 128 block (FP8_PB_WO)."""
    if "weight_zero_point" in parts:
        return "INT4_ASYM"
    if "weight_scale_2" in parts or "weight_global_scale" in parts:
        return "NVFP4" if "input_scale" in parts or "input_global_scale" in parts else "W4A16_NVFP4"
    if "weight_packed" in parts:
        return "INT4"
    scale, weight = parts.get("weight_scale"), parts.get("weight")
    if scale is None:
        return None
    if scale.dtype == torch.uint8:
        return "MXFP8"
    if weight is not None and weight.dtype == torch.int8:
        return "INT8"
    if weight is not None and weight.dtype == torch.uint8:
        return "INT4"
    if scale.numel() == 1:
        return "FP8"
    rows = weight.shape[0] if weight is not None else None
    if rows is not None and scale.numel() == rows and scale.shape[0] == rows:
        return "FP8_PER_CHANNEL_PER_TOKEN"
    return "FP8_PB_WO"


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
def ct_algo(group: dict | None) -> str | None:
    """The algorithm a compressed-tensors ``config_groups`` entry describes (its weights' and activations' args)."""
    w, acts = (group or {}).get("weights") or {}, (group or {}).get("input_activations")
    bits, kind, strategy = w.get("num_bits"), w.get("type"), w.get("strategy")
    if bits == 4:
        if kind == "float":
            return "NVFP4" if acts else "W4A16_NVFP4"
        return "INT4" if w.get("symmetric", True) else "INT4_ASYM"
    if bits == 8 and kind == "int":
        return "INT8"
    return {"tensor": "FP8", "channel": "FP8_PER_CHANNEL_PER_TOKEN", "block": "FP8_PB_WO", "group": "MXFP8"}.get(strategy)


def modelopt_algo(quant_algo) -> str:
    name = str(quant_algo).upper()
    return MODELOPT_NAMES.get(name, name)


def exclusion_lists(out: Output, fmt: str) -> dict[str, list]:
    """Every list that tells a loader which modules stay unquantized: compressed-tensors' ``ignore``; ModelOpt's
    ``exclude_modules`` in hf_quant_config.json and the ``ignore`` config.json repeats it in."""
    q = out.config.get("quantization_config") or {}
    if fmt == CT:
        return {"config.json ignore": q.get("ignore") or []}
    nested = (out.hqc or {}).get("quantization") or {}
    return {"hf_quant_config.json exclude_modules": nested.get("exclude_modules") or [], "config.json ignore": q.get("ignore") or []}


def algos_in_config(out: Output, fmt: str, source: str = "tiny-llama") -> dict[str, str]:
    """Module -> algorithm as config.json (and hf_quant_config.json) tell a loader."""
    q = out.config.get("quantization_config") or {}
    mods = linear_modules(source)
    if fmt == CT:
        groups = q.get("config_groups") or {}

        def group_of(m):
            exact = [g for g in groups.values() if m in g.get("targets", [])]
            return (exact or [g for g in groups.values() if "Linear" in g.get("targets", [])] or [None])[0]

        return {m: ct_algo(group_of(m)) for m in mods if not listed(m, q.get("ignore"))}
    nested = (out.hqc or {}).get("quantization") or {}
    if nested.get("quant_algo") == "MIXED_PRECISION":
        return {m: modelopt_algo(v.get("quant_algo")) for m, v in (nested.get("quantized_layers") or {}).items()}
    return {m: modelopt_algo(nested.get("quant_algo")) for m in mods if not listed(m, nested.get("exclude_modules"))}


def check_config(out: Output, fmt: str, kv: bool, layout: str, calibrated: bool, problems: list, source: str = "tiny-llama") -> None:
    """config.json / hf_quant_config.json against the bytes: per-module algorithm, KV cache, layout, calibration record."""
    q = out.config.get("quantization_config") or {}
    in_bytes = algos_in_bytes(out)
    said = algos_in_config(out, fmt, source)
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


def same_files(dst: str, ref: str, problems: list) -> None:
    """Every file but the card (it names DST and its command) and hidden bookkeeping equals the reference's, byte for byte."""
    got, want = output_files(dst), output_files(ref)
    if got == want:
        return
    names = sorted(f for f in set(got) | set(want) if got.get(f) != want.get(f))
    a, b = load_all(dst), load_all(ref)
    tensors = sorted(n for n in set(a) | set(b) if n not in a or n not in b or not same_bytes(a[n], b[n]))
    problems.append(f"bytes: {names} differ from the reference (another path); tensors: {tensors[:6]}{' ...' if len(tensors) > 6 else ''}")


# -- what stays unquantized, and the shapes each algorithm writes ----------------------------------------
@functools.lru_cache(maxsize=None)
def source_tensors(source: str) -> dict:
    from quantize_cli.checkpoint.examples import example_path

    return load_all(example_path(source))


def kept_linears(out: Output, source: str) -> list[str]:
    """The 2-D weights of the source (Linears, the output head, routers; not the embeddings) left unquantized in the bytes."""
    quantized = algos_in_bytes(out)
    return sorted(m for m in source_weights(source) if m not in quantized and not m.endswith("embed_tokens"))


def check_kept(out: Output, fmt: str, source: str, problems: list) -> None:
    """What stays unquantized: the source's bytes, every exclusion list naming exactly those modules, and the
    card's "Kept unquantized" table listing the kept Linears, MoE routers included (embeddings and norms unlisted)."""
    src, quantized, kept = source_tensors(source), algos_in_bytes(out), kept_linears(out, source)
    changed = [m for m in source_weights(source) if m not in quantized
               and not (f"{m}.weight" in out.tensors and same_bytes(out.tensors[f"{m}.weight"], src[f"{m}.weight"]))]
    if changed:
        problems.append(f"kept: {len(changed)} unquantized module(s) differ from the source's bytes, e.g. {changed[:2]}")
    # ModelOpt's MIXED_PRECISION names what is quantized (quantized_layers, which algos_in_config reads): a module
    # it does not name is kept, listed or not
    by_name = fmt == CT or ((out.hqc or {}).get("quantization") or {}).get("quant_algo") != "MIXED_PRECISION"
    for where, entries in exclusion_lists(out, fmt).items():
        missing = [m for m in kept if not listed(m, entries)] if by_name else []
        wrong = sorted(m for m in quantized if listed(m, entries))
        if missing or wrong:
            problems.append(f"kept: {where} misses kept {missing[:3]} / names quantized {wrong[:3]}")
    if not out.card:  # check_card says so where one is due
        return
    table = re.findall(r"^\| `([^`]+)` \| ", section(out.card, "Kept unquantized"), re.M)
    want = sorted(kept)
    if sorted(table) != want:
        problems.append(f"card: Kept unquantized lists {sorted(table)[:4]}, the bytes keep {want[:4]}")
    m = re.search(r"(\d+) Linear layer\(s\) keep the source dtype", out.card)
    if int(m.group(1) if m else 0) != len(want):
        problems.append(f"card: says {m.group(0) if m else 'no Linear is kept'}, the bytes keep {len(want)}")


def expected_shapes(algo: str, fmt: str, n: int, k: int) -> dict[str, tuple[torch.dtype, tuple]]:
    """Leaf -> (dtype, shape) a plain output holds for a quantized (n, k) Linear (the formats' documents:
    ModelOpt's export, compressed-tensors' pack-quantized / nvfp4-pack-quantized / float-quantized)."""
    fp8, ct = torch.float8_e4m3fn, fmt == CT
    sdt = torch.bfloat16 if ct else torch.float32  # compressed-tensors writes scales in the model's dtype
    per_row = (n, 1) if ct else (n,)
    if algo in ("NVFP4", "W4A16_NVFP4"):
        return {("weight_packed" if ct else "weight"): (torch.uint8, (n, k // 2)), "weight_scale": (fp8, (n, k // 16)),
                **({"weight_global_scale": (torch.float32, (1,))} if ct else {"weight_scale_2": (torch.float32, ())})}
    if algo in ("INT4", "INT4_ASYM"):
        if not ct:
            return {"weight": (torch.uint8, (n // 2, k)), "weight_scale": (torch.float32, (n, k // 128))}
        zp = {"weight_zero_point": (torch.int32, (n // 8, k // 128))} if algo == "INT4_ASYM" else {}
        return {"weight_packed": (torch.int32, (n, k // 8)), "weight_scale": (sdt, (n, k // 128)), "weight_shape": (torch.int64, (2,)), **zp}
    weight = {"weight": (torch.int8 if algo == "INT8" else fp8, (n, k))}
    nb, kb = -(-n // 128), -(-k // 128)  # FP8_PB_WO: ModelOpt keeps its blocks' broadcast view [nb, 1, kb, 1]
    scale = {"INT8": (sdt, per_row), "FP8_PER_CHANNEL_PER_TOKEN": (sdt, per_row), "MXFP8": (torch.uint8, (n, k // 32)),
             "FP8": (sdt, (1,) if ct else ()), "FP8_PB_WO": (sdt, (nb, kb) if ct else (nb, 1, kb, 1))}[algo]
    return {**weight, "weight_scale": scale}


def check_weight_scales(out: Output, fmt: str, source: str, problems: list) -> None:
    """A plain output's quantized tensors against each algorithm's shapes (from the source's), and the per-tensor
    scale fused members share (q/k/v and gate/up, per layer and per expert) where the algorithm has one."""
    shapes = source_weights(source)
    groups: dict[tuple, dict] = {}
    for module, parts in leaves(out.tensors).items():
        algo = algo_in_bytes(parts)
        if algo is None:
            continue
        n, k = shapes[module][1]
        got = {leaf: (t.dtype, tuple(t.shape)) for leaf, t in parts.items() if leaf.startswith("weight")}
        want = expected_shapes(algo, fmt, n, k)
        if got != want:
            problems.append(f"shapes: {module} ({algo}, source {n}x{k}) holds {got}, want {want}")
        prefix, _, leaf = module.rpartition(".")
        shared = SHARED_GLOBAL.get(algo)
        if leaf in FUSED and shared:
            name = next(s for s in ((shared,) if isinstance(shared, str) else shared) if s in parts)
            groups.setdefault((prefix, FUSED[leaf]), {})[module] = float(parts[name].float().reshape(-1)[0])
    split = {g: v for g, v in groups.items() if len(set(v.values())) > 1}
    if split:
        problems.append(f"shapes: fused members with different per-tensor scales: {dict(list(split.items())[:1])}")


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


def check_card(out: Output, fmt: str, kv: bool, layout: str, calibrated: bool, wanted_flags: dict, problems: list,
               transform: str | None = None) -> None:
    """The model card against the bytes: algorithms and counts, format, layout, KV, calibration, command line.

    `transform`: what the calibration data chose in the weights (``GPTQ``, ``awq``), which the card's
    calibration section must say; None: nothing."""
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
    elif transform:
        if not cal.startswith("Calibrated on") or any(t not in cal for t in transform.split()) or "of the weights" not in cal:
            problems.append(f"card: calibration says {cal[:120]!r}; the data chose the weights ({transform})")
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
    # vLLM, or TensorRT-LLM for what vLLM's loader of the format does not serve (ModelOpt's W4A16_AWQ, W8A16)
    serve = [ln for ln in block.splitlines() if ln.startswith(("vllm serve ", "trtllm-serve "))]
    where = where if "/" in where and not os.path.isabs(where) else f"./{os.path.basename(where)}"  # never a local path
    if not serve or where not in serve[0]:
        problems.append(f"card: no `vllm serve {where}` (or trtllm-serve) line: {block!r}")
    elif kv != ("--kv-cache-dtype fp8" in serve[0]) and serve[0].startswith("vllm"):
        problems.append(f"card: serve line {serve[0]!r} with --kv-cache-dtype {'fp8' if kv else '(none)'}")
