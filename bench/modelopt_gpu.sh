#!/bin/bash
# ModelOpt 0.47's own AWQ beside ours, every output measured by `quantize eval` (docs/accuracy.md, SmolLM2 section).
# ModelOpt's NVFP4 fake quantization is CUDA-only (tensor_quant._dynamic_block_quantize_impl asserts amax.is_cuda),
# so this runs on the GPU machine. Usage (from the repository root):
#     bash bench/modelopt_gpu.sh MODEL_DIR [WORK]        # e.g. MODEL_DIR=/root/smol-model
# Env: PY (the project's python, default python3), MOPY (a python with nvidia-modelopt 0.47 + transformers,
# default $PY), CALIB (a calib.jsonl to reuse, e.g. the CPU run's /tmp/gq-smol2/calib.jsonl: same token ids),
# DEVICE (default cuda). Writes WORK/outputs/{modelopt,ours}-{NVFP4,W4A16_NVFP4}-*, their .eval.json and a table.
set -euo pipefail
MODEL=${1:?give the model folder (bf16 Hugging Face checkpoint)}
WORK=${2:-/tmp/gq-modelopt}
PY=${PY:-python3}; MOPY=${MOPY:-$PY}; DEVICE=${DEVICE:-cuda}
mkdir -p "$WORK/outputs"
if [ -n "${CALIB:-}" ]; then cp "$CALIB" "$WORK/calib.jsonl"
else $PY bench/gptq_smol.py data --model "$MODEL" --work "$WORK" --calib-samples 16 --calib-seq-len 256; fi
$MOPY -c "import modelopt, torch; print('modelopt', modelopt.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
$MOPY bench/gptq_modelopt.py --model "$MODEL" --work "$WORK" --device "$DEVICE"
$PY bench/gptq_smol.py ours --model "$MODEL" --work "$WORK" --device "$DEVICE" --algos W4A16_NVFP4 NVFP4 \
    --variants rtn mse awq awq-mse
$PY bench/gptq_smol.py eval --model "$MODEL" --work "$WORK" --device "$DEVICE" --samples 16 --seq-len 256
$PY bench/gptq_smol.py table --work "$WORK"
