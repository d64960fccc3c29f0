#!/usr/bin/env bash
# mnist_ensemble under mpirun against one process with as many devices, on a generated dataset:
#   - the metrics (every epoch, timings aside) and the checkpoint's tensors are bitwise equal;
#   - only the main process prints: one header, one final table;
#   - a checkpoint written by the P-process run resumes exactly in one process, and the reverse.
# Model parallel: the 'model' axis of a 1xNP mesh spans the processes (each layer's psum crosses them).
# usage: run_program_case.sh MPIEXEC NP ensemble|data-parallel|model-parallel MNIST_ENSEMBLE MAKE_IDX_PY
set -uo pipefail
mpiexec=$1 np=$2 mode=$3 bin=$4 make_idx=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags=()
"$mpiexec" --version 2>&1 | grep -Eq "Open MPI|OpenRTE" && flags+=(--oversubscribe)
status=0
fail() { echo "run_program_case FAILED: $*"; status=1; }

python3 "$make_idx" "$work/data" 384 150 0.25 || exit 1  # noisy labels: accuracies below 100%
# One device per process; the single process gets all of them. Ensemble: 2 members per device.
if [ "$mode" = ensemble ]; then
  common=(--data "$work/data" --mode ensemble --members $((2 * np)) --batch-size 32 --progress plain)
elif [ "$mode" = model-parallel ]; then
  common=(--data "$work/data" --mode model-parallel --mesh "1x$np" --batch-size 32 --progress plain)
else
  common=(--data "$work/data" --mode data-parallel --batch-size $((16 * np)) --progress plain)
fi

run() {  # run NAME PROCESSES ARGS...: one process with PROCESSES devices, or PROCESSES processes of one device
  local name=$1 p=$2; shift 2
  local cmd=("$bin" "${common[@]}" "$@")
  if [ "$p" = 1 ]; then
    "${cmd[@]}" --devices "$np" >"$work/$name.out" 2>&1
  else
    timeout 300 "$mpiexec" "${flags[@]}" -np "$p" "${cmd[@]}" --devices 1 >"$work/$name.out" 2>&1
  fi
  local rc=$?
  echo "---- $name (exit $rc):"
  cat "$work/$name.out"
  [ $rc -eq 0 ] || fail "$name exited with status $rc"
}

run single 1 --epochs 2 --metrics-json "$work/single.json" --save "$work/single.safetensors"
run multi "$np" --epochs 2 --metrics-json "$work/multi.json" --save "$work/multi.safetensors"
# Resume across the two layouts: 1 epoch in one, 1 more in the other.
run multi_e1 "$np" --epochs 1 --save "$work/multi_e1.safetensors"
run single_resumed 1 --epochs 2 --resume "$work/multi_e1.safetensors" --metrics-json "$work/single_resumed.json" \
  --save "$work/single_resumed.safetensors"
run single_e1 1 --epochs 1 --save "$work/single_e1.safetensors"
run multi_resumed "$np" --epochs 2 --resume "$work/single_e1.safetensors" --metrics-json "$work/multi_resumed.json" \
  --save "$work/multi_resumed.safetensors"

headers=$(grep -c "^pmapcc mnist_ensemble:" "$work/multi.out")
tables=$(grep -c "^ensemble  *[0-9.]* %\|^  member  device" "$work/multi.out")
[ "$headers" = 1 ] || fail "the $np-process run printed $headers headers (only the main process prints)"
grep -q "^$np processes, 1 device(s) each" "$work/multi.out" || fail "the $np-process run does not say it spans $np processes"
[ "$(grep -c '^epoch 2/2' "$work/multi.out")" = 1 ] || fail "the $np-process run did not print epoch 2 exactly once"
[ "$tables" -ge 1 ] || fail "the $np-process run printed no final table"

python3 - "$work" <<'PY' || fail "results differ"
import json, struct, sys
work = sys.argv[1]
TIMING = {"seconds", "eval_seconds", "model_images_per_second"}

def metrics(name):
    with open(f"{work}/{name}.json") as f:
        j = json.load(f)
    return [{k: v for k, v in e.items() if k not in TIMING} for e in j["epochs"]], j["config"]

def tensors(name):
    with open(f"{work}/{name}.safetensors", "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}

ok = True
def same(what, a, b):
    global ok
    if a != b:
        ok = False
        print(f"DIFFER: {what}")
    else:
        print(f"equal: {what}")

single, c1 = metrics("single")
multi, cp = metrics("multi")
assert c1["processes"] == 1 and cp["processes"] > 1 and c1["devices"] == cp["devices"], (c1, cp)
same(f"metrics of {len(single)} epochs, {cp['processes']} processes vs 1 ({c1['devices']} devices)", single, multi)
t1, tp = tensors("single"), tensors("multi")
same(f"checkpoint tensors ({len(t1)}, {sum(map(len, t1.values()))} bytes)", t1, tp)
same("1 epoch in P processes, resumed for 1 in one process: metrics", metrics("single_resumed")[0], single)
same("... and tensors", tensors("single_resumed"), t1)
same("1 epoch in one process, resumed for 1 in P processes: metrics", metrics("multi_resumed")[0], single)
same("... and tensors", tensors("multi_resumed"), t1)
print("final:", json.dumps(single[-1]))
sys.exit(0 if ok else 1)
PY
exit $status
