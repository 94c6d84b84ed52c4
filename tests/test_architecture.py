"""The house: data flows one way, so imports point down the stages and no two modules import each other.

Read from the code's import statements (imports inside functions count: they still tie modules
together), never by importing. docs/architecture.md draws the same stages.
"""

from __future__ import annotations

import ast
import os

import quantize_cli

ROOT = os.path.dirname(os.path.dirname(quantize_cli.__file__))
PACKAGE = "quantize_cli"

# Each top-level room of quantize_cli and its stage: a module may import its own stage or lower ones.
STAGES = {
    0: ("algorithms", "errors", "problems", "jsonfile", "console", "devices", "repo_id", "signals"),
    1: ("checkpoint",),
    2: ("modules", "schemes"),
    3: ("kernels", "layouts"),
    4: ("formats", "calibration"),
    5: ("plan",),
    6: ("run", "verify", "eval"),
    7: ("output", "unpack", "inspect_checkpoint"),
    8: ("convert",),
    9: ("api",),
    10: ("cli", "__main__", ""),  # "": the package itself (its lazy attributes reach api)
}
STAGE = {room: stage for stage, rooms in STAGES.items() for room in rooms}


def _modules() -> dict[str, str]:
    out = {}
    base = os.path.join(ROOT, PACKAGE)
    for folder, _, files in os.walk(base):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                out[name] = path
    kernels = os.path.join(ROOT, "kernels")  # shipped as quantize_cli.kernels
    for f in os.listdir(kernels):
        if f.endswith(".py"):
            out[f"{PACKAGE}.kernels" + ("" if f == "__init__.py" else "." + f[:-3])] = os.path.join(kernels, f)
    return out


def _edges(mods: dict[str, str]) -> dict[str, set[str]]:
    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for target in names:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def _room(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_room_has_a_stage():
    rooms = {_room(m) for m in _modules()}
    assert rooms <= set(STAGE), f"rooms without a stage in this test (and docs/architecture.md): {sorted(rooms - set(STAGE))}"


def test_imports_point_down_the_stages():
    graph = _edges(_modules())
    up = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if STAGE[_room(t)] > STAGE[_room(m)])
    assert not up, "imports running back up the stages:\n" + "\n".join(up)


def test_no_import_circle():
    graph = _edges(_modules())
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                circles.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_checks_can_fail(tmp_path):
    """The graph reader sees relative imports, imports inside functions and package imports."""
    graph = _edges(_modules())
    assert f"{PACKAGE}.plan.steps" in graph[f"{PACKAGE}.convert"]  # top-level relative import
    assert f"{PACKAGE}.run.ray_executor" in graph[f"{PACKAGE}.convert"]  # imported inside a function
    assert f"{PACKAGE}.schemes.search" in graph[f"{PACKAGE}.schemes.searched"]  # inside a method
