#!/bin/bash
# docs/accuracy.md's SmolLM2 table in one run on the GPU machine: ModelOpt 0.47's own AWQ (CUDA only: its NVFP4
# fake quantization asserts CUDA tensors), llm-compressor 0.14's GPTQ / AWQ and ours, on the same calibration
# token ids, every output measured by `quantize eval` on the same GPU. The three producers run side by side
# (one GPU, a 135M model: their convert seconds overlap and are indicative only), then the evaluations.
# Usage, from the repository root, with llmcompressor and nvidia-modelopt importable by python3:
#     bash bench/gptq_smol_gpu.sh MODEL_DIR WORK        # WORK/calib.jsonl is reused if present
# Writes WORK/outputs/{modelopt,llmc,ours}-<ALGO>-<variant>{,.eval.json}, WORK/table.md, then WORK/DONE.
# Gemma 3 270M (issue 37: docs/accuracy.md; bench/gemma3_from_gguf.py builds MODEL_DIR), every 4-bit format:
#     ALGOS="INT4 INT4_ASYM W4A16_NVFP4 NVFP4" OURS_ALGOS="INT4 INT4@ct INT4_ASYM W4A16_NVFP4 NVFP4" \
#         bash bench/gptq_smol_gpu.sh MODEL_DIR WORK
# (ModelOpt has no INT4_ASYM: gptq_modelopt.py skips names it has no config for.)
set -uo pipefail
MODEL=${1:?give the model folder (bf16 Hugging Face checkpoint)}
WORK=${2:?give a work folder}
PY=${PY:-python3}; DEVICE=${DEVICE:-cuda}; ALGOS=${ALGOS:-"W4A16_NVFP4 NVFP4"}; OURS_ALGOS=${OURS_ALGOS:-$ALGOS}
mkdir -p "$WORK/outputs"
[ -e "$WORK/calib.jsonl" ] || $PY bench/gptq_smol.py data --model "$MODEL" --work "$WORK" --calib-samples 16 --calib-seq-len 256
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
stream() { local name=$1; shift; local t=$SECONDS; "$@" > "$WORK/$name.log" 2>&1; echo "$name rc=$? $((SECONDS - t)) s" | tee -a "$WORK/streams.log"; }
mo=(); for a in $ALGOS; do for v in rtn awq; do mo+=("$a-$v"); done; done
stream modelopt $PY bench/gptq_modelopt.py --model "$MODEL" --work "$WORK" --device "$DEVICE" --only "${mo[@]}" NVFP4-awq-clip &
stream llmc $PY bench/gptq_llmc.py --model "$MODEL" --work "$WORK" --algos $ALGOS --variants rtn gptq awq awq-gptq \
    --seq-len 256 &
stream ours $PY bench/gptq_smol.py ours --model "$MODEL" --work "$WORK" --device "$DEVICE" --algos $OURS_ALGOS \
    --variants rtn mse gptq gptq-mse awq awq-mse awq-gptq-mse &
wait
stream eval $PY bench/gptq_smol.py eval --model "$MODEL" --work "$WORK" --device "$DEVICE" --samples 16 --seq-len 256 --jobs 4
$PY bench/gptq_smol.py table --work "$WORK" > "$WORK/table.md"
touch "$WORK/DONE"
