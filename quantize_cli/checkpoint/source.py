"""Source checkpoints: a local folder, a Hub repo id, or ``example:NAME``; headers only, no data.

:func:`open_source` resolves SRC to a folder, reads ``config.json``, the index (or the lone
safetensors files) and every shard header, and validates them against each other: files named by
the index must exist inside the checkpoint, every indexed tensor must be in its shard exactly
once, and an already-quantized checkpoint is refused. Tensor data is never touched here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import SourceError
from ..jsonfile import JsonFileError, first_line, load_json
from ..repo_id import is_repo_id, local_reason
from .safetensors_header import FLOAT_SOURCE_DTYPES, TensorInfo, read_header

INDEX_NAME = "model.safetensors.index.json"
# config.json and the index are read whole; anything larger is not a checkpoint's JSON.
# Patterns fetched from the Hub: weights, index, configs, tokenizer and other small sidecars.
HUB_PATTERNS = ["*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py", "*.md"]


@dataclass(frozen=True)
class Source:
    """A resolved source checkpoint: where it is, its config, tensors and sidecar files (frozen)."""

    label: str
    root: str
    config: dict
    tensors: dict[str, TensorInfo]
    shard_files: list[str]
    sidecars: list[str] = field(default_factory=list)
    from_hub: bool = False
    warnings: list[str] = field(default_factory=list)
    revision: str | None = None  # the Hub commit the headers were read at (--low-disk pins it)
    notes: list[str] = field(default_factory=list)  # info lines: source folders not copied, and why (sidecars.py)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def resolve_path(src: str, revision: str | None = None, quiet: bool = True) -> tuple[str, bool]:
    """Map SRC to a local folder: an existing folder, ``example:NAME``, or a Hub download.

    Returns ``(folder, from_hub)``.
    """
    if src.startswith("example:"):
        from .examples import example_path

        return example_path(src.split(":", 1)[1]), False
    if os.path.isdir(src):
        return os.path.abspath(src), False
    refuse_missing(src)
    return _download(src, revision, quiet), True


def refuse_missing(src: str) -> None:
    """Refuse a SRC that is not a folder (a file, or a path that does not exist) unless it is a
    Hub repo id; nothing is read (``convert`` calls it before importing torch: plan/preflight.py)."""
    if os.path.isdir(src):
        return
    if os.path.exists(src):
        raise SourceError(f"{src}: is a file; SRC must be a checkpoint folder or a Hub repo id (owner/name)")
    if not is_repo_id(src, owner_required=False):
        raise SourceError(f"{src}: no such folder, and not a Hub repo id (owner/name); check the path")
    reason = local_reason(src)
    if reason:
        raise SourceError(f"{src}: no such folder ({reason}, so it is not looked up on the Hub); check the path")


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
        raise SourceError(f"{repo_id}: cannot fetch from the Hugging Face Hub ({kind}: {first_line(exc)}); {hint}") from exc


def _short(value: object, limit: int = 120) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hub_blobs(root: str) -> str | None:
    """``<repo>/blobs`` when `root` is a Hub cache snapshot (``<repo>/snapshots/<rev>``), else None.

    The cache's own files are links from the snapshot into the repo's blob store; those links
    are the one way out of SRC that is allowed.
    """
    real = os.path.realpath(root)
    parent = os.path.dirname(real)
    if os.path.basename(parent) != "snapshots":
        return None
    blobs = os.path.join(os.path.dirname(parent), "blobs")
    return blobs if os.path.isdir(blobs) and not os.path.islink(blobs) else None


def _inside(root: str, rel: str, referrer: str) -> str:
    """The path of `rel` inside `root`, refusing anything that leads out of the checkpoint.

    `rel` must be a plain relative path (no ``..``, not absolute, normalised); its real path
    (links followed) must lie in `root`, or in the Hub cache's blob store when `root` is a cache
    snapshot. `referrer` is the file that named `rel` (the index), or `root` for a listing.
    """
    parts = rel.replace("\\", "/").split("/")
    bad = None
    if not rel or "\x00" in rel or os.path.isabs(rel) or ".." in parts:
        bad = "a path outside the checkpoint; only files inside SRC are read"
    else:
        try:
            os.fsencode(rel)
        except UnicodeError:
            bad = "not a valid file name"
        else:
            if os.path.normpath(rel) != rel:
                bad = f"not a plain relative path (write {_short(os.path.normpath(rel))})"
    if bad:
        raise SourceError(f"{referrer}: names {_short(rel)}, {bad}; fix {os.path.basename(referrer)}")
    path = os.path.join(root, rel)
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: cannot resolve ({exc}); fix {os.path.basename(referrer)}") from None
    bases = [os.path.realpath(root)]
    blobs = _hub_blobs(root)
    if blobs:
        bases.append(blobs)
    if not any(os.path.commonpath([real, b]) == b for b in bases):
        raise SourceError(
            f"{path}: is a link to {real}, outside the checkpoint; refusing to read it; copy the file into SRC instead of linking"
        )
    return path


def regular_file_inside(root: str, name: str) -> str:
    """The path of `name` in folder `root`: a regular file whose real path stays inside `root`
    (links out of it are refused, never followed; FIFOs and devices are never opened)."""
    path = _inside(root, name, root)
    if not os.path.isfile(path):
        raise SourceError(f"{path}: not a regular file (a folder, device, FIFO or broken link); replace it with the real file")
    return path


def _no_conflicting_keys(path: str):
    """A JSON object hook refusing a key listed twice with two different values (the index)."""
    def hook(pairs):
        doc: dict = {}
        for k, v in pairs:
            if k in doc and doc[k] != v:
                raise SourceError(f"{path}: lists {_short(k)} twice ({_short(doc[k], 60)} and {_short(v, 60)}); loaders would disagree; fix the index")
            doc[k] = v
        return doc
    return hook


def _load_json(path: str, what: str, hook=None) -> dict:
    if os.path.lexists(path):  # config.json / the index: a link out of SRC is refused like a shard's
        _inside(os.path.dirname(path), os.path.basename(path), os.path.dirname(path))
    try:
        return load_json(path, what, hook=hook)
    except JsonFileError as exc:
        raise SourceError(exc.message) from None


# config.json keys the converter reads, with the JSON types they must have when present.
_CONFIG_TYPES = {
    "model_type": (str,),
    "num_hidden_layers": (int,),
    "text_config": (dict,),
}


def _check_config(config: dict, path: str) -> None:
    for key, types in _CONFIG_TYPES.items():
        value = config.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise SourceError(
                f"{path}: '{key}' is {type(value).__name__} {_short(value, 60)}, expected {types[0].__name__}; fix config.json"
            )
    for where, doc in (("", config), ("text_config.", config.get("text_config"))):
        n = doc.get("num_hidden_layers") if isinstance(doc, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n < 0:
            raise SourceError(f"{path}: '{where}num_hidden_layers' is {n}, a layer count cannot be negative; fix config.json")
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("num_hidden_layers") is not None:
        n = text["num_hidden_layers"]
        if not isinstance(n, int) or isinstance(n, bool):
            raise SourceError(f"{path}: 'text_config.num_hidden_layers' is {_short(n, 60)}, expected an integer; fix config.json")


def _shard_names(root: str) -> tuple[list[str], dict | None]:
    index_path = os.path.join(root, INDEX_NAME)
    if os.path.lexists(index_path):
        index = _load_json(index_path, "the safetensors index", _no_conflicting_keys(index_path))
        wmap = index.get("weight_map")
        if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
            raise SourceError(f"{index_path}: 'weight_map' must map tensor names to shard files; fix the index")
        for fname in sorted(set(wmap.values())):
            if not fname.endswith(".safetensors"):
                raise SourceError(
                    f"{index_path}: weight_map names {_short(fname)}, not a *.safetensors file; only safetensors are read; fix the index"
                )
            _inside(root, fname, index_path)
        return sorted(set(wmap.values())), wmap
    files = sorted(f for f in os.listdir(root) if f.endswith(".safetensors"))
    if not files:
        raise SourceError(f"{root}: no *.safetensors files (and no {INDEX_NAME}); only safetensors checkpoints are read")
    return files, None


def open_source(src: str, revision: str | None = None, quiet: bool = True, allow_quantized: bool = False) -> Source:
    """Resolve and read SRC's config and headers; raise :class:`SourceError` on anything malformed.

    `allow_quantized`: read a converted checkpoint too (``quantize eval``); else it is refused."""
    root, from_hub = resolve_path(src, revision, quiet)
    config_path = os.path.join(root, "config.json")
    if not os.path.lexists(config_path) and not any(f.endswith(".safetensors") for f in _listdir(root)):
        raise SourceError(f"{src}: not a Hugging Face checkpoint (no config.json, no *.safetensors); check the path")
    config = _load_json(config_path, "config.json")
    _check_config(config, config_path)
    names, wmap = _shard_names(root)
    tensors: dict[str, TensorInfo] = {}
    owner: dict[str, str] = {}
    warnings: list[str] = []
    referrer = os.path.join(root, INDEX_NAME) if wmap is not None else root
    for name in names:
        path = _inside(root, name, referrer)
        if not os.path.lexists(path):
            raise SourceError(f"{path}: shard named by {INDEX_NAME} is missing; re-download the checkpoint")
        if not os.path.isfile(path):
            raise SourceError(f"{path}: shard is not a regular file (a folder, device, FIFO or broken link); replace it with the real file")
        header = read_header(path, display=os.path.join(src, name) if not from_hub else f"{src}:{name}")
        for tname, info in header.tensors.items():
            if tname in owner:
                raise SourceError(
                    f"tensor {_short(tname)} is in both {owner[tname]} and {name}; the checkpoint is inconsistent; "
                    "remove the stray copy or re-download"
                )
            owner[tname] = name
            tensors[tname] = info
    if wmap is not None:
        for tname, fname in sorted(wmap.items()):
            if owner.get(tname) != fname:
                where = f"in {owner[tname]}" if tname in owner else "in no shard"
                raise SourceError(f"{referrer}: tensor {_short(tname)} is indexed to {fname} but is {where}; fix the index or re-download")
        extra = sorted(set(tensors) - set(wmap))
        if extra:
            warnings.append(f"{len(extra)} tensor(s) are in shards but not in the index (kept): {', '.join(extra[:5])}")
    if not tensors:
        raise SourceError(f"{src}: the checkpoint holds no tensors; convert a checkpoint with weights")
    warnings += _ambiguities(root, names, wmap, config, tensors)
    sidecars, skipped, notes = _sidecars(root)
    warnings += skipped
    source = Source(src, root, config, tensors, names, sidecars, from_hub, warnings, notes=notes)
    if not allow_quantized:
        refuse_quantized(source)
    return source


_TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "half": "F16", "float": "F32"}


def _ambiguities(root: str, names: list[str], wmap: dict | None, config: dict, tensors: dict) -> list[str]:
    """Warnings for a checkpoint that loaders could read differently than we do."""
    out = []
    if wmap is not None:
        stray = sorted(f for f in _listdir(root) if f.endswith(".safetensors") and f not in names)
        if stray:
            out.append(f"{', '.join(stray[:3])} in SRC but not named by {INDEX_NAME}: ignored (not converted, not copied); "
                       "remove it if the index is right")
    declared = config.get("torch_dtype", config.get("dtype"))
    if isinstance(declared, str):
        floats = {t.dtype for t in tensors.values() if t.dtype in FLOAT_SOURCE_DTYPES}
        st = _TORCH_DTYPES.get(declared.removeprefix("torch."))
        if st is None:
            out.append(f"config.json torch_dtype {_short(declared, 40)} is not a float dtype; loaders may refuse it (copied unchanged)")
        elif floats and st not in floats:
            out.append(f"config.json torch_dtype {declared!r} but the tensors are {', '.join(sorted(floats))}; loaders will compute in "
                       f"{declared} (copied unchanged); fix config.json if that is not meant")
    return out


def _listdir(root: str) -> list[str]:
    try:
        return os.listdir(root)
    except OSError as exc:
        raise SourceError(f"{root}: cannot list the folder ({exc.strerror}); check permissions") from exc


def _sidecars(root: str) -> tuple[list[str], list[str], list[str]]:
    """Files copied to DST unchanged (tokenizer, generation config, sub-folders such as
    sentence-transformers' ``1_Pooling/``), warnings for skipped files, and notes naming skipped
    folders: the rule is :mod:`.sidecars`'s (docs/formats.md)."""
    from .sidecars import list_sidecars

    return list_sidecars(root, _inside)


def refuse_quantized(source: Source) -> None:
    """Refuse a checkpoint that is already quantized (config block or quantized Linear weights)."""
    qc = source.config.get("quantization_config")
    if qc:
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        method = method if isinstance(method, str) else "?"
        raise SourceError(
            f"{source.label}: config.json already has a quantization_config (quant_method {method!r}); "
            "convert from the original bf16/fp16/fp32 checkpoint"
        )
    if os.path.exists(os.path.join(source.root, "hf_quant_config.json")):
        raise SourceError(f"{source.label}: hf_quant_config.json present, the checkpoint is already quantized; use the bf16 original")
    for t in source.tensors.values():
        if t.leaf in ("weight_scale", "weight_scale_inv", "weight_scale_2", "qweight", "weight_packed"):
            raise SourceError(
                f"{source.label}: tensor {_short(t.name)} is a quantization scale/packed weight; the checkpoint is already quantized; use the bf16 original"
            )
        if t.leaf == "weight" and len(t.shape) == 2 and t.dtype not in FLOAT_SOURCE_DTYPES and t.dtype in ("F8_E4M3", "F8_E5M2", "I8", "U8"):
            raise SourceError(
                f"{source.label}: Linear weight {_short(t.name)} is {t.dtype}, already quantized; convert from the bf16/fp16/fp32 original"
            )
