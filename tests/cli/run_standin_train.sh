#!/usr/bin/env bash
# mnist_ensemble --backend cuda end to end on the CUDA stand-in's fake GPUs (a PMAPCC_CUDA_STANDIN build):
# ensembles on 1 GPU (virtual devices), one member per GPU on 2 and 4 GPUs, data- and model-parallel, a
# checkpoint moved from fake GPUs to CPU devices and back. Every run's checkpoint must equal, bit for bit,
# the same run on CPU devices with the CUDA kernels run on the host (--kernels cuda-on-host): the stand-in
# runs those very kernels and the host GEMM's arithmetic, so any difference is the GPU orchestration's
# (streams, copies, graphs, the device hub). Runs repeat bit for bit.
# usage: run_standin_train.sh /path/to/mnist_ensemble [quick|small]
#   small: every configuration on 64 images in batches of 16 (4 steps an epoch: the first eager, the second
#          captured, then replays), for AddressSanitizer; quick: one configuration on them, for ThreadSanitizer
set -uo pipefail
bin=$(realpath "$1")
mode=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 passes=0
pass() { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

case "$mode" in
  "") images=(320 100) batch=32 ;;
  quick | small) images=(64 16) batch=16 ;;
  *) echo "run_standin_train.sh: unknown mode '$mode' (quick or small)" >&2; exit 2 ;;
esac
python3 "$here/make_idx.py" "$work/data" "${images[@]}"
same() { python3 "$root/scripts/compare_checkpoints.py" "$1" "$2" >/dev/null 2>&1; }
common=(--data "$work/data" --batch-size "$batch" --progress plain)

# train NAME GPUS ARGS...: the run on GPUS fake GPUs and the host run of the same kernels on CPU devices;
# their checkpoints must be the same bits.
train() {
  local name=$1 gpus=$2; shift 2
  if ! PMAPCC_STANDIN_GPUS=$gpus "$bin" "${common[@]}" --backend cuda "$@" --save "$work/$name.gpu.st" \
      >"$work/$name.gpu.out" 2>&1; then
    fail "$name: the run on $gpus fake GPU(s) failed: $(tail -c 400 "$work/$name.gpu.out")"; return 1
  fi
  if ! "$bin" "${common[@]}" --backend cpu --kernels cuda-on-host "$@" --save "$work/$name.host.st" \
      >"$work/$name.host.out" 2>&1; then
    fail "$name: the host run failed: $(tail -c 400 "$work/$name.host.out")"; return 1
  fi
  if python3 "$root/scripts/compare_checkpoints.py" "$work/$name.gpu.st" "$work/$name.host.st" \
      >"$work/$name.cmp" 2>&1; then
    pass "$name: $gpus fake GPU(s) = the host run, bit for bit"
  else
    fail "$name: $gpus fake GPU(s) differ from the host run: $(grep -v ': same' "$work/$name.cmp" | head -5)"
  fi
}

if [ "$mode" = quick ]; then  # ThreadSanitizer (for CI's time): one member per GPU over NCCL
  train per-gpu-2 2 --devices 2 --members 2 --epochs 1
else
  train ensemble-1 1 --devices 1 --members 1 --epochs 1
  train ensemble-4-virtual 1 --devices 4 --members 4 --epochs 1
  train ensemble-8-on-4-virtual 1 --devices 4 --members 8 --epochs 1
  train per-gpu-2 2 --devices 2 --members 2 --epochs 1
  train per-gpu-4 4 --devices 4 --members 4 --epochs 1
  train data-parallel-2 2 --mode data-parallel --devices 2 --epochs 1
  train model-parallel-1x2 2 --mode model-parallel --mesh 1x2 --devices 2 --epochs 1
  train model-parallel-2x2 4 --mode model-parallel --mesh 2x2 --devices 4 --epochs 1 --model keras-convnet

  # Run to run: the same bits again.
  PMAPCC_STANDIN_GPUS=2 "$bin" "${common[@]}" --backend cuda --devices 2 --members 2 --epochs 1 \
    --save "$work/again.st" >/dev/null 2>&1
  same "$work/per-gpu-2.gpu.st" "$work/again.st" && pass "a run repeats bit for bit" \
    || fail "a run does not repeat bit for bit"

  # A checkpoint from fake GPUs resumed on CPU devices, and one from CPU devices resumed on fake GPUs: both
  # equal the two-epoch run made in one go.
  PMAPCC_STANDIN_GPUS=2 "$bin" "${common[@]}" --backend cuda --devices 2 --members 2 --epochs 2 \
    --save "$work/straight.st" >/dev/null 2>&1
  "$bin" "${common[@]}" --backend cpu --kernels cuda-on-host --devices 2 --members 2 --epochs 2 \
    --resume "$work/per-gpu-2.gpu.st" --save "$work/gpu-then-cpu.st" >"$work/r1.out" 2>&1
  same "$work/straight.st" "$work/gpu-then-cpu.st" && pass "fake GPUs -> CPU devices: resumed exactly" \
    || fail "fake GPUs -> CPU devices: $(tail -c 300 "$work/r1.out")"
  PMAPCC_STANDIN_GPUS=2 "$bin" "${common[@]}" --backend cuda --devices 2 --members 2 --epochs 2 \
    --resume "$work/per-gpu-2.host.st" --save "$work/cpu-then-gpu.st" >"$work/r2.out" 2>&1
  same "$work/straight.st" "$work/cpu-then-gpu.st" && pass "CPU devices -> fake GPUs: resumed exactly" \
    || fail "CPU devices -> fake GPUs: $(tail -c 300 "$work/r2.out")"
fi

# No fake GPU: --backend cuda says so and exits 1.
PMAPCC_STANDIN_GPUS=0 "$bin" "${common[@]}" --backend cuda --epochs 1 >"$work/none.out" 2>&1; rc=$?
if [ "$rc" -eq 1 ] && grep -qi "gpu" "$work/none.out" && ! grep -qiE "core dumped|terminate" "$work/none.out"; then
  pass "no GPU: exit 1 saying why"
else
  fail "no GPU: exit $rc ($(tail -c 300 "$work/none.out"))"
fi

# A bad PMAPCC_STANDIN_NODE: exit 2 naming it.
PMAPCC_STANDIN_NODE=first "$bin" "${common[@]}" --backend cuda --epochs 1 >"$work/node.out" 2>&1; rc=$?
if [ "$rc" -eq 2 ] && grep -q "PMAPCC_STANDIN_NODE" "$work/node.out"; then
  pass "a bad PMAPCC_STANDIN_NODE: exit 2 naming it"
else
  fail "a bad PMAPCC_STANDIN_NODE: exit $rc ($(tail -c 300 "$work/node.out"))"
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
