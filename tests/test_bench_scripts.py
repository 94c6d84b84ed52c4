"""The bench scripts run on the GPU machine, never in CI: at least their calls into the library must
match it. ``api.convert`` takes one ConvertOptions (the redesign); a bench still passing keywords
fails only on the GPU machine, in a lease's limited time (three did, found by hand)."""

from __future__ import annotations

import ast
import os

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
SCRIPTS = sorted(f for f in os.listdir(BENCH) if f.endswith(".py"))


def _convert_calls(tree: ast.AST, imported: set[str]):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr == "convert" and isinstance(f.value, ast.Name) and f.value.id == "api") or \
                (isinstance(f, ast.Name) and f.id in imported):
            yield node


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_calls_convert_with_one_convert_options(script):
    tree = ast.parse(open(os.path.join(BENCH, script)).read(), script)
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "quantize_cli.api"
                for a in n.names if a.name == "convert"}
    bad = []
    for call in _convert_calls(tree, imported):
        arg = call.args[0] if len(call.args) == 1 and not call.keywords else None
        name = getattr(getattr(arg, "func", None), "id", None) or getattr(getattr(arg, "func", None), "attr", None)
        if name != "ConvertOptions":
            bad.append(f"{script}:{call.lineno}")
    assert not bad, f"api.convert takes one ConvertOptions (quantize_cli/plan/options.py): {bad}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_bench_subprocess_has_a_timeout(script):
    """A benchmark command that hangs must end (issue 25: a Ray head blocked on its pipe held a run for
    8 minutes): every ``subprocess.run`` / ``proc.run`` call in a bench script passes ``timeout=``, or is
    proc.run (its default, bench/proc.py). Wrapper code inside strings (run under a timed parent) is not parsed."""
    tree = ast.parse(open(os.path.join(BENCH, script)).read(), script)
    bad = []
    for node in ast.walk(tree):
        f = node.func if isinstance(node, ast.Call) else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in {
                ("subprocess", "run"), ("subprocess", "call"), ("subprocess", "check_call"), ("subprocess", "check_output")}:
            if not any(k.arg == "timeout" for k in node.keywords):
                bad.append(f"{script}:{node.lineno}")
    assert not bad, f"a bench subprocess without timeout= (or use bench/proc.py's run): {bad}"


def _top_level_names(path: str) -> set[str]:
    names = set()
    for node in ast.parse(open(path).read(), path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_imports_from_sibling_scripts_exist(script):
    """``from calib_accuracy import act_nvfp4`` outlived the function it named (two scripts failed at
    import on the day they were needed): every name a bench script imports from another bench script
    is defined at that script's top level."""
    tree = ast.parse(open(os.path.join(BENCH, script)).read(), script)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and f"{node.module}.py" in SCRIPTS:
            defined = _top_level_names(os.path.join(BENCH, f"{node.module}.py"))
            bad += [f"{script}:{node.lineno} {node.module}.{a.name}" for a in node.names if a.name not in defined]
    assert not bad, f"imported from a bench script that does not define it: {bad}"
