"""config.json's ``quantization_config`` for the compressed-tensors format (pure builders).

The document is what llm-compressor 0.14 (compressed-tensors 0.19) writes for the same preset:
one config group named after the preset, targeting ``Linear``, the ``ignore`` list, the
``format`` of the packed tensors and ``quantization_status: compressed``. vLLM reads it with
``CompressedTensorsConfig.from_config``, transformers with its compressed-tensors integration.
The ``ignore`` list holds exact module names only (vLLM's ``should_ignore_layer`` matches exact
names and ``re:`` regexes, and a fused layer is ignored only when all its shards are).
"""

from __future__ import annotations

COMPRESSED_TENSORS_VERSION = "0.19.0"  # the compressed-tensors release whose format we write

_ARGS = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None, "num_bits": 8,
         "observer": None, "observer_kwargs": {}, "scale_dtype": None, "strategy": "tensor", "symmetric": True,
         "type": "float", "zp_dtype": None}
FP4_SCALE = "torch.float8_e4m3fn"
MX_SCALE = "torch.uint8"  # e8m0 exponents


def quant_args(**changes) -> dict:
    """A compressed-tensors ``QuantizationArgs`` document: the defaults with `changes` applied."""
    return {**_ARGS, **changes}


# preset -> (format, weights, input_activations); the presets of compressed_tensors.quantization.
PRESETS: dict[str, tuple[str, dict, dict | None]] = {
    "FP8": ("float-quantized", quant_args(), quant_args(observer="static_minmax")),
    "FP8_DYNAMIC": ("float-quantized", quant_args(strategy="channel"), quant_args(strategy="token", dynamic=True)),
    "FP8_BLOCK": ("float-quantized", quant_args(strategy="block", block_structure=[128, 128]),
                  quant_args(strategy="group", group_size=128, dynamic=True)),
    "W8A8": ("int-quantized", quant_args(strategy="channel", type="int"),
             quant_args(strategy="token", type="int", dynamic=True)),
    "NVFP4": ("nvfp4-pack-quantized", quant_args(strategy="tensor_group", num_bits=4, group_size=16, scale_dtype=FP4_SCALE),
              quant_args(strategy="tensor_group", num_bits=4, group_size=16, scale_dtype=FP4_SCALE, dynamic="local",
                         observer="static_minmax")),
    "NVFP4A16": ("nvfp4-pack-quantized", quant_args(strategy="tensor_group", num_bits=4, group_size=16, scale_dtype=FP4_SCALE), None),
    "MXFP8": ("mxfp8-quantized", quant_args(strategy="group", group_size=32, scale_dtype=MX_SCALE),
              quant_args(strategy="group", group_size=32, scale_dtype=MX_SCALE, dynamic=True)),
    "W4A16": ("pack-quantized", quant_args(strategy="group", group_size=128, num_bits=4, type="int"), None),
    "W4A16_ASYM": ("pack-quantized", quant_args(strategy="group", group_size=128, num_bits=4, type="int", symmetric=False,
                                                zp_dtype="torch.int8"), None),
}
MIXED_FORMAT = "mixed-precision"  # the top-level format llm-compressor writes when the groups' formats differ
FP8_KV_CACHE = quant_args()  # static per-tensor FP8 (vLLM uses scale 1.0 when the checkpoint has none)


def config_group(preset: str, targets: list[str]) -> dict:
    """One ``config_groups`` entry: the preset's arguments applied to `targets`."""
    fmt, weights, inputs = PRESETS[preset]
    return {"format": fmt, "input_activations": inputs, "output_activations": None, "targets": list(targets), "weights": weights}


def quantization_config(preset: str, ignore: list[str], kv_cache_dtype: str | None = None,
                        groups: dict[str, list[str]] | None = None) -> dict:
    """The ``quantization_config`` block, keys as llm-compressor writes them (sorted on output).

    `groups`: mixed precision, preset -> targets (one group per preset, named after it); the
    top-level ``format`` is then ``mixed-precision`` when the groups' formats differ."""
    groups = groups or {preset: ["Linear"]}
    formats = {PRESETS[p][0] for p in groups}
    fmt = formats.pop() if len(formats) == 1 else MIXED_FORMAT
    return {
        "config_groups": {p: config_group(p, targets) for p, targets in groups.items()},
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": dict(FP8_KV_CACHE) if kv_cache_dtype == "fp8" else None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "transform_config": {},
        "version": COMPRESSED_TENSORS_VERSION,
    }


# Compression formats compressed-tensors decompresses to bfloat16 whatever the model's dtype (its
# unpack_fp4_from_uint8 and e8m0 scales are bf16): transformers' forward then needs a bf16 model.
BF16_FORMATS = ("nvfp4-pack-quantized", "mxfp8-quantized")
BF16_DECOMPRESSED = tuple(p for p, (fmt, _, _) in PRESETS.items() if fmt in BF16_FORMATS)  # NVFP4, NVFP4A16, MXFP8
_DTYPE_KEYS = ("torch_dtype", "dtype")  # transformers 4 writes the first, 5 the second; both read either


def output_config(source_config: dict, qconfig: dict, sentence_transformers: bool = False) -> dict:
    """The source config.json with `qconfig` as ``quantization_config``.

    With an NVFP4 / NVFP4A16 / MXFP8 group the model dtype becomes ``bfloat16`` (an fp32 or fp16
    source's config would make transformers' default load compute in that dtype against bf16
    weights: "self and mat2 must have the same dtype"; vLLM serves these in bf16 too).

    `sentence_transformers` (the source has a ``modules.json``): ``dequantize: true`` is added to the
    block, so transformers decompresses the weights at load. sentence-transformers calls the model's
    ``forward`` directly, which skips compressed-tensors' decompress-on-first-call hook:
    ``SentenceTransformer(DST).encode`` failed with every preset. ``run_compressed: false`` did the
    same, but transformers warns on every load that it is deprecated (its only effect is to set
    ``dequantize``). vLLM and compressed-tensors' own parser ignore the key."""
    cfg = {k: v for k, v in source_config.items() if k != "quantization_config"}
    if any(name in BF16_DECOMPRESSED for name in qconfig.get("config_groups", {})):
        present = [k for k in _DTYPE_KEYS if k in cfg] or ["torch_dtype"]
        for key in present:
            cfg[key] = "bfloat16"
    cfg["quantization_config"] = {**qconfig, "dequantize": True} if sentence_transformers else qconfig
    return cfg
