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


def _bench_module(name: str):
    import importlib.util
    import sys

    sys.path.insert(0, BENCH)  # bench scripts import their siblings (proc.py)
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(BENCH)


def test_scale_gpu_runs_any_gpu_count_named_by_its_real_n(capsys):
    """Issue 34's leftover: scale_gpu.py ran 1 and 2 GPUs only and called its all-GPU Ray run "ray-2"."""
    sg = _bench_module("scale_gpu")
    assert sg.parse(["--gpus", "1", "2", "4"]).gpus == [1, 2, 4] and sg.parse([]).gpus is None
    with pytest.raises(SystemExit):
        sg.parse(["--gpus", "0"])
    runs = sg.multi_runs([1, 2, 4], 2, cpu=False)
    assert runs == [("ray-2", ["--executor", "ray", "--device", "cuda"], {"CUDA_VISIBLE_DEVICES": "0,1"}),
                    ("local-2", ["--device", "cuda:0,cuda:1"], None)]
    assert "--gpus 4: this machine has 2; skipped" in capsys.readouterr().out
    names = [r[0] for r in sg.multi_runs(None, 8, cpu=False, skip={"local-8"})]
    assert names == ["ray-8"]  # the default: every GPU, named by its real count
    assert sg.multi_runs([4], 4, cpu=True)[1] == ("local-4", ["--device", "cpu,cpu,cpu,cpu"], None)
    assert sg.multi_runs([1], 8, cpu=False) == []  # 1 GPU is the local / ray-1 runs


def test_ray_carry_slims_keeps_modes_and_unpacks(tmp_path, capsys):
    """bench/ray_carry.py (issue 34's leftover): the dropped parts go, executables stay executable,
    and the unpack.py it writes (the GPU machine's step) restores the rest."""
    import subprocess
    import sys
    import zipfile

    rc = _bench_module("ray_carry")
    assert rc.main(["--dry-run"]) == 0
    said = capsys.readouterr().out
    assert ("--only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --no-deps" in said
            and f"ray=={rc.VERSION}" in said), said
    wheel = tmp_path / "ray-0-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, mode in [("ray/__init__.py", 0o644), ("ray/core/src/ray/raylet/raylet", 0o755), ("ray/rllib/algo.py", 0o644),
                           ("ray/dashboard/agent.py", 0o644), ("ray/dashboard/client/build/index.html", 0o644),
                           ("ray/_private/tests/test_x.py", 0o644), ("ray-0.dist-info/METADATA", 0o644)]:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            z.writestr(info, b"x")
    out = tmp_path / "carry"
    assert rc.main(["--wheel", str(wheel), "--no-deps", "--out", str(out)]) == 0
    assert "4 files kept, 3 dropped" in capsys.readouterr().out
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, str(out / "unpack.py")], env={**os.environ, "RAYENV": str(site)}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert got == ["ray-0.dist-info/METADATA", "ray/__init__.py", "ray/core/src/ray/raylet/raylet", "ray/dashboard/agent.py"]
    assert os.access(site / "ray/core/src/ray/raylet/raylet", os.X_OK)
    assert rc.requirements(str(wheel)) == []
    header = open(os.path.join(BENCH, "ray_carry.py")).read()
    doc = open(os.path.join(BENCH, "..", "docs", "performance.md")).read()
    line = "python3 .whl-ray/unpack.py && export PYTHONPATH=/tmp/rayenv/site:$PYTHONPATH"
    assert line in header and line in doc  # the machine's lines, where a reader of either looks
