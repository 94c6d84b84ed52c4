"""Which files of the source are copied unchanged into DST (sidecars), by one documented rule.

docs/formats.md ("Files copied from the source") states the rule; in short:

* **Top-level files** are copied, except the weights (``*.safetensors`` and their index, written
  anew), the configs the conversion rewrites (``config.json``, ``hf_quant_config.json``), pickles
  and other weight formats (never read, never copied: only safetensors are trusted) and hidden files.
* **Sub-folders** are copied whole, every regular file at any depth (sentence-transformers'
  ``1_Pooling/``, ``2_Normalize/``; a tokenizer or processor folder), except:

  - a folder that is another export of the model's weights: named like one (``onnx/``,
    ``openvino/``, ...) or holding weights in a format other than safetensors (``*.onnx``,
    ``*.bin``, ``*.gguf``, ...). Those weights are the unquantized source's: copied they would
    contradict the quantized output (re-export from DST if needed);
  - a folder holding safetensors that sentence-transformers' ``modules.json`` does not list as a
    module: another copy of the weights (e.g. ``original/``). The modules it lists (``2_Dense/``:
    a small head outside the transformer, which the conversion does not touch) are copied;
  - hidden folders (``.git``, ``.cache``).

  Each skipped folder is named in one line (an info message, not a warning: the output is
  complete without it).
* Links whose real path leaves SRC are refused, never followed (the Hub cache's blob store
  excepted); anything that is not a regular file is skipped with a warning.
"""

from __future__ import annotations

import json
import os
import re

from ..errors import DestinationError
from .durable import copy_durable

# Top-level names that are never sidecars: weights, their index, the configs we rewrite, other weight formats, hidden files.
NOT_SIDECARS = re.compile(
    r"(.*\.safetensors|.*\.index\.json|config\.json|hf_quant_config\.json|quant_config\.json"
    r"|.*\.(bin|pt|pth|ckpt|pkl|pickle|msgpack|h5|gguf|onnx|ot|npy|npz|joblib|tflite|keras)|\..*)$"
)
# Weights in formats other than safetensors: a folder holding one is an export of the weights.
OTHER_WEIGHTS = re.compile(r".*\.(bin|pt|pth|ckpt|pkl|pickle|msgpack|h5|gguf|onnx|onnx_data|ot|npy|npz|joblib|tflite|keras"
                           r"|mlmodel|mlpackage|engine)$", re.IGNORECASE)
# Folder names of weight exports, skipped even when a Hub fetch brought only their small files.
EXPORT_FOLDERS = frozenset({"onnx", "openvino", "coreml", "tflite", "tf", "flax", "jax", "gguf", "tensorrt", "mlx", "ct2",
                            "ctranslate2", "rknn", "litert"})


def st_modules(root: str, inside) -> set[str]:
    """The folders sentence-transformers' ``modules.json`` lists as modules (``{"2_Dense", ...}``).

    Read only when it is a regular file inside SRC (`inside` refuses a link out of it); a malformed
    one lists nothing (it is copied unchanged, as any sidecar)."""
    path = os.path.join(root, "modules.json")
    if not os.path.isfile(path):
        return set()
    inside(root, "modules.json", root)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return set()
    out = set()
    for entry in doc if isinstance(doc, list) else []:
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and path.strip("/"):
            out.add(path.strip("/").split("/")[0])
    return out


def _files_below(folder: str) -> list[str]:
    """Every file below `folder` (relative, '/'-separated, sorted), hidden folders and files left out."""
    found = []
    for base, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(base, folder)
        for name in files:
            if not name.startswith("."):
                found.append(name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}")
    return sorted(found)


def skip_reason(name: str, files: list[str], modules: set[str]) -> str | None:
    """Why first-level sub-folder `name` (holding `files`) is not copied, or None."""
    if name.lower() in EXPORT_FOLDERS:
        return "an export of the model in another format (unquantized weights)"
    other = next((f for f in files if OTHER_WEIGHTS.match(f)), None)
    if other:
        return f"holds weights in another format ({other}): an export of the unquantized model"
    tensors = next((f for f in files if f.endswith(".safetensors")), None)
    if tensors and name not in modules:
        return f"holds {tensors}, not a sentence-transformers module of modules.json: another copy of the weights"
    return None


def list_sidecars(root: str, inside) -> tuple[list[str], list[str], list[str]]:
    """``(files to copy, warnings, notes)`` for source folder `root` (the rule in the module docstring).

    `inside(root, rel, referrer)`: the source's check that `rel` stays inside SRC (raises otherwise).
    Files are relative, '/'-separated paths (``"1_Pooling/config.json"``)."""
    out, warnings, notes = [], [], []
    modules = st_modules(root, inside)
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not name.startswith("."):
            inside(root, name, root)  # a folder linked from outside SRC is refused, never walked
            files = _files_below(path)
            why = skip_reason(name, files, modules)
            if why:
                notes.append(f"{name}/ not copied to the output: {why}")
                continue
            candidates = [f"{name}/{f}" for f in files]
        elif NOT_SIDECARS.match(name) or os.path.isdir(path):
            continue
        else:
            candidates = [name]
        for rel in candidates:
            full = os.path.join(root, *rel.split("/"))
            if not os.path.isfile(full):
                warnings.append(f"{full}: not a regular file (broken link, FIFO or device); not copied to the output")
                continue
            inside(root, rel, root)  # a link leading out of SRC is refused, never followed
            out.append(rel)
    return out, warnings, notes


def copy_sidecars(root: str, names: list[str], folder: str) -> None:
    """Copy `names` (relative paths from :func:`list_sidecars`) from `root` into `folder`, durably."""
    for rel in names:
        target = os.path.join(folder, *rel.split("/"))
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            copy_durable(os.path.join(root, *rel.split("/")), target)
        except OSError as exc:
            raise DestinationError(f"{rel}: cannot copy sidecar file ({exc.strerror}); check space and permissions") from exc


__all__ = ["list_sidecars", "copy_sidecars", "skip_reason", "st_modules", "NOT_SIDECARS", "EXPORT_FOLDERS"]
