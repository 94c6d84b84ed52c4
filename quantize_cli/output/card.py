"""The model card (``README.md``) written into every converted checkpoint.

The card is built from a plain dict of facts (:func:`card_facts` gathers them from a finished
conversion), so any producer (calibration, another output format) can feed it without touching
this module. Facts, all JSON-able:

- ``tool``: ``{"name": "quantize", "version": "0.1.0"}``; ``command``: the command line that makes
  this output (str);
- ``source``: what was converted (label); ``base_model``: its Hub repo id, or None when unknown;
- ``format``: ``"modelopt"`` (``"compressed-tensors"`` later); ``layout``: ``"plain"`` or a kernel layout;
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
import shlex
import statistics

from .. import __version__
from ..repo_id import is_repo_id

CARD_NAME = "README.md"
_MARKER = "<!-- written by quantize: everything above this line is generated -->"
_SOURCE_HEADING = "## Original model card"
_SERVE_START = "<!-- quantize: serve -->"
MAX_EXCLUDED_ROWS = 40

# Which loaders serve which algorithm from the plain ModelOpt checkpoint (docs/formats.md).
_VLLM = {"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4"}
_TRTLLM = {"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4", "INT8", "INT4"}
_SGLANG = {"FP8", "NVFP4"}
_TAGS = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "FP8_PB_WO": "fp8", "NVFP4": "nvfp4",
         "W4A16_NVFP4": "nvfp4", "INT8": "int8", "INT4": "int4", "INT4_ASYM": "int4"}
_DESCRIBE = {
    "FP8": "FP8 e4m3 weights with one fp32 scale per tensor; static per-tensor FP8 activations",
    "FP8_PER_CHANNEL_PER_TOKEN": "FP8 e4m3 weights with one scale per output channel; dynamic per-token FP8 activations",
    "FP8_PB_WO": "FP8 e4m3 weights with one scale per 128x128 block; dynamic 1x128-group FP8 activations",
    "NVFP4": "NVFP4 (E2M1 in 16-element groups, e4m3 group scales, fp32 global scale); static global + dynamic group FP4 activations",
    "W4A16_NVFP4": "NVFP4 weights (E2M1, 16-element groups); 16-bit activations",
    "INT8": "int8 weights with one scale per output channel (ModelOpt W8A16); 16-bit activations",
    "INT4": "int4 weights with one scale per 128-element group (W4A16, symmetric); 16-bit activations",
    "INT4_ASYM": "int4 weights with one scale and zero point per 128-element group (W4A16_ASYM); 16-bit activations",
}


# Options that do not change what is written: left out of the card's command line.
_NOT_IN_COMMAND = {"src", "dst", "quiet", "resume", "dry_run", "overwrite", "report"}


def command_line(src: str, dst: str, **options) -> str:
    """The ``quantize convert`` command equivalent to a library call: every option that decides the
    output and differs from its default, valued flags in ``ConvertOptions``' order, then switches.
    ``options`` are convert's keywords (algo, exclude, recipe, ...); each maps to its CLI flag
    (``kv_cache_dtype`` -> ``--kv-cache-dtype``), repeatable ones (exclude, algo_for) repeated."""
    from dataclasses import MISSING, fields

    from ..plan.options import ConvertOptions

    args, switches = ["quantize", "convert", src, "-o", dst], []
    for f in fields(ConvertOptions):
        if f.name in _NOT_IN_COMMAND or f.name not in options:
            continue
        value, default = options[f.name], (None if f.default is MISSING else f.default)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            switches += [flag] if value and not default else []
        elif isinstance(value, (list, tuple)):
            for item in value:
                args += [flag, str(item)]
        elif value not in (None, "") and str(value).lower() != str(default).lower():
            args += [flag, str(value)]
    if "--algo" not in args:  # always said, even when it is the library's default
        args[5:5] = ["--algo", str(options.get("algo", ConvertOptions.algo))]
    return shlex.join(args + switches)


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


def card_facts(plan, command: str, verify_result=None, calibration: dict | None = None, fmt: str = "modelopt") -> dict:
    """The facts of a finished conversion of `plan` (see the module docstring)."""
    from ..plan.classify import LINEAR

    def algo_of(module: str) -> str:  # mixed precision: each module's own algorithm
        return plan.scheme_of(module).algo

    algos: dict[str, int] = {}
    for m in plan.modules.values():
        if m.quantize:
            algos[algo_of(m.name)] = algos.get(algo_of(m.name), 0) + 1
    verify = verify_summary(verify_result, algo_of) if verify_result is not None else None
    if calibration is None and plan.scheme.static_input_scale is not None:
        calibration = {"calibrated": False, "input_scale": plan.scheme.static_input_scale,
                       "note": "the calibration-free constant ModelOpt writes (activation amax 448); no calibration data was given"}
    label = plan.source.label
    return {
        "tool": {"name": "quantize", "version": __version__},
        "command": command,
        "source": label,
        "base_model": label if plan.source.from_hub and is_repo_id(label) else None,
        "format": fmt,
        "layout": plan.packing.metadata()["name"] if plan.packing is not None else "plain",
        "algos": algos or {plan.scheme.algo: 0},
        "quant_algo": "MIXED_PRECISION" if len(algos) > 1 else plan.scheme.quant_algo,
        "kv_cache_dtype": plan.kv_cache_dtype,
        "excluded": [{"module": m.name, "reason": m.reason} for m in plan.modules.values() if m.kind == LINEAR and not m.quantize],
        "exclude_modules": list(plan.exclude_modules),
        "calibration": calibration,
        "verify": verify,
        "sizes": {"in": plan.source.total_bytes, "out": plan.bytes_out},
    }


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
    algos = list(facts["algos"])
    tags = ["quantized", facts["format"]] + sorted({_TAGS.get(a, a.lower()) for a in algos})
    if facts["format"] == "modelopt":
        tags.append("nvidia-modelopt")
    if facts.get("layout") not in (None, "plain"):
        tags.append(f"{facts['layout']}-layout")
    meta: dict = {}
    if facts.get("base_model"):
        meta["base_model"] = facts["base_model"]
        meta["base_model_relation"] = "quantized"
    for key in ("license", "license_name", "license_link", "pipeline_tag", "language"):
        if source_meta.get(key):
            meta[key] = source_meta[key]
    # library_name "transformers": the weights keep the Transformers layout and config.json, which is
    # what the Hub keys its vLLM / SGLang / TensorRT-LLM deploy snippets on.
    meta["library_name"] = "transformers"
    meta["tags"] = list(dict.fromkeys(tags))
    return meta


def serve_lines(facts: dict, repo: str) -> list[str]:
    """Shell lines that serve this checkpoint, for the loaders that take its algorithm and format."""
    algos = set(facts["algos"])
    fmt = facts.get("format", "modelopt")
    if facts.get("layout") not in (None, "plain"):
        return [f"# packed '{facts['layout']}' layout: no stock loader reads it (docs/layouts.md);",
                "# serve the plain checkpoint instead:", f"quantize unpack {repo} -o plain-checkpoint"]
    kv = " --kv-cache-dtype fp8" if facts.get("kv_cache_dtype") else ""
    lines = []
    # Only what was checked: one ModelOpt algorithm per checkpoint for TensorRT-LLM and SGLang; a mix
    # of algorithms (vLLM's modelopt_mixed) or another format (compressed-tensors, vLLM's own) -> vLLM.
    single = len(algos) == 1 and fmt == "modelopt"
    if algos <= _VLLM or fmt != "modelopt":
        lines.append(f"vllm serve {repo}{kv}   # vLLM reads the quantization from config.json")
    if single and algos <= _TRTLLM:
        lines.append(f"trtllm-serve {repo}   # TensorRT-LLM reads hf_quant_config.json")
    if single and algos <= _SGLANG:
        lines.append(f"python -m sglang.launch_server --model-path {repo}")
    return lines or [f"# no stock loader is known to serve {', '.join(sorted(algos))} in this format"]


def render_card(facts: dict, source_card: str | None = None, repo: str | None = None) -> str:
    """The README.md text: front matter, our sections, then the source card's body (if any)."""
    from huggingface_hub import ModelCardData

    source_meta, source_body = _split_source_card(source_card)
    meta = ModelCardData(**front_matter(facts, source_meta)).to_yaml()
    where = repo or "path/to/this/checkpoint"
    algos = facts["algos"]
    title = (facts.get("base_model") or os.path.basename(str(facts["source"]).rstrip("/")) or "model") + " " + "/".join(algos)
    out = [f"---\n{meta}\n---", f"# {title}", ""]
    base = facts.get("base_model")
    origin = f"[{base}](https://huggingface.co/{base})" if base else f"`{facts['source']}`"
    out += [f"A quantized version of {origin}, written by quantize {facts['tool']['version']} "
            f"in the NVIDIA ModelOpt checkpoint format (`quant_method: modelopt`)."
            if facts["format"] == "modelopt" else
            f"A quantized version of {origin}, written by quantize {facts['tool']['version']} in the {facts['format']} format.", ""]
    out += ["## How it was made", "", "```bash", facts["command"], "```", ""]
    out += ["| | |", "|---|---|"]
    for algo, count in algos.items():
        out.append(f"| algorithm | `{algo}` on {count} Linear layer(s): {_DESCRIBE.get(algo, algo)} |")
    out.append(f"| format | {facts['format']} (`quant_algo: {facts['quant_algo']}` in hf_quant_config.json and config.json) |"
               if facts["format"] == "modelopt" else
               f"| format | {facts['format']} (`quantization_config` in config.json) |")
    out.append(f"| layout | {facts.get('layout') or 'plain'} |")
    out.append(f"| KV cache | {'FP8 (cast, no scales)' if facts.get('kv_cache_dtype') else 'unquantized'} |")
    sizes = facts["sizes"]
    ratio = f" ({sizes['in'] / sizes['out']:.2f}x smaller)" if sizes.get("out") else ""
    out.append(f"| size | {_gb(sizes['in'])} before, {_gb(sizes['out'])} after{ratio} |")
    out += ["", *_calibration_section(facts.get("calibration")), *_excluded_section(facts), *_verify_section(facts.get("verify"))]
    out += [_serve_block(facts, where), _MARKER, ""]
    if source_body:
        out += [_SOURCE_HEADING, "", source_body, ""]
    return "\n".join(out)


def _serve_block(facts: dict, where: str) -> str:
    return "\n".join([_SERVE_START, "## Serve it", "", "```bash", *serve_lines(facts, where), "```", ""])


def retarget_card(folder: str, facts: dict, repo: str) -> bool:
    """Point the card's serve lines at Hub repo `repo` (``quantize push``); False when there is no card of ours."""
    path = os.path.join(folder, CARD_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    if _SERVE_START not in text or _MARKER not in text:
        return False
    head, rest = text.split(_SERVE_START, 1)
    _, tail = rest.split(_MARKER, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + _serve_block(facts, repo) + "\n" + _MARKER + tail)
    return True


def mark_unpacked(folder: str, quant_config: dict, packed_from: str) -> None:
    """After ``quantize unpack``: the copied card says the layout is now plain and serves it as such."""
    from .publish import serve_facts

    facts = {**serve_facts(quant_config), "layout": "plain"}
    if not retarget_card(folder, facts, "path/to/this/checkpoint"):
        return
    path = os.path.join(folder, CARD_NAME)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"^\| layout \| .* \|$", f"| layout | plain (unpacked from `{packed_from}` with `quantize unpack`) |", text,
                  count=1, flags=re.M)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _gb(n: int) -> str:
    from .report import human_bytes

    return human_bytes(n)


def _calibration_section(cal: dict | None) -> list[str]:
    lines = ["## Calibration", ""]
    if cal is None:
        lines.append("None needed: no static activation scale (weights only, or dynamic activation scales at serve time).")
    elif cal.get("calibrated"):
        lines.append(f"Calibrated on `{cal.get('dataset')}`: {cal.get('samples')} sample(s) of {cal.get('seq_len')} token(s).")
    else:
        value = cal.get("input_scale")
        shown = f"{value:g}" if isinstance(value, (int, float)) else str(value)
        lines.append(f"Not calibrated: every `input_scale` is {shown}, {cal.get('note', 'a calibration-free constant')}.")
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


def write_card(folder: str, facts: dict, repo: str | None = None) -> str:
    """Write ``README.md`` into `folder`, keeping a README.md already there (the source's) below ours."""
    path = os.path.join(folder, CARD_NAME)
    source = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
    text = render_card(facts, source, repo)
    from ..checkpoint.durable import write_atomic

    write_atomic(path, text.encode("utf-8"))  # fsynced: DST is published by a rename right after
    return path


def write_conversion_card(plan, folder: str, verified, src: str, dst: str, repo: str | None, flags: dict) -> None:
    """convert: write the card of `plan`'s output into work folder `folder`, before DST is published.

    `verified`: --verify's VerifyResult or None; `repo`: --push-to-hub or None; `flags`: convert's
    other keywords (for the command line).
    """
    from ..errors import DestinationError

    from ..formats import format_of

    command = command_line(src, dst, **{**flags, "algo": plan.scheme.algo, "push_to_hub": repo})
    try:
        write_card(folder, card_facts(plan, command, verified, fmt=format_of(plan.scheme)), repo or dst)
    except OSError as exc:
        raise DestinationError(f"{folder}/README.md: cannot write the model card ({exc.strerror}); check space and permissions") from exc
