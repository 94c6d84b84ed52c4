#!/usr/bin/env bash
# Where a whole `quantize convert` spends its time on the GPU machine (issue 34), in one device call:
# the start-up pieces alone (python, import torch, CUDA context), then each algorithm's conversion
# as a whole command with its report's stages, beside the I/O floor of the same run, and one
# py-spy profile of every thread (carry .whl-prof with py-spy's wheel; optional).
#   OUT=/tmp/out bash bench/pipeline_profile.sh [ALGO ...]        # default FP8_PB_WO NVFP4 INT8
# Env: SRC (default /tmp/e2e/src, made by bench/e2e.py's make_checkpoint when absent), DST_DIR,
# BUDGET (--memory-budget, default 4GB), EXTRA (more convert options), PYSPY=0 to skip the profile,
# TIMELINE=1 to run each conversion and each floor under bench/disk_timeline.py (when the disk writes:
# OUT/timeline-{ALGO,floor-ALGO}.json and its table in the output).
# Before/after a change, side by side with the peer: bench/e2e.py --baseline DIR.
# Python source is compiled once to a bytecode cache first, as a pip install does: the GPU machines
# ship torch without .pyc files and write none, which costs every process ~6 s of compiling.
set -uo pipefail
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
echo "env: $(env | grep -E '^PYTHON' | tr '\n' ' ')"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SRC=${SRC:-/tmp/e2e/src}; DST_DIR=${DST_DIR:-/tmp/prof}; BUDGET=${BUDGET:-4GB}; EXTRA=${EXTRA:-}
ALGOS=${*:-FP8_PB_WO NVFP4 INT8}
mkdir -p "$DST_DIR"
[ -e "$SRC/config.json" ] || python3 -c "import sys; sys.path.insert(0, 'bench'); import e2e; e2e.make_checkpoint('$SRC', 16, 128256, 'cuda')"
if ls .whl-prof/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/prof-site .whl-prof/*.whl && PYSPY_BIN=/tmp/prof-site/bin/py-spy
fi
t() { local s; s=$(date +%s.%N); "$@"; python3 -c "print(f'{$(date +%s.%N) - $s:.2f}')"; }
# under TIMELINE=1, `tl NAME CMD...` runs CMD sampled by bench/disk_timeline.py (its table to stderr, kept in OUT)
tl() { local name=$1; shift; if [ "${TIMELINE:-0}" = 1 ]; then python3 bench/disk_timeline.py --path "$DST_DIR" \
  --json "$OUT/timeline-$name.json" -- "$@" > "$OUT/timeline-$name.txt" 2>&1; local rc=$?; cat "$OUT/timeline-$name.txt" >&2; return $rc
  else "$@"; fi; }
python3 -c "import torch, triton, safetensors, click, tqdm, xxhash, yaml, quantize_cli.cli" 2>/dev/null  # fills the bytecode cache
echo "python -c pass: $(t python3 -c pass) s; import torch: $(t python3 -c 'import torch') s; + CUDA context: $(t python3 -c 'import torch; torch.empty(1, device="cuda")') s"
cat "$SRC"/*.safetensors > /dev/null  # warm
echo "read alone (cat): $(t sh -c "cat $SRC/*.safetensors > /dev/null") s for $(du -sb "$SRC" | cut -f1) bytes"
for algo in $ALGOS; do
  dst=$DST_DIR/out-$algo
  s=$(t tl "$algo" sh -c "python3 -m quantize_cli convert $SRC -o $dst --algo $algo --memory-budget $BUDGET --overwrite --quiet --report $OUT/report-$algo.json $EXTRA && sync")
  n=$(du -sb "$dst" | cut -f1)
  f=$(t tl "floor-$algo" sh -c "cat $SRC/*.safetensors > /dev/null & dd if=/dev/zero of=$DST_DIR/floor.bin bs=16M count=$((n / 16777216 + 1)) conv=fsync status=none; wait")
  rm -f "$DST_DIR/floor.bin"
  python3 - "$OUT/report-$algo.json" "$algo" "$s" "$f" "$n" <<'PY'
import json, sys
rep, algo, s, f, n = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
t = rep["timings_s"]
print(f"{algo}: whole {s:.2f} s, floor {f:.2f} s, floor/whole {f / s:.0%}, out {n / 1e9:.2f} GB; plan {t.get('plan_s', 0):.2f} "
      f"convert {t.get('convert_s', 0):.2f} total {t.get('total_s', 0):.2f}")
print("  stages:", json.dumps(t.get("stages_s", {})))
PY
done
if [ -n "${PYSPY_BIN:-}" ] && [ "${PYSPY:-1}" != 0 ]; then
  algo=${ALGOS%% *}
  $PYSPY_BIN record -r 250 --threads --idle -f raw -o "$OUT/pyspy-$algo.txt" -- \
    python3 -m quantize_cli convert "$SRC" -o "$DST_DIR/out-spy" --algo "$algo" --memory-budget "$BUDGET" --overwrite --quiet $EXTRA \
    > "$OUT/pyspy.log" 2>&1 || tail -5 "$OUT/pyspy.log"
  gzip -f "$OUT/pyspy-$algo.txt"
fi
