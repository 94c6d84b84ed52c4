"""The model card (``README.md``) written into every converted checkpoint.

The card is built from a plain dict of facts (:func:`card_facts` gathers them from a finished
conversion), so any producer (calibration, another output format) can feed it without touching
this module. Facts, all JSON-able:

- ``tool``: ``{"name": "quantize", "version": "0.1.0"}``; ``command``: the command line that makes
  this output (str; from the run identity, output/identity.py);
- ``source``: what was converted, as it may be published (the Hub id, else the folder's name: never a
  local path); ``base_model``: its Hub repo id (the source's, or ``--base-model``), or None;
- ``format``: ``"modelopt"`` or ``"compressed-tensors"``; ``engines``: the engines that serve it
  (the format's ``served`` table); ``transformers_loads``: whether transformers loads it;
  ``layout``: ``"plain"`` or a kernel layout;
- ``algos``: ``{ALGO: number of quantized Linears}``; ``quant_algo``: the name in hf_quant_config.json;
- ``kv_cache_dtype``: ``"fp8"`` or None;
- ``excluded``: ``[{"module": name, "reason": why}]`` for every Linear kept unquantized;
  ``exclude_modules``: the list written to the checkpoint;
- ``calibration``: None (no static activation scale), or ``{"calibrated": bool, ...}``:
  calibrated -> ``dataset``, ``samples``, ``seq_len``; not -> ``input_scale`` and ``note``;
- ``verify``: None (not verified), or ``{"errors", "warnings", "compared_with_source": bool,
  "sqnr_db": {ALGO: {"tensors", "median", "min", "worst"}}}``;
- ``sizes``: ``{"in": bytes, "out": bytes}`` (tensor bytes of the source and of the output).

A card already in the output folder (the source's README.md, copied as a sidecar) is kept below
ours; its license and pipeline tag are carried into our front matter. Secrets never reach the card:
it is made only of these facts, and the command line holds no token (tokens come from the
environment or the huggingface_hub login, never from a flag).
"""

from __future__ import annotations

import os
import re
import statistics

from .. import __version__
from ..algorithms import MIXED_PRECISION
from ..repo_id import is_repo_id

CARD_NAME = "README.md"
_MARKER = "<!-- written by quantize: everything above this line is generated -->"
_SOURCE_HEADING = "## Original model card"
_SERVE_START = "<!-- quantize: serve -->"
MAX_EXCLUDED_ROWS = 40

def sqnr_by_algo(errors_by_tensor: dict[str, dict], algo_of) -> dict[str, dict]:
    """Per-algorithm SQNR summary: ``{ALGO: {"tensors", "median", "min", "worst"}}``.

    `errors_by_tensor`: ``{"<module>.weight": {"sqnr_db": float, ...}}`` (verify's result);
    `algo_of(module) -> ALGO`.
    """
    groups: dict[str, list[tuple[float, str]]] = {}
    for name, err in errors_by_tensor.items():
        value = err.get("sqnr_db")
        if isinstance(value, (int, float)):
            groups.setdefault(algo_of(name.rsplit(".", 1)[0]), []).append((float(value), name))
    return {algo: {"tensors": len(rows), "median": statistics.median(v for v, _ in rows),
                   "min": min(rows)[0], "worst": min(rows)[1]} for algo, rows in sorted(groups.items())}


def verify_summary(verify_result, algo_of) -> dict:
    """``{"errors", "warnings", "compared_with_source", "sqnr_db": {ALGO: ...}}`` of a VerifyResult."""
    per_algo = sqnr_by_algo(verify_result.errors_by_tensor, algo_of)
    return {"errors": len(verify_result.errors), "warnings": len(verify_result.warnings),
            "compared_with_source": bool(per_algo), "sqnr_db": per_algo}


def public_source(plan, base_model: str | None = None) -> tuple[str | None, str]:
    """(the source's Hub repo id or None, how the card names the source): a Hub id as it is, a local
    folder by its name only (its path is private), a folder in the Hub cache by the repo it caches."""
    if base_model:
        return base_model, base_model
    label, root = plan.source.label, plan.source.root or ""
    if label.startswith("example:"):
        return None, label
    if plan.source.from_hub and is_repo_id(label):
        return label, label
    cached = re.search(r"models--([^/]+)--([^/]+)/snapshots/", root + "/")  # huggingface_hub's cache layout
    if cached and is_repo_id(f"{cached.group(1)}/{cached.group(2)}"):
        repo = f"{cached.group(1)}/{cached.group(2)}"
        return repo, repo
    return None, os.path.basename(os.path.normpath(root or label)) or "model"


def card_facts(plan, identity, dst: str, repo: str | None = None, base_model: str | None = None, verify_result=None) -> dict:
    """The facts of `plan`'s output, made by `identity` into `dst` (`repo`: where it is pushed)."""
    from ..modules.classify import LINEAR, ROUTER

    def algo_of(module: str) -> str:  # mixed precision: each module's own algorithm
        return plan.scheme_of(module).algo

    algos: dict[str, int] = {}
    for m in plan.modules.values():
        if m.quantize:
            algos[algo_of(m.name)] = algos.get(algo_of(m.name), 0) + 1
    algos = algos or {plan.scheme.algo: 0}
    base, shown = public_source(plan, base_model)
    out = repo or os.path.basename(os.path.normpath(dst)) or "out"
    command = identity.command_line(base or (shown if shown.startswith("example:") else f"./{shown}"), out)
    return {
        "tool": {"name": "quantize", "version": __version__},
        "command": command,
        "title": f"{(base or (repo or '').split('/')[-1] or shown)} {'/'.join(algos)}",
        "where": repo or f"./{out}",
        "source": shown,
        "base_model": base,
        "format": plan.format.name,
        "engines": plan.format.engines(algos),
        "transformers_loads": plan.format.transformers_loads,
        "layout": plan.packing.metadata()["name"] if plan.packing is not None else "plain",
        "algos": algos,
        "quant_algo": MIXED_PRECISION if len(algos) > 1 else plan.scheme.quant_algo,
        "kv_cache_dtype": plan.kv_cache_dtype,
        # every Linear-shaped weight kept in the source dtype, MoE routers included (exclude_modules names them too)
        "excluded": [{"module": m.name, "reason": m.reason} for m in plan.modules.values()
                     if m.kind in (LINEAR, ROUTER) and not m.quantize],
        "exclude_modules": list(plan.exclude_modules),
        "calibration": calibration_facts(plan),
        "verify": verify_summary(verify_result, algo_of) if verify_result is not None else None,
        "sizes": {"in": plan.source.total_bytes, "out": plan.bytes_out},
    }


def calibration_facts(plan) -> dict | None:
    """The card's calibration facts, from the scales the bytes were written with (plan.act_scales)."""
    weights = getattr(plan, "weights", None)  # --rounding gptq / --smooth: the weights were chosen on calibration data
    method = (weights.request.get("method") or {}) if weights is not None else {}
    # what verify --source needs to know of the weights (a comment: compressed-tensors has no field for it)
    chosen = {"method": method} if weights is not None else {}
    cal = plan.act_scales
    if cal is not None:
        data = cal.meta.get("data") or {}
        return {"calibrated": True, "dataset": data.get("spec"), "samples": data.get("samples"), "seq_len": data.get("seq_len"),
                "tokens": data.get("tokens"), "modules": len(cal.input_amax), "kv_scales": len(cal.kv_amax), "data": data, **chosen}
    data = getattr(weights, "data", None)
    if data:
        how = " and ".join(w for w in ("GPTQ rounding" if method.get("rounding") == "gptq" else None,
                                       f"{method.get('smooth')} smoothing" if method.get("smooth", "none") != "none" else None) if w)
        return {"calibrated": True, "dataset": data.get("spec"), "samples": data.get("samples"), "seq_len": data.get("seq_len"),
                "tokens": data.get("tokens"), "weights": how or "the weights", "data": data, **chosen}
    from ..algorithms import static_input_scale

    # the activation scale each static algorithm assumes (ModelOpt's input_scale; compressed-tensors
    # NVFP4 stores its inverse, input_global_scale): the same number whatever the format writes
    schemes = list(plan.schemes.values() if plan.mixed else [plan.scheme])
    static = {s.algo: static_input_scale(s.algo) for s in schemes if s.static_input_scale is not None}
    if not static:
        return None
    shown = next(iter(static.values())) if len(static) == 1 else " or ".join(f"{v:g} ({a})" for a, v in sorted(static.items()))
    return {"calibrated": False, "input_scale": shown, "inverse_stored": any(s.inverse_input_scale for s in schemes if s.static_input_scale is not None),
            "note": "the calibration-free constant ModelOpt writes (activation amax 448); no calibration data was given"}


def _split_source_card(text: str | None) -> tuple[dict, str]:
    """(front matter dict, body) of a source card; ({}, "") when there is none."""
    if not text or not text.strip():
        return {}, ""
    meta, body = {}, text.strip()
    if text.lstrip().startswith("---"):
        from huggingface_hub import ModelCard

        card = ModelCard(text, ignore_metadata_errors=True)
        meta, body = card.data.to_dict(), card.text.strip()
    if _MARKER in body:  # our own card (rendered again): its metadata, and only the source card below it
        tail = body.split(_MARKER, 1)[1]
        body = tail.split(_SOURCE_HEADING, 1)[1].strip() if _SOURCE_HEADING in tail else ""
    return meta, body


def front_matter(facts: dict, source_meta: dict) -> dict:
    """The YAML front matter: Hub model-card metadata (base_model + base_model_relation: quantized)."""
    from ..algorithms import ALGORITHMS
    from ..formats import format_named

    algos = list(facts["algos"])
    tags = ["quantized", facts["format"]] + sorted({ALGORITHMS[a].tag if a in ALGORITHMS else a.lower() for a in algos})
    tags += format_named(facts["format"]).hub_tags
    if facts.get("layout") not in (None, "plain"):
        tags.append(f"{facts['layout']}-layout")
    meta: dict = {}
    if facts.get("base_model"):
        meta["base_model"] = facts["base_model"]
        meta["base_model_relation"] = "quantized"
    for key in ("license", "license_name", "license_link", "pipeline_tag", "language"):
        if source_meta.get(key):
            meta[key] = source_meta[key]
    # library_name "transformers" only where transformers loads the output: it loads a ModelOpt
    # checkpoint as garbage (it skips the unknown quantization), so the Hub must not offer its snippet.
    if facts.get("transformers_loads"):
        meta["library_name"] = "transformers"
    meta["tags"] = list(dict.fromkeys(tags + [e.lower() for e in facts.get("engines", []) if e != "transformers"]))
    return meta


def serve_lines(facts: dict, repo: str) -> list[str]:
    """Shell lines that serve this checkpoint, for the engines that load its algorithms in its format."""
    from ..formats import format_named

    if facts.get("layout") not in (None, "plain"):
        lines = [f"# packed '{facts['layout']}' layout: no stock loader reads it (docs/layouts.md);",
                 "# serve the plain checkpoint instead:"]
        local = repo
        if is_repo_id(repo) and not repo.startswith((".", "/")):  # unpack reads a local folder: fetch the repo first
            local = repo.split("/")[-1]
            lines.append(f"hf download {repo} --local-dir {local}")
        return lines + [f"quantize unpack {local} -o {local.rstrip('/')}-plain"]
    lines = format_named(facts.get("format")).serve_lines(facts["algos"], facts.get("kv_cache_dtype"), repo)
    return lines or [f"# no stock loader is known to serve {', '.join(sorted(facts['algos']))} in this format"]


def _load_note(facts: dict) -> list[str]:
    """Where the output does not load, said where people look for it (transformers above all)."""
    if facts.get("transformers_loads"):
        return []
    return ["transformers does not load this format: it skips the `modelopt` quantization and would compute with the "
            "raw quantized bytes. For transformers, convert with `--format compressed-tensors`. The usage snippets of the "
            "original model card below load the unquantized model.", ""]


def render_card(facts: dict, source_card: str | None = None, repo: str | None = None) -> str:
    """The README.md text: front matter, our sections, then the source card's body (if any)."""
    from huggingface_hub import ModelCardData

    from ..formats import format_named

    source_meta, source_body = _split_source_card(source_card)
    meta = ModelCardData(**front_matter(facts, source_meta)).to_yaml()
    where = repo or facts.get("where") or "path/to/this/checkpoint"
    algos = facts["algos"]
    base = facts.get("base_model")
    title = facts.get("title") or f"{base or facts['source']} {'/'.join(algos)}"
    out = [f"---\n{meta}\n---", f"# {title}", ""]
    origin = f"[{base}](https://huggingface.co/{base})" if base else f"`{facts['source']}`"
    fmt = format_named(facts["format"])
    how = fmt.card_how()
    engines = facts.get("engines") or []
    served = f" It is served by {', '.join(engines)}." if engines else ""
    out += [f"A quantized version of {origin}, written by quantize {facts['tool']['version']} in {how}.{served}", ""]
    out += _load_note(facts)
    out += ["## How it was made", "", "```bash", facts["command"], "```", ""]
    out += ["| | |", "|---|---|"]
    for algo, count in algos.items():
        out.append(f"| algorithm | `{algo}` on {count} Linear layer(s): {_describe(algo)} |")
    out.append(f"| format | {facts['format']} ({fmt.card_where(facts['quant_algo'])}) |")
    out.append(f"| layout | {facts.get('layout') or 'plain'} |")
    kv_scaled = (facts.get("calibration") or {}).get("kv_scales")
    kv = ("FP8 with calibrated k/v scales" if kv_scaled else "FP8 (cast, no scales)") if facts.get("kv_cache_dtype") else "unquantized"
    out.append(f"| KV cache | {kv} |")
    sizes = facts["sizes"]
    out.append(_size_row(sizes))
    out += ["", _sizes_comment(sizes), "", *_calibration_section(facts.get("calibration")), *_excluded_section(facts), *_verify_section(facts.get("verify"))]
    out += [_serve_block(facts, where), _MARKER, ""]
    if source_body:
        out += [_SOURCE_HEADING, "", source_body, ""]
    return "\n".join(out)


def _size_row(sizes: dict) -> str:
    ratio = f" ({sizes['in'] / sizes['out']:.2f}x smaller)" if sizes.get("out") else ""
    return f"| size | {_gb(sizes['in'])} before, {_gb(sizes['out'])} after{ratio} |"


# The exact byte counts behind the size row (invisible when rendered): `unpack` rewrites the row
# for the plain tensors it writes without knowing the source.
_SIZES = re.compile(r"^<!-- quantize sizes: in (\d+) out (\d+) -->$", re.M)


def _sizes_comment(sizes: dict) -> str:
    return f"<!-- quantize sizes: in {int(sizes['in'])} out {int(sizes['out'])} -->"


def _describe(algo: str) -> str:
    from ..algorithms import ALGORITHMS

    return ALGORITHMS[algo].describe if algo in ALGORITHMS else algo


def _serve_block(facts: dict, where: str) -> str:
    return "\n".join([_SERVE_START, "## Serve it", "", "```bash", *serve_lines(facts, where), "```", ""])


def retarget_card(folder: str, repo: str, layout: str | None = None) -> bool:
    """Point the card's serve lines at `repo` (``quantize push``; ``unpack``: a local path), from the
    facts the folder's own documents give (its format's ``output_facts``: every format, mixed
    precision and the KV cache included). False when there is no card of ours. Written atomically."""
    from ..formats import detect_output

    path = os.path.join(folder, CARD_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    if _SERVE_START not in text or _MARKER not in text:
        return False
    fmt, _ = detect_output(folder)
    facts = {**fmt.output_facts(folder), "format": fmt.name}
    if layout is not None:
        facts["layout"] = layout
    head, rest = text.split(_SERVE_START, 1)
    _, tail = rest.split(_MARKER, 1)
    _write(path, head + _serve_block(facts, repo) + "\n" + _MARKER + tail)
    return True


def mark_unpacked(folder: str, packed_from: str) -> None:
    """After ``quantize unpack``: the copied card says the layout is now plain and serves it as such."""
    if not retarget_card(folder, "path/to/this/checkpoint", layout="plain"):
        return
    path = os.path.join(folder, CARD_NAME)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"^\| layout \| .* \|$", f"| layout | plain (unpacked from `{packed_from}` with `quantize unpack`) |", text,
                  count=1, flags=re.M)
    text = re.sub(r"^ *- [a-z]+-layout\n", "", text, count=1, flags=re.M)  # the front matter's packed-layout tag
    found = _SIZES.search(text)
    if found:  # the plain tensors' size, as a plain conversion's card states it
        sizes = {"in": int(found.group(1)), "out": _tensor_bytes(folder)}
        text = re.sub(r"^\| size \| .* \|$", lambda _: _size_row(sizes), text, count=1, flags=re.M)
        text = _SIZES.sub(lambda _: _sizes_comment(sizes), text, count=1)
    _write(path, text)


def _tensor_bytes(folder: str) -> int:
    """The bytes of every tensor in `folder`'s shards (a plan's ``bytes_out``: data, no headers)."""
    from ..checkpoint.safetensors_header import read_header

    return sum(t.nbytes for f in sorted(os.listdir(folder)) if f.endswith(".safetensors")
               for t in read_header(os.path.join(folder, f)).tensors.values())


def _write(path: str, text: str) -> None:
    from ..checkpoint.durable import write_atomic

    write_atomic(path, text.encode("utf-8"))


def _gb(n: int) -> str:
    from ..console import human_bytes

    return human_bytes(n)


def _calibration_section(cal: dict | None) -> list[str]:
    lines = ["## Calibration", ""]
    if cal is None:
        lines.append("None needed: no static activation scale (weights only, or dynamic activation scales at serve time).")
    elif cal.get("calibrated"):
        what = [f"{cal['modules']} input scale(s)" if cal.get("modules") else None,
                f"{cal['kv_scales']} k/v scale pair(s)" if cal.get("kv_scales") else None,
                f"{cal['weights']} of the weights" if cal.get("weights") else None]
        lines.append(f"Calibrated on `{cal.get('dataset')}`: {', '.join(w for w in what if w) or 'scales'} from "
                     f"{cal.get('samples')} sample(s) of at most {cal.get('seq_len')} token(s)"
                     + (f" ({cal.get('tokens')} tokens)." if cal.get("tokens") else "."))
        from ..calibration.record import data_comment, method_comment

        lines += ["", data_comment(cal.get("data") or {})]
        if "method" in cal:
            lines.append(method_comment(cal["method"]))
    else:
        value = cal.get("input_scale")
        inverse = " (compressed-tensors NVFP4 stores its inverse as `input_global_scale`)" if cal.get("inverse_stored") else ""
        which = (f"every `input_scale` is {value:g}" if isinstance(value, (int, float)) else
                 f"the `input_scale` of each layer is its algorithm's constant, {value}")  # mixed precision: one per algorithm
        lines.append(f"Not calibrated: {which}{inverse}, {cal.get('note', 'a calibration-free constant')}.")
    return lines + [""]


def _excluded_section(facts: dict) -> list[str]:
    excluded = facts.get("excluded") or []
    lines = ["## Kept unquantized", ""]
    if not excluded:
        return lines + ["Every Linear layer is quantized (embeddings and norms always keep their dtype).", ""]
    lines += [f"{len(excluded)} Linear layer(s) keep the source dtype (embeddings and norms always do):", "",
              "| module | why |", "|---|---|"]
    lines += [f"| `{e['module']}` | {e['reason']} |" for e in excluded[:MAX_EXCLUDED_ROWS]]
    if len(excluded) > MAX_EXCLUDED_ROWS:
        lines.append(f"| ... | and {len(excluded) - MAX_EXCLUDED_ROWS} more: see `exclude_modules` in hf_quant_config.json |")
    return lines + [""]


def _verify_section(ver: dict | None) -> list[str]:
    lines = ["## Verification", ""]
    if ver is None:
        return lines + ["Not verified at conversion time; run `quantize verify DST --source SRC`.", ""]
    lines.append(f"`quantize verify` passed: {ver['errors']} error(s), {ver['warnings']} warning(s).")
    if ver.get("sqnr_db"):
        lines += ["", "Weight error against the source (SQNR of the dequantized weights, higher is better):", "",
                  "| algorithm | tensors | median SQNR | min SQNR | worst tensor |", "|---|---|---|---|---|"]
        lines += [f"| `{a}` | {s['tensors']} | {s['median']:.1f} dB | {s['min']:.1f} dB | `{s['worst']}` |" for a, s in ver["sqnr_db"].items()]
    else:
        lines.append("(Structure and values only: the source was not compared.)")
    return lines + [""]


def card_text(folder: str, facts: dict, repo: str | None = None) -> str:
    """The card for `folder`: ours, with a README.md already there (the source's, copied) kept below."""
    path = os.path.join(folder, CARD_NAME)
    source = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
    return render_card(facts, source, repo)
