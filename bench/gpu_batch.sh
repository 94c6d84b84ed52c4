#!/usr/bin/env bash
# One device call: set up the checkout on the GPU machine, then run the named steps, logs to $OUT.
#   bash bench/gpu_batch.sh tests eval_speed scale_search e2e
# Carry .whl-llmc (llm-compressor's wheels, ../shared/bench/wheels) for e2e's peer column, .whl-ray
# (the slimmed Ray for CPython 3.12) for scale (bench/scale_gpu.py: about 8 minutes alone, a 2-GPU kind).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ln -sfn ../kernels quantize_cli/kernels; ln -sfn ../recipes quantize_cli/recipes; export PYTHONPATH=$PWD
# A pip install has bytecode; these machines ship torch without it and set PYTHONDONTWRITEBYTECODE
# (every process recompiled ~6 s of Python): cache it, for us and the peer alike (performance.md).
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
python3 - <<'PY' > "$OUT/versions.txt" 2>&1
import sys, torch, triton
print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name(0))
try:
    import transformers; print("transformers", transformers.__version__)
except Exception as e: print("transformers missing", e)
PY
cat "$OUT/versions.txt"
step() { local name=$1; shift; local t=$SECONDS; echo "== $name"; "$@" > "$OUT/$name.log" 2>&1; echo "== $name rc=$? $((SECONDS - t)) s"; tail -4 "$OUT/$name.log"; }
for s in "$@"; do
  case $s in
    tests) python3 -m pip install -q --no-deps --no-index .whl-test/*.whl > "$OUT/test_install.log" 2>&1
           python3 -m pip install -q --no-deps --no-index .whl-llmc/*.whl >> "$OUT/test_install.log" 2>&1
           export QUANTIZE_TESTS_WITHOUT=ray  # no ray wheel here: its -m gpu tests fail, the rest run
           step tests python3 -m pytest -q -m gpu -p no:cacheprovider --ignore=tests/test_ray_executor.py --ignore=tests/test_ray_cluster.py ;;
    eval_speed) mkdir -p /tmp/ev; [ -e /tmp/e2e/src/config.json ] && ln -sfn /tmp/e2e/src /tmp/ev/src-l16-v128256
         step eval_speed python3 bench/eval_speed.py --work /tmp/ev --algos "${EVAL_ALGOS:-FP8,NVFP4}" --json "$OUT/eval_speed.json" ;;
    scale_search) mkdir -p /tmp/ss; [ -e /tmp/e2e/src/config.json ] && ln -sfn /tmp/e2e/src /tmp/ss/src
         step scale_search python3 bench/scale_search.py --work /tmp/ss --runs 1 --reps 5 --json "$OUT/scale_search.json" ;;
    scale) python3 .whl-ray/unpack.py > "$OUT/ray_unpack.log" 2>&1 || { cat "$OUT/ray_unpack.log"; continue; }  # carry .whl-ray
           export PYTHONPATH=/tmp/rayenv/site:$PYTHONPATH; mkdir -p /tmp/scale
           [ -e /tmp/e2e/src/config.json ] && ln -sfn /tmp/e2e/src /tmp/scale/src-big  # the same 16-layer input
           step scale python3 bench/scale_gpu.py --workdir /tmp/scale --json "$OUT/scale.json"; tail -30 "$OUT/scale.log" ;;
    e2e) python3 -m pip install -q --no-deps --no-index .whl-llmc/*.whl > "$OUT/llmc_install.log" 2>&1
         step e2e python3 bench/e2e.py --work /tmp/e2e --phases warm --algos FP8_PB_WO,NVFP4 --workers 4 --skip-naive --json "$OUT/e2e.json" ;;
  esac
done
