"""One home per fact (docs/architecture.md), read from the sources as tests/test_architecture.py does:
files are written atomically and durably by checkpoint/durable.py only (issue 35)."""

from __future__ import annotations

import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "quantize_cli"
DURABLE = "checkpoint/durable.py"
# save_file of the embedded examples: a cache generated into a temporary folder renamed whole
SAVE_FILE_OK = {"checkpoint/example_weights.py"}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/")[0] in ("kernels", "recipes"):
            continue
        yield rel, path.read_text(encoding="utf-8")


def test_files_are_replaced_only_by_the_durable_writer():
    """A temporary file renamed over the real one without an fsync can be empty after a crash:
    calibration/weights_file.py and calibration/channels.py did so; durable.write_atomic fsyncs."""
    offenders = [f"{rel}:{text[:m.start()].count(chr(10)) + 1}" for rel, text in _sources() if rel != DURABLE
                 for m in re.finditer(r"\bos\.replace\(", text)]
    offenders += [f"{rel}:{text[:m.start()].count(chr(10)) + 1}" for rel, text in _sources() if rel not in SAVE_FILE_OK
                  for m in re.finditer(r"\bsave_file\(", text)]
    assert not offenders, f"write files with checkpoint/durable.py's write_atomic / write_json: {offenders}"


# Literal tables of --algo names outside ALGORITHMS (algorithms.py) and the scheme registry
# (schemes/__init__.py) are forbidden: a fact about an algorithm is a field of the Algorithm, of the
# scheme / format / layout object that owns it (issue 35). The three that stay, and why:
KNOWN_TABLES = {
    # PRESETS: llm-compressor's own preset table (compressed_tensors.quantization), keyed by *preset* name;
    # three presets happen to be named like algorithms (FP8, NVFP4, MXFP8). CT_SCHEMES maps algorithm -> preset.
    "formats/ct_config.py": 1,
    # SERVED: the ModelOpt format object's table of what serves each algorithm in it, the one home that
    # docs/architecture.md names (its schemes are the shared ones in schemes/, which know no engines).
    "formats/modelopt.py": 1,
    # layout_metadata's Marlin "kernels": labels of a record written into config.json ("FP8*", "MXFP8 MoE"),
    # not a lookup; rebuilding it elsewhere would only move the bytes of a document.
    "layouts/__init__.py": 1,
}
HOMES = {"algorithms.py", "schemes/__init__.py"}


def _algorithm_tables() -> dict[str, list[int]]:
    """file -> lines of dict / set / list / tuple literals naming two or more algorithms."""
    import ast

    from quantize_cli.algorithms import ALGORITHMS

    out: dict[str, list[int]] = {}
    for rel, text in _sources():
        if rel in HOMES:
            continue
        for node in ast.walk(ast.parse(text)):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None) if isinstance(
                node, (ast.Set, ast.List, ast.Tuple)) else None
            if items and sum(isinstance(e, ast.Constant) and e.value in ALGORITHMS for e in items) >= 2:
                out.setdefault(rel, []).append(node.lineno)
    return out


def test_no_new_table_of_algorithms_outside_their_home():
    found = _algorithm_tables()
    stale = {rel: n for rel, n in KNOWN_TABLES.items() if len(found.get(rel, [])) < n}
    assert not stale, f"KNOWN_TABLES allows tables that are gone: {stale}; lower the allowance"
    grown = {rel: lines for rel, lines in found.items() if len(lines) > KNOWN_TABLES.get(rel, 0)}
    assert not grown, (f"a table of algorithm names outside ALGORITHMS: {grown}; add a field to the Algorithm "
                       "(algorithms.py) or the scheme / format object and look it up there")


def test_no_algorithm_decided_by_a_substring_of_its_name():
    """smooth.py chose FP8_PB_WO's 128-column blocks by ``"PB" in algo``; schemes carry ``k_group``.
    eval's Hopper weight-only table is the Algorithm's ``blackwell_kernels``."""
    offenders = [f"{rel}:{text[:m.start()].count(chr(10)) + 1}" for rel, text in _sources()
                 for m in re.finditer(r'"(?:PB|FP4|FP8|INT4|MX)" in (?:getattr\(|\w*algo)', text)]
    assert not offenders, offenders
    assert "_HOPPER_WEIGHT_ONLY" not in (PACKAGE / "eval" / "__init__.py").read_text()


FORMAT_NAME_OK: set[str] = set()  # none: every module asks the format object
_FORMAT_NAME = r"""["'](?:modelopt|compressed[-_]tensors)["']"""
_COMPARED = re.compile(rf"(?:==|!=|\bin)\s*\(?[^\n]*?{_FORMAT_NAME}|{_FORMAT_NAME}\s*(?:==|!=|\bin\b)")


def format_name_comparisons(rel: str, text: str) -> list[str]:
    """`rel:line` of every comparison of a string with a format's name (``fmt.name == "modelopt"``,
    ``format != "compressed-tensors"``, ``fmt in ("modelopt", ...)``) in the source `text`."""
    return [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1)
            if _COMPARED.search(line.split("#", 1)[0])]


def test_the_format_is_asked_never_named():
    """Outside formats/ a format is an object whose attributes and methods say what differs
    (formats/base.py); the card, eval and convert once tested ``fmt.name == "compressed-tensors"``."""
    offenders = [hit for rel, text in _sources() if not rel.startswith("formats/") and rel not in FORMAT_NAME_OK
                 for hit in format_name_comparisons(rel, text)]
    assert not offenders, f"a format decided by its name: {offenders}; ask the format object (formats/base.py)"


def test_the_format_name_check_finds_each_spelling():
    hits = format_name_comparisons("x.py", 'a = fmt.name == "modelopt"\nb = "compressed-tensors" != f\n'
                                           'c = f in ("modelopt", "x")\nd = fmt.scheme(a)  # "modelopt" == it\n'
                                           'e = format_named("modelopt")\n')
    assert hits == ["x.py:1", "x.py:2", "x.py:3"]
