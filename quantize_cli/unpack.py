"""``quantize unpack DST -o PLAIN``: a packed-layout checkpoint back to the plain ModelOpt one.

The result is byte-identical to a plain conversion of the same source: packed tensors are
unpacked exactly (the plain scales were kept beside them), MoE stacks are split back into the
per-expert weights, shards are laid out by the same rule and ``max_shard_size`` (recorded in the
layout metadata), and the layout record is dropped from both config files.
"""

from __future__ import annotations

import json
import os


from . import layouts
from .formats.layout_record import layout_record
from .output.destination import Destination
from .checkpoint.durable import copy_durable
from .formats.modelopt_documents import write_config_files
from .checkpoint.safetensors_io import nbytes_of, read_header, read_tensor, st_dtype
from .checkpoint.writer import ShardWriter, write_index
from .errors import SourceError
from .modules.experts import expert_names
from .layouts.packing import ACT_DTYPES, unstack
from .plan.build import OutTensor, _assign_shards, parse_size
from .modules.recipe import recipe_of_output
from .schemes import scheme_for_quant_algo

_SKIP = ("config.json", "hf_quant_config.json", "model.safetensors.index.json")


def unpack_checkpoint(src: str, dst: str, overwrite: bool = False) -> str:
    """Write the plain checkpoint of packed checkpoint `src` to `dst` (atomically)."""
    src = os.path.abspath(src)
    nested, config, record = layout_record(src)
    layout = layouts.Layout(record["name"])
    sfx = layouts.suffix(layout)
    scheme = scheme_for_quant_algo(nested["quantization"]["quant_algo"])
    act = ACT_DTYPES.get(record.get("activation_dtype", "bfloat16"), "bfloat16")  # a name: layouts.unpack takes either
    names = expert_names(recipe_of_output(nested, config.get("model_type"), os.path.join(src, "hf_quant_config.json")))
    shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    tensors = {n: t for f in shards for n, t in read_header(os.path.join(src, f)).tensors.items()}
    modules: dict[str, dict] = {}
    for name, info in tensors.items():
        modules.setdefault(info.module, {})[info.leaf] = info

    def produce():
        """(name, tensor) of every plain output, one module or MoE layer at a time."""
        for mod, leaves in modules.items():
            stack = [k for k in leaves if k.startswith(("w13_", "w2_")) and k.endswith(sfx)]
            packed = {k: v for k, v in leaves.items() if k.endswith(sfx)}
            if stack:
                side = {"w13": {}, "w2": {}}
                for k in stack:
                    side[k.split("_", 1)[0]][k.split("_", 1)[1]] = read_tensor(leaves[k])
                plain = layouts.unpack_moe(layout, scheme.algo, side)
                for e, parts in enumerate(unstack(plain["w13"]["weight"], plain["w2"]["weight"])):
                    for role, w in parts.items():
                        yield f"{mod}.{e}.{names[role]}.weight", w.contiguous()
                rest = {k: v for k, v in leaves.items() if k not in stack}
            elif packed:
                plain = layouts.unpack(layout, scheme.algo, {k: read_tensor(v) for k, v in leaves.items()}, act)
                for k, v in plain.items():
                    yield f"{mod}.{k}", v
                rest = {}
            else:
                rest = leaves
            for info in rest.values():
                yield info.name, read_tensor(info)

    # First pass: shapes only, so the header-first writer can lay the shards out.
    specs: dict[str, OutTensor] = {}
    for name, t in produce():
        specs[name] = OutTensor(name, st_dtype(t.dtype), tuple(t.shape), nbytes_of(st_dtype(t.dtype), tuple(t.shape)))
    outs, shard_names = _assign_shards(specs, parse_size(record.get("max_shard_size", "5GB")))
    dest = Destination(dst, src_root=src, overwrite=overwrite)
    dest.acquire()
    writer = ShardWriter(dest.partial, outs, shard_names)
    try:
        writer.open()
        for name, t in produce():
            writer.write(name, t)
        writer.close()
        if len(shard_names) > 1:
            write_index(dest.partial, outs, shard_names)
        _write_configs(dest.partial, nested, config, src)
        dest.commit()
    except BaseException:
        writer.abort()  # no shard file stays open in a library caller
        dest.discard()
        raise
    return dest.dst


def _write_configs(folder: str, nested: dict, config: dict, src: str) -> None:
    nested = json.loads(json.dumps(nested))
    nested.get("converter", {}).pop("layout", None)
    config = json.loads(json.dumps(config))
    config.get("quantization_config", {}).pop("layout", None)
    write_config_files(folder, nested, config)
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if name in _SKIP or name.endswith(".safetensors") or name.startswith(".") or not os.path.isfile(path):
            continue
        copy_durable(path, os.path.join(folder, name))
    from .output.card import mark_unpacked

    mark_unpacked(folder, os.path.basename(src.rstrip("/")))  # the copied card: plain layout, serve lines
