#!/usr/bin/env bash
# The seeds' examples with --backend cuda on the CUDA stand-in's fake GPUs (a PMAPCC_CUDA_STANDIN build):
# every jitted step, collectives included (flax_ensemble's pmean of the probabilities over "ensemble",
# keras_data_parallel's pmean of the gradients over "data"), is captured once per device and then runs as
# one graph launch per step, on 1 GPU (a one-device mesh: local collectives) and on 2 (NCCL). Each run's
# final loss and accuracies must match the same run on CPU devices (other kernels: to 1e-3 on the loss,
# 2 points of accuracy), so a graph replaying stale collectives or buffers fails here.
# usage: run_standin_examples.sh PATH/TO/flax_ensemble PATH/TO/keras_data_parallel [quick]
#   quick: the 2-GPU runs only, on half the images (AddressSanitizer)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 passes=0
pass() { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
mode=${3:-}
if [ $# -lt 2 ] || [ $# -gt 3 ] || { [ -n "$mode" ] && [ "$mode" != quick ]; }; then
  echo "usage: run_standin_examples.sh PATH/TO/flax_ensemble PATH/TO/keras_data_parallel [quick]" >&2
  exit 2
fi
images=(640 200)
[ "$mode" = quick ] && images=(320 100)
python3 "$here/make_idx.py" "$work/data" "${images[@]}" 0.1 || exit 1
common=(--data "$work/data" --epochs 1 --seed 3)

cat >"$work/close.py" <<'EOF'
import json, sys
a, b = (json.load(open(p))["final"] for p in sys.argv[1:3])
problems = []
if abs(a["train_loss"] - b["train_loss"]) > 1e-3 * max(1.0, abs(b["train_loss"])):
    problems.append(f"train_loss {a['train_loss']} vs {b['train_loss']}")
for k in ("ensemble_test_accuracy",):
    if abs(a[k] - b[k]) > 0.02:
        problems.append(f"{k} {a[k]} vs {b[k]}")
if len(a["member_test_accuracy"]) != len(b["member_test_accuracy"]):
    problems.append(f"{len(a['member_test_accuracy'])} members vs {len(b['member_test_accuracy'])}")
for i, (x, y) in enumerate(zip(a["member_test_accuracy"], b["member_test_accuracy"])):
    if abs(x - y) > 0.02:
        problems.append(f"member {i} accuracy {x} vs {y}")
print("; ".join(problems))
sys.exit(1 if problems else 0)
EOF

# run NAME BIN GPUS "JITTED FUNCTIONS" ARGS...: BIN on GPUS fake GPUs (--devices GPUS) and on as many CPU
# devices.
run() {
  local name=$1 bin=$2 gpus=$3 functions=$4; shift 4
  if ! PMAPCC_STANDIN_GPUS=$gpus PMAPCC_REQUIRE_GPU=1 "$bin" "${common[@]}" --backend cuda --devices "$gpus" "$@" \
      --metrics-json "$work/$name.gpu.json" >"$work/$name.gpu.out" 2>&1; then
    fail "$name: the run on $gpus fake GPU(s) failed: $(tail -c 400 "$work/$name.gpu.out")"; return
  fi
  # Each jitted function: one capture per GPU, and every call after its trace a graph launch (the capture's
  # own included: as many launches as replays), none refused.
  local f stats graphs replays launches ok=1
  for f in $functions; do
    stats=$(grep -E "^jit $f: [0-9]+ trace\(s\), [0-9]+ replays" "$work/$name.gpu.out" | head -1)
    graphs=$(grep -E "^jit $f: $gpus graph capture\(s\), [0-9]+ graph launches$" "$work/$name.gpu.out" | head -1)
    replays=$(sed -E 's/.* ([0-9]+) replays.*/\1/' <<<"$stats")
    launches=$(sed -E 's/.* ([0-9]+) graph launches$/\1/' <<<"$graphs")
    if [ -z "$stats" ] || [ -z "$graphs" ] || [ "$launches" != "$replays" ] || [ "$replays" -lt 1 ]; then
      fail "$name: $f is not one capture per GPU, then a graph launch per call: '$stats' / '$(grep -E "^jit $f: .*graph" "$work/$name.gpu.out" | head -1)'"
      ok=0
    fi
  done
  [ $ok -eq 1 ] && pass "$name: $gpus fake GPU(s), every call of $functions after its trace a graph launch"
  if ! "$bin" "${common[@]}" --backend cpu --devices "$gpus" "$@" --metrics-json "$work/$name.cpu.json" \
      >"$work/$name.cpu.out" 2>&1; then
    fail "$name: the run on CPU devices failed: $(tail -c 400 "$work/$name.cpu.out")"; return
  fi
  local why
  if why=$(python3 "$work/close.py" "$work/$name.gpu.json" "$work/$name.cpu.json"); then
    pass "$name: the results of the same run on CPU devices"
  else
    fail "$name: differs from the run on CPU devices: $why"
  fi
}

if [ "$mode" != quick ]; then
  run flax-1 "$1" 1 "apply_model update_model" --members 2
  run keras-1 "$2" 1 train_step
fi
run flax-2 "$1" 2 "apply_model update_model"
run keras-2 "$2" 2 train_step
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
