#!/usr/bin/env bash
# 1, 2, 4 ... GPUs of one process against the host's own floors, in one device call (issue 34).
# Makes a Llama-70B-shaped bf16 input (hidden 8192, intermediate 28672, vocab 128256; LAYERS of the
# 80, 5 GB shards) in IN_DIR (default /dev/shm), then for each DST place (shm, disk) and algorithm:
# the floors (read the input while writing the output's bytes: to /dev/shm with N dd's at once, the
# host copy floor; to disk with conv=fsync, the write floor) and `quantize convert --device
# cuda:0..N-1` for each N in GPUS; every output's bytes hashed against the first run's.
#   OUT=/tmp/out LAYERS=80 GPUS="1 2 4" ALGOS="FP8_PB_WO NVFP4" bash bench/devices_host.sh
# RAY=1 also runs, for each N, `--executor ray --ray-address` against a Ray head started beforehand with
# N GPUs (bench/ray_head.py, CUDA_VISIBLE_DEVICES=0..N-1: a joined head, as a running cluster is), its
# output hashed against the local one (ray must be importable: bench/ray_carry.py makes .whl-ray);
# RAY_N="2 4" limits the Ray runs to those counts (default: every count of GPUS).
# WARM=1 first converts a one-layer input with each algorithm (not timed): the first run of a fresh
# machine otherwise includes compiling the kernels.
# KIND=cpu tries the script on a machine without a GPU (cpu, cpu,cpu ...; use LAYERS=1; Ray's head gets N CPUs).
# TREES=". .base" times each checkout in turn (a `git archive` of another commit: before/after, same run;
# the command runs with the tree as its cwd, which `python -m` puts first on sys.path).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LAYERS=${LAYERS:-80}; IN_DIR=${IN_DIR:-/dev/shm/qin}; DISK=${DISK:-/root/qout}
GPUS=${GPUS:-"1 2 4"}; TREES=${TREES:-.}; ALGOS=${ALGOS:-"FP8_PB_WO NVFP4"}; PLACES=${PLACES:-"shm disk"}; BUDGET=${BUDGET:-4GB}
DEADLINE=$((SECONDS + ${SECONDS_MAX:-540}))
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
python3 -c "import torch, triton, quantize_cli.cli"
t() { local s; s=$(date +%s.%N); "$@"; python3 -c "print(f'{$(date +%s.%N) - $s:.2f}')"; }
# the peak RSS of a command's process tree, written to the file $1 (GB)
WRAP='import resource, subprocess, sys; rc = subprocess.run(sys.argv[2:]).returncode; open(sys.argv[1], "w").write(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6:.2f}"); sys.exit(rc)'
# `ray_run ALGO PLACE N ROOT`: a Ray head with N devices started first (not timed), then the command
# that joins it (timed, as the local runs), its output hashed against the local run's ($ref)
ray_run() {
  local algo=$1 place=$2 n=$3 root=$4 where=$OUT/ray-head.address vis gpus cpus dst tag s sum
  rm -f "$where"; vis=$(python3 -c "print(','.join(map(str, range($n))))")
  if [ "${KIND:-cuda}" = cuda ]; then gpus=$n; cpus=""; else gpus=0; cpus="--cpus $n"; fi
  CUDA_VISIBLE_DEVICES=$vis setsid python3 bench/ray_head.py "$where" --gpus $gpus $cpus > "$OUT/ray-head-$n.log" 2>&1 &
  local head=$!
  for _ in $(seq 600); do [ -s "$where" ] && break; kill -0 $head 2>/dev/null || break; sleep 0.2; done
  if [ ! -s "$where" ]; then echo "$algo $place Ray head with $n: did not start ($(tail -1 "$OUT/ray-head-$n.log"))"; kill $head 2>/dev/null; return; fi
  dst=$root/out-$algo-ray-$n; rm -rf "$dst"; tag=$algo-$place-ray-$n
  s=$(t sh -c "RAY_AUTH_MODE=\${RAY_AUTH_MODE:-token} python3 -c '$WRAP' $OUT/rss-$tag python3 -m quantize_cli convert $IN_DIR -o $dst --algo $algo --executor ray --ray-address $(cat "$where") --device ${KIND:-cuda} --max-shard-size 5GB --memory-budget $BUDGET --quiet --report $OUT/r-$tag.json > $OUT/log-$tag.txt 2>&1; echo rc=\$? >> $OUT/log-$tag.txt; sync")
  sum=$( (cat "$dst"/*.safetensors 2>/dev/null || true) | md5sum | cut -c1-10)
  echo "$algo $place Ray joined head with $n: $s s, md5 $sum $([ "$sum" = "$ref" ] && echo same || echo DIFFERENT), driver rss $(cat $OUT/rss-$tag 2>/dev/null) GB, $(tail -1 $OUT/log-$tag.txt)"
  rm -rf "$dst"; kill -INT $head 2>/dev/null; sleep 1; kill $head 2>/dev/null; wait $head 2>/dev/null
}
s=$(t python3 bench/devices_host_input.py "$IN_DIR" "$LAYERS")
in_bytes=$(du -sb "$IN_DIR" | cut -f1)
echo "input $IN_DIR: $LAYERS layers, $((in_bytes / 1000000000)) GB, made in $s s; $(nproc) cores, $(nvidia-smi -L 2>/dev/null | wc -l) GPUs"
mkdir -p "$DISK"
if [ "${WARM:-0}" = 1 ]; then
  python3 bench/devices_host_input.py /dev/shm/qwarm 1 > /dev/null
  for algo in $ALGOS; do python3 -m quantize_cli convert /dev/shm/qwarm -o /dev/shm/qwarm-out --algo $algo --device ${KIND:-cuda}$([ "${KIND:-cuda}" = cuda ] && echo :0) --overwrite --quiet > /dev/null 2>&1 || echo "warm-up $algo failed"; done
  rm -rf /dev/shm/qwarm /dev/shm/qwarm-out; echo "warm-up: kernels compiled (not timed)"
fi
have=$(nvidia-smi -L 2>/dev/null | wc -l)  # a count in GPUS above it is skipped (cuda:N would not exist)
for algo in $ALGOS; do
  for place in $PLACES; do
    [ "$place" = shm ] && root=/dev/shm/qout || root=$DISK
    mkdir -p "$root"; ref=
    for n in $GPUS; do
     [ "${KIND:-cuda}" = cuda ] && [ "$n" -gt "$have" ] && { echo "GPUS=$n: this machine has $have GPU(s); skipped"; continue; }
     for tree in $TREES; do
      [ $SECONDS -gt $DEADLINE ] && { echo "deadline: skipping $algo $place $n $tree"; continue; }
      dev=$(python3 -c "print(','.join('${KIND:-cuda}' + (':%d' % i if '${KIND:-cuda}' == 'cuda' else '') for i in range($n)))")
      dst=$root/out-$algo-$n; rm -rf "$dst"; tag=$algo-$place-$n-$(basename "$(cd "$tree" && pwd)")
      s=$(t sh -c "cd $tree && python3 -c '$WRAP' $OUT/rss-$tag python3 -m quantize_cli convert $IN_DIR -o $dst --algo $algo --device $dev --max-shard-size 5GB --memory-budget $BUDGET --quiet --report $OUT/r-$tag.json > $OUT/log-$tag.txt 2>&1; echo rc=\$? >> $OUT/log-$tag.txt; sync")
      out_bytes=$(du -sb "$dst" | cut -f1)
      sum=$(cat "$dst"/*.safetensors | md5sum | cut -c1-10)
      rss=$(cat $OUT/rss-$tag 2>/dev/null)
      [ -z "$ref" ] && ref=$sum
      echo "$algo $place GPUs=$n tree=$tree: $s s, $((in_bytes / 1000000)) MB in / $((out_bytes / 1000000)) MB out, md5 $sum $([ "$sum" = "$ref" ] && echo same || echo DIFFERENT), rss $rss GB, $(tail -1 $OUT/log-$tag.txt)"
      [ "$n" != "${GPUS##* }" ] && rm -rf "$dst"
     done
     if [ "${RAY:-0}" = 1 ] && [ $SECONDS -le $DEADLINE ] && [[ " ${RAY_N:-$GPUS} " == *" $n "* ]]; then ray_run "$algo" "$place" "$n" "$root"; fi
    done
    # the floor of this place: read the input while writing the output's bytes, with as many writers as GPUs at most
    n=${GPUS##* }; per=$((out_bytes / n / 16777216 + 1))
    if [ "$place" = shm ]; then
      w="for i in \$(seq $n); do dd if=/dev/zero of=$root/floor.\$i bs=16M count=$per status=none & done; wait"
    else
      w="dd if=/dev/zero of=$root/floor.1 bs=16M count=$((out_bytes / 16777216 + 1)) conv=fsync status=none"
    fi
    rm -rf "$root"/out-*
    f=$(t sh -c "cat $IN_DIR/*.safetensors > /dev/null & $w; wait")
    rm -f "$root"/floor.*
    echo "$algo $place floor (read input || write $((out_bytes / 1000000)) MB$([ "$place" = shm ] && echo " with $n writers" || echo ", fsync")): $f s"
  done
done
