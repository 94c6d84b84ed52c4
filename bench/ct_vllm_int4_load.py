"""Scratch check (not a test dependency): vLLM 0.33 loads our compressed-tensors INT4 outputs as intended.

Beyond ``ct_vllm_decisions.py`` (which scheme vLLM picks), this builds vLLM's own parallel Linear
layers (``QKVParallelLinear``, ``MergedColumnParallelLinear``, ``RowParallelLinear``) on the CPU
(a one-process gloo group), lets ``CompressedTensorsWNA16.create_weights`` allocate them, loads
our tensors through vLLM's weight loaders (fused q/k/v and gate/up shards included), and
dequantizes the loaded parameters exactly as the scheme's batch-invariant ``apply_weights`` does
(``unpack_from_int32``, zero points subtracted, times the scales). The result must equal our own
dequantization of the same checkpoint (``CtInt4.dequantize``) for every Linear.

Run with the upstream venv after converting the golden tiny Llama (our venv, then vLLM's)::

    for a in INT4 INT4_ASYM; do quantize convert tests/golden/checkpoints/tiny-llama \\
        -o /tmp/ct/ours-$a --algo $a --format compressed-tensors --device cpu; done
    PYTHONPATH=$PWD /root/upstream-venv/bin/python -P bench/ct_vllm_int4_load.py   # prints one line per algorithm

(``PYTHONPATH``: our ``formats/ct_int4.py`` is imported for the comparison; torch only.)
"""

from __future__ import annotations

import glob
import json
import os
import tempfile

import torch
from safetensors.torch import load_file

# The scheme's batch-invariant mode keeps the checkpoint layout and picks no CUDA kernel (the CPU has none).
os.environ["VLLM_BATCH_INVARIANT"] = "1"


def init_vllm():
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    ctx = set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu")))
    ctx.__enter__()
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{tempfile.mktemp()}")
    initialize_model_parallel(1, 1)


def layers_of(cfg_json: dict, quant_config):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    h, inter = cfg_json["hidden_size"], cfg_json["intermediate_size"]
    hd, nh, nkv = cfg_json["head_dim"], cfg_json["num_attention_heads"], cfg_json["num_key_value_heads"]
    out = {}
    for i in range(cfg_json["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out[f"{p}.self_attn.qkv_proj"] = (QKVParallelLinear(h, hd, nh, nkv, bias=False, quant_config=quant_config,
                                                            prefix=f"{p}.self_attn.qkv_proj"), ["q", "k", "v"], "self_attn", ["q_proj", "k_proj", "v_proj"])
        out[f"{p}.self_attn.o_proj"] = (RowParallelLinear(nh * hd, h, bias=False, quant_config=quant_config, prefix=f"{p}.self_attn.o_proj"),
                                        [None], "self_attn", ["o_proj"])
        out[f"{p}.mlp.gate_up_proj"] = (MergedColumnParallelLinear(h, [inter, inter], bias=False, quant_config=quant_config,
                                                                   prefix=f"{p}.mlp.gate_up_proj"), [0, 1], "mlp", ["gate_proj", "up_proj"])
        out[f"{p}.mlp.down_proj"] = (RowParallelLinear(inter, h, bias=False, quant_config=quant_config, prefix=f"{p}.mlp.down_proj"),
                                     [None], "mlp", ["down_proj"])
    return out


def vllm_dequant(layer, scheme) -> torch.Tensor:
    """What CompressedTensorsWNA16.apply_weights (batch-invariant branch) multiplies by, [N, K] fp32."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    shape = torch.Size((layer.output_size_per_partition, layer.input_size_per_partition))
    w = unpack_from_int32(layer.weight_packed, scheme.num_bits, shape).float()
    w = w.reshape(shape[0], layer.weight_scale.shape[1], -1)
    if not scheme.symmetric:
        zp = unpack_from_int32(layer.weight_zero_point, scheme.num_bits, layer.weight_scale.shape, packed_dim=0)
        w = w - zp.float().unsqueeze(-1)
    return (w * layer.weight_scale.float().unsqueeze(-1)).reshape(shape)


def check(folder: str) -> dict:
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    from quantize_cli.formats import CT_SCHEMES

    cfg_json = json.load(open(os.path.join(folder, "config.json")))
    qc = CompressedTensorsConfig.from_config(dict(cfg_json["quantization_config"]))
    qc.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    tensors = {}
    for f in glob.glob(os.path.join(folder, "*.safetensors")):
        tensors.update(load_file(f))
    algo = "INT4" if "W4A16" in cfg_json["quantization_config"]["config_groups"] else "INT4_ASYM"
    ours = CT_SCHEMES[algo]
    result = {}
    for name, (layer, shard_ids, _, members) in layers_of(cfg_json, qc).items():
        scheme = layer.scheme
        assert scheme.use_batch_invariant
        base = name.rsplit(".", 1)[0]
        params = dict(layer.named_parameters())
        for shard, member in zip(shard_ids, members):
            for suffix in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point"):
                key = f"{base}.{member}.{suffix}"
                if key not in tensors:
                    continue
                p = params[suffix]
                if shard is None:
                    p.weight_loader(p, tensors[key])
                else:
                    p.weight_loader(p, tensors[key], shard)
        scheme.process_weights_after_loading(layer)
        got = vllm_dequant(layer, scheme)
        want = torch.cat([ours.dequantize({k: tensors[f"{base}.{m}.{k}"] for k in ("weight_packed", "weight_scale", "weight_zero_point")
                                           if f"{base}.{m}.{k}" in tensors}) for m in members])
        result[name] = {"scheme": type(scheme).__name__, "quant_type": str(scheme.quant_type),
                        "equal": bool(torch.equal(got, want)), "shape": list(got.shape)}
    return result


def main():
    init_vllm()
    res = {}
    for algo in ("INT4", "INT4_ASYM"):
        res[algo] = check(f"/tmp/ct/ours-{algo}")
        ok = all(v["equal"] for v in res[algo].values())
        print(algo, "all layers equal" if ok else "MISMATCH", json.dumps(res[algo]))
    json.dump(res, open("/tmp/ct/vllm_int4_load.json", "w"), indent=1)


if __name__ == "__main__":
    main()
