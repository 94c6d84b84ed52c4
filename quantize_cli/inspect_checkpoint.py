"""``quantize inspect PATH``: a short summary of any safetensors checkpoint (headers only).

PATH is a folder or a Hub repo id; for a repo id only config.json, hf_quant_config.json and the
safetensors headers are fetched (ranged requests), never the weights.
"""

from __future__ import annotations

import collections
import os

from .checkpoint.safetensors_header import read_header
from .checkpoint.source import regular_file_inside
from .errors import SourceError
from .jsonfile import read_json_or_none
from .console import human_bytes


def inspect_checkpoint(path: str, revision: str | None = None) -> str:
    """Model type, shards, tensors by dtype (count and bytes), and any quantization config."""
    if path.startswith("example:"):  # the embedded examples, as convert and check take them
        from .checkpoint.examples import example_path

        return inspect_checkpoint(example_path(path.split(":", 1)[1])).replace(example_path(path.split(":", 1)[1]), path, 1)
    if os.path.isdir(path):
        shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not shards:
            raise SourceError(f"{path}: no *.safetensors files")
        # never through a link out of the folder, never a FIFO (it would block)
        infos = [t for f in shards for t in read_header(regular_file_inside(path, f)).tensors.values()]
        config, nested = _json(os.path.join(path, "config.json")), _json(os.path.join(path, "hf_quant_config.json"))
    else:
        from .repo_id import is_repo_id, local_reason

        if os.path.exists(path) or not is_repo_id(path):
            raise SourceError(f"{path}: not a folder, a Hub repo id (owner/name) or example:NAME; inspect takes a checkpoint")
        reason = local_reason(path, revision)
        if reason:
            raise SourceError(f"{path}: no such folder ({reason}, so it is not looked up on the Hub); check the path")
        config, tensors, shards, nested = _hub(path, revision)
        infos = list(tensors.values())
    return summary(path, len(shards), infos, config, nested)


def _hub(repo_id: str, revision: str | None):
    from .checkpoint.hub import hub_headers

    config, tensors, shards = hub_headers(repo_id, revision)
    nested = None
    try:  # optional: only ModelOpt checkpoints have it
        from huggingface_hub import hf_hub_download

        nested = _json(hf_hub_download(repo_id, "hf_quant_config.json", revision=revision))
    except Exception:  # noqa: BLE001 - absent or unreachable: report what config.json says
        nested = None
    return config, tensors, shards, nested


def summary(label: str, n_shards: int, infos, config: dict | None, nested: dict | None) -> str:
    """The inspect text for tensors `infos` (TensorInfo) and the checkpoint's two config documents."""
    by_dtype: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    total = 0
    for t in infos:
        by_dtype[t.dtype][0] += 1
        by_dtype[t.dtype][1] += t.nbytes
        total += t.nbytes
    lines = [f"{label}: {count(n_shards, 'shard')}, {count(sum(c for c, _ in by_dtype.values()), 'tensor')}, {human_bytes(total)}"]
    if config:
        lines.append(f"model_type {config.get('model_type')!r}, {config.get('num_hidden_layers')} layers, "
                     f"hidden {config.get('hidden_size')}" + (f", dtype {dtype}" if (dtype := config.get('torch_dtype')
                                                                                       or config.get('dtype')) else ""))
    lines += [f"  {dtype:<8} {n:>6} tensor{'s' if n != 1 else ' '}  {human_bytes(size)}" for dtype, (n, size) in sorted(by_dtype.items())]
    quant = (config or {}).get("quantization_config")
    from .formats import COMPRESSED_TENSORS, format_of_config

    if format_of_config(config) is COMPRESSED_TENSORS:
        lines.append(ct_summary(quant))  # type: ignore[arg-type]
    elif quant or nested:
        q = (nested or {}).get("quantization") or quant or {}
        excl = q.get("exclude_modules", q.get("ignore", []))
        lines.append(f"quantized: quant_algo {q.get('quant_algo')!r}, kv cache {q.get('kv_cache_quant_algo', (quant or {}).get('kv_cache_scheme'))!r}, "
                     f"{count(len(excl), 'exclusion')}, producer {((nested or quant or {}).get('producer') or {}).get('name')!r}")
        layout = ((nested or {}).get("converter") or {}).get("layout")
        if layout:
            lines.append(f"packed layout {layout.get('name')!r} (quantize unpack turns it back into the plain format)")
    else:
        lines.append("not quantized")
    return "\n".join(lines)


def ct_summary(quant: dict) -> str:
    """One line for a compressed-tensors ``quantization_config``: preset, format, kv cache, ignore."""
    from .formats.ct_verify import describe

    return (f"quantized: compressed-tensors, preset {describe(quant)}, "
            f"format {quant.get('format')!r}, kv cache {'fp8' if quant.get('kv_cache_scheme') else None}, "
            f"{count(len(quant.get('ignore') or []), 'ignore entry', 'ignore entries')}, status {quant.get('quantization_status')!r}")


def count(n: int, one: str, many: str | None = None) -> str:
    """``count(1, "shard") == "1 shard"``, ``count(3, "ignore entry", "ignore entries") == "3 ignore entries"``."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _json(path: str) -> dict | None:
    try:
        regular_file_inside(os.path.dirname(path), os.path.basename(path))
    except SourceError:
        return None
    return read_json_or_none(path)
