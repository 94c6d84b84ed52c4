"""Source checkpoints: a local folder, a Hub repo id, or ``example:NAME``; headers only, no data.

:func:`open_source` resolves SRC to a folder, reads ``config.json``, the index (or the lone
safetensors files) and every shard header, and validates them against each other: files named by
the index must exist inside the checkpoint, every indexed tensor must be in its shard exactly
once, and an already-quantized checkpoint is refused. Tensor data is never touched here.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from ..errors import SourceError
from .safetensors_io import FLOAT_SOURCE_DTYPES, TensorInfo, read_header

INDEX_NAME = "model.safetensors.index.json"
# Files that are never copied as sidecars: weights, their index, configs we rewrite, pickles
# (never read, never copied: the converter only trusts safetensors) and quantizer state.
_NOT_SIDECARS = re.compile(
    r"(.*\.safetensors|.*\.safetensors\.index\.json|config\.json|hf_quant_config\.json|quant_config\.json"
    r"|.*\.(bin|pt|pth|ckpt|pkl|pickle|msgpack|h5|gguf)|\..*)$"
)
# Patterns fetched from the Hub: weights, index, configs, tokenizer and other small sidecars.
HUB_PATTERNS = ["*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py", "*.md"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass
class Source:
    """A resolved source checkpoint: where it is, its config, tensors and sidecar files."""

    label: str
    root: str
    config: dict
    tensors: dict[str, TensorInfo]
    shard_files: list[str]
    sidecars: list[str] = field(default_factory=list)
    from_hub: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def resolve_path(src: str, revision: str | None = None, quiet: bool = True) -> tuple[str, bool]:
    """Map SRC to a local folder: an existing folder, ``example:NAME``, or a Hub download.

    Returns ``(folder, from_hub)``.
    """
    if src.startswith("example:"):
        from ..example import example_path

        return example_path(src.split(":", 1)[1]), False
    if os.path.isdir(src):
        return os.path.abspath(src), False
    if os.path.exists(src):
        raise SourceError(f"{src}: is a file; SRC must be a checkpoint folder or a Hub repo id (owner/name)")
    if src.startswith((".", "/", "~")) or not _REPO_ID.match(src):
        raise SourceError(f"{src}: no such folder, and not a Hub repo id (owner/name); check the path")
    return _download(src, revision, quiet), True


def _download(repo_id: str, revision: str | None, quiet: bool) -> str:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import disable_progress_bars

        if quiet:
            disable_progress_bars()
        return snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)
    except Exception as exc:  # hub errors come in many types; all mean "cannot get SRC"
        kind = type(exc).__name__
        hint = "check the repo id, your token (HF_TOKEN) and network, or use HF_HUB_OFFLINE=1 with a cached copy"
        raise SourceError(f"{repo_id}: cannot fetch from the Hugging Face Hub ({kind}: {_first_line(exc)}); {hint}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def _inside(root: str, rel: str, allow_hub_links: bool) -> str:
    """The real path of `rel` inside `root`, refusing anything that escapes the checkpoint."""
    if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        raise SourceError(f"{root}: index names {rel!r}, a path outside the checkpoint; fix the index")
    path = os.path.join(root, rel)
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    if allow_hub_links:
        # A Hub cache snapshot links into the repo's own blob store: <repo>/snapshots/<rev>/f -> <repo>/blobs/x
        base = os.path.dirname(os.path.dirname(base))
    if os.path.commonpath([real, base]) != base:
        raise SourceError(f"{path}: resolves to {real}, outside the checkpoint; refusing to read it")
    return path


def _load_json(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise SourceError(f"{path}: {what} is missing; a Hugging Face checkpoint needs it") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{path}: {what} is not valid JSON ({exc}); fix or re-download it") from exc
    except OSError as exc:
        raise SourceError(f"{path}: cannot read {what} ({exc.strerror}); check permissions") from exc
    if not isinstance(doc, dict):
        raise SourceError(f"{path}: {what} must be a JSON object; fix or re-download it")
    return doc


def _shard_names(root: str) -> tuple[list[str], dict | None]:
    index_path = os.path.join(root, INDEX_NAME)
    if os.path.exists(index_path):
        index = _load_json(index_path, "the safetensors index")
        wmap = index.get("weight_map")
        if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
            raise SourceError(f"{index_path}: 'weight_map' must map tensor names to shard files; fix the index")
        return sorted(set(wmap.values())), wmap
    files = sorted(f for f in os.listdir(root) if f.endswith(".safetensors"))
    if not files:
        raise SourceError(f"{root}: no *.safetensors files (and no {INDEX_NAME}); only safetensors checkpoints are read")
    return files, None


def open_source(src: str, revision: str | None = None, quiet: bool = True) -> Source:
    """Resolve and read SRC's config and headers; raise :class:`SourceError` on anything malformed."""
    root, from_hub = resolve_path(src, revision, quiet)
    config = _load_json(os.path.join(root, "config.json"), "config.json")
    names, wmap = _shard_names(root)
    tensors: dict[str, TensorInfo] = {}
    owner: dict[str, str] = {}
    warnings: list[str] = []
    for name in names:
        path = _inside(root, name, from_hub)
        if not os.path.isfile(path):
            raise SourceError(f"{path}: shard named by the index is missing; re-download the checkpoint")
        header = read_header(path, display=os.path.join(src, name) if not from_hub else f"{src}:{name}")
        for tname, info in header.tensors.items():
            if tname in owner:
                raise SourceError(f"tensor {tname!r} is in both {owner[tname]} and {name}; the checkpoint is inconsistent")
            owner[tname] = name
            tensors[tname] = info
    if wmap is not None:
        for tname, fname in sorted(wmap.items()):
            if owner.get(tname) != fname:
                where = f"in {owner[tname]}" if tname in owner else "in no shard"
                raise SourceError(f"{INDEX_NAME}: tensor {tname!r} is indexed to {fname} but is {where}; fix the index")
        extra = sorted(set(tensors) - set(wmap))
        if extra:
            warnings.append(f"{len(extra)} tensor(s) are in shards but not in the index (kept): {', '.join(extra[:5])}")
    if not tensors:
        raise SourceError(f"{src}: the checkpoint holds no tensors")
    source = Source(src, root, config, tensors, names, _sidecars(root, from_hub), from_hub, warnings)
    refuse_quantized(source)
    return source


def _sidecars(root: str, from_hub: bool) -> list[str]:
    out = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if _NOT_SIDECARS.match(name) or not os.path.isfile(path):
            continue
        _inside(root, name, from_hub)  # a link leading out of SRC is refused, not copied
        out.append(name)
    return out


def refuse_quantized(source: Source) -> None:
    """Refuse a checkpoint that is already quantized (config block or quantized Linear weights)."""
    qc = source.config.get("quantization_config")
    if qc:
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        raise SourceError(
            f"{source.label}: config.json already has a quantization_config (quant_method {method!r}); "
            "convert from the original bf16/fp16/fp32 checkpoint"
        )
    if os.path.exists(os.path.join(source.root, "hf_quant_config.json")):
        raise SourceError(f"{source.label}: hf_quant_config.json present, the checkpoint is already quantized; use the bf16 original")
    for t in source.tensors.values():
        if t.leaf in ("weight_scale", "weight_scale_inv", "weight_scale_2", "qweight", "weight_packed"):
            raise SourceError(
                f"{source.label}: tensor {t.name!r} is a quantization scale/packed weight; the checkpoint is already quantized; use the bf16 original"
            )
        if t.leaf == "weight" and len(t.shape) == 2 and t.dtype not in FLOAT_SOURCE_DTYPES and t.dtype in ("F8_E4M3", "F8_E5M2", "I8", "U8"):
            raise SourceError(
                f"{source.label}: Linear weight {t.name!r} is {t.dtype}, already quantized; convert from the bf16/fp16/fp32 original"
            )
