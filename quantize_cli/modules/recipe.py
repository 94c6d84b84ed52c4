"""Recipes: per-model-family data (fused groups, default exclusions, routers, MoE layout).

Recipes are YAML files in ``recipes/`` (shipped as ``quantize_cli.recipes``). They are the ONE
table of fused groups: the plan, validation, ``check`` and ``verify`` all read it from here.
A recipe may ``extends:`` another (lists are appended, mappings merged, scalars overridden).
Patterns are fnmatch (``*`` spans dots), never regex. See ``docs/recipes.md``.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from ..errors import PlanError, UsageError

_KNOWN_KEYS = {"name", "description", "model_types", "extends", "fused", "exclude", "routers", "subtrees", "experts", "parallel"}


@dataclass(frozen=True)
class Rule:
    """A module pattern with the reason shown when it decides something."""

    pattern: str
    reason: str

    def matches(self, module: str) -> bool:
        return fnmatch.fnmatchcase(module, self.pattern)


@dataclass(frozen=True)
class Recipe:
    """A resolved recipe (after ``extends``)."""

    name: str
    description: str = ""
    model_types: tuple[str, ...] = ()
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    exclude: tuple[Rule, ...] = ()
    routers: tuple[str, ...] = ()
    subtrees: tuple[Rule, ...] = ()
    experts: dict = field(default_factory=dict)
    parallel: dict = field(default_factory=dict)
    source: str = ""

    def member_to_fused(self) -> dict[str, str]:
        """Member module name -> fused vLLM name (``q_proj`` -> ``qkv_proj``)."""
        return {m: fused for fused, members in self.fused.items() for m in members}

    def is_router(self, module: str) -> bool:
        return any(fnmatch.fnmatchcase(module, p) for p in self.routers)

    def excluded_by(self, module: str) -> Rule | None:
        return next((r for r in self.exclude if r.matches(module)), None)


def _builtin_dir():
    return resources.files("quantize_cli.recipes")


@lru_cache(maxsize=None)
def _builtin_raw() -> dict[str, dict]:
    out = {}
    for entry in _builtin_dir().iterdir():
        if entry.name.endswith(".yaml"):
            out[entry.name[:-5]] = _parse_yaml(entry.read_text(), f"recipes/{entry.name}")
    return out


def _parse_yaml(text: str, where: str) -> dict:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanError(f"{where}: not valid YAML ({exc}); fix the recipe file") from exc
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: a recipe must be a YAML mapping; see docs/recipes.md")
    unknown = set(raw) - _KNOWN_KEYS
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_KNOWN_KEYS)} (docs/recipes.md)")
    return raw


def builtin_names() -> list[str]:
    """Names of the shipped recipes, sorted."""
    return sorted(_builtin_raw())


def _merge(base: dict, child: dict) -> dict:
    out = dict(base)
    for key, value in child.items():
        if key in ("exclude", "routers", "subtrees") and key in base:
            out[key] = list(base[key] or []) + list(value or [])
        elif key in ("fused", "experts", "parallel") and key in base:
            out[key] = {**(base[key] or {}), **(value or {})}
        else:
            out[key] = value
    return out


def _resolve_raw(raw: dict, where: str, seen: tuple[str, ...] = ()) -> dict:
    parent = raw.get("extends")
    if not parent:
        return raw
    if parent in seen:
        raise PlanError(f"{where}: recipe inheritance loops through {parent!r}; remove the cycle")
    base = _builtin_raw().get(parent)
    if base is None:
        raise PlanError(f"{where}: extends unknown recipe {parent!r}; known: {', '.join(builtin_names())}")
    return _merge(_resolve_raw(base, f"recipes/{parent}.yaml", seen + (parent,)), raw)


def _rules(items, key: str, where: str) -> tuple[Rule, ...]:
    rules = []
    for item in items or []:
        if isinstance(item, str):
            rules.append(Rule(item, f"recipe {key} pattern {item!r}"))
        elif isinstance(item, dict) and isinstance(item.get("pattern"), str):
            rules.append(Rule(item["pattern"], str(item.get("reason") or f"recipe {key} pattern {item['pattern']!r}")))
        else:
            raise PlanError(f"{where}: each {key} entry must be a pattern string or {{pattern, reason}}, got {item!r}")
    return tuple(rules)


def _build(raw: dict, where: str) -> Recipe:
    raw = _resolve_raw(raw, where)
    fused = raw.get("fused") or {}
    if not isinstance(fused, dict) or not all(
        isinstance(v, list) and v and all(isinstance(m, str) for m in v) for v in fused.values()
    ):
        raise PlanError(f"{where}: 'fused' must map a fused name to a list of member module names")
    return Recipe(
        name=str(raw.get("name") or os.path.basename(where).removesuffix(".yaml")),
        description=str(raw.get("description") or ""),
        model_types=tuple(raw.get("model_types") or ()),
        fused={k: tuple(v) for k, v in fused.items()},
        exclude=_rules(raw.get("exclude"), "exclude", where),
        routers=tuple(raw.get("routers") or ()),
        subtrees=_rules(raw.get("subtrees"), "subtrees", where),
        experts=dict(raw.get("experts") or {}),
        parallel={k: tuple(v or ()) for k, v in (raw.get("parallel") or {}).items()},
        source=where,
    )


def load_recipe(name_or_path: str | None, model_type: str | None = None) -> Recipe:
    """Resolve ``--recipe`` (a shipped name or a YAML file), else the recipe for `model_type`.

    Example: ``load_recipe(None, "llama").name == "llama"``; an unknown model type gets ``default``.
    """
    if name_or_path:
        if name_or_path in _builtin_raw():
            return _build(_builtin_raw()[name_or_path], f"recipes/{name_or_path}.yaml")
        if os.path.isfile(name_or_path):
            try:
                with open(name_or_path, encoding="utf-8") as f:
                    text = f.read()
            except UnicodeDecodeError as exc:
                raise PlanError(f"{name_or_path}: the recipe is not UTF-8 text ({exc.reason} at byte {exc.start}); fix the recipe file") from None
            except OSError as exc:
                raise PlanError(f"{name_or_path}: cannot read the recipe ({exc.strerror}); check the path and permissions") from None
            return _build(_parse_yaml(text, name_or_path), name_or_path)
        raise UsageError(
            f"--recipe {name_or_path!r} is neither a shipped recipe ({', '.join(builtin_names())}) nor a file"
        )
    for name, raw in sorted(_builtin_raw().items()):
        if model_type and model_type in (raw.get("model_types") or ()):
            return _build(raw, f"recipes/{name}.yaml")
    return _build(_builtin_raw()["default"], "recipes/default.yaml")


def recipe_record(r: Recipe) -> dict:
    """The resolved recipe as plain data, recorded in an output's hf_quant_config.json (``converter.recipe``)."""
    doc = {
        "name": r.name,
        "fused": {k: list(v) for k, v in r.fused.items()},
        "exclude": [{"pattern": x.pattern, "reason": x.reason} for x in r.exclude],
        "routers": list(r.routers),
        "subtrees": [{"pattern": x.pattern, "reason": x.reason} for x in r.subtrees],
        "experts": r.experts,
        "parallel": {k: list(v) for k, v in r.parallel.items()},
    }
    return doc


def recipe_of_output(nested: dict | None, model_type: str | None, where: str) -> Recipe:
    """The recipe an output was converted with: the record in its hf_quant_config.json, else (an
    older or foreign output) the recipe for `model_type`."""
    record = ((nested or {}).get("converter") or {}).get("recipe") if isinstance((nested or {}).get("converter"), dict) else None
    if record is None:
        return load_recipe(None, model_type)
    if not isinstance(record, dict) or "extends" in record:
        raise PlanError(f"{where}: converter.recipe must be a resolved recipe mapping; re-convert or remove the record")
    return _build(_parse_dict(record, where), where)


def _parse_dict(raw: dict, where: str) -> dict:
    unknown = set(raw) - _KNOWN_KEYS
    if unknown:
        raise PlanError(f"{where}: converter.recipe has unknown key(s) {sorted(unknown)}; re-convert or remove the record")
    return raw


def describe(name_or_path: str) -> str:
    """The resolved recipe as YAML (what ``quantize recipes show NAME`` prints)."""
    if name_or_path not in _builtin_raw() and not os.path.isfile(name_or_path):
        users = [n for n, raw in sorted(_builtin_raw().items()) if name_or_path in (raw.get("model_types") or ())]
        hint = (f"model_type {name_or_path!r} converts with recipe {users[0]!r}: quantize recipes show {users[0]}" if users
                else f"a checkpoint of model_type {name_or_path!r} converts with the 'default' recipe: quantize recipes show default")
        raise UsageError(f"recipes show {name_or_path}: no shipped recipe and no file of that name ({hint}; "
                         f"the recipes: {', '.join(builtin_names())})")
    r = load_recipe(name_or_path)
    doc = {
        "name": r.name,
        "description": r.description,
        "model_types": list(r.model_types),
        "fused": {k: list(v) for k, v in r.fused.items()},
        "exclude": [{"pattern": x.pattern, "reason": x.reason} for x in r.exclude],
        "routers": list(r.routers),
        "subtrees": [{"pattern": x.pattern, "reason": x.reason} for x in r.subtrees],
    }
    if r.experts:
        doc["experts"] = r.experts
    if r.parallel:
        doc["parallel"] = {k: list(v) for k, v in r.parallel.items()}
    return f"# {r.source}\n" + yaml.safe_dump(doc, sort_keys=False)
