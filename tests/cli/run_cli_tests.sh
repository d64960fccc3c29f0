#!/usr/bin/env bash
# End-to-end checks of the mnist_ensemble program: a short real run with every output flag, exact
# resume, and the error paths (usage errors exit 2 with one line; data/checkpoint errors exit 1).
# usage: run_cli_tests.sh /path/to/mnist_ensemble
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 passes=0
pass() { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

# expect NAME CODE PATTERN -- CMD...: exit code CODE and stderr (one line for usage errors) matching PATTERN.
expect() {
  local name=$1 code=$2 pattern=$3; shift 4
  "$@" >"$work/out" 2>"$work/err"; local got=$?
  if [ "$got" -ne "$code" ]; then fail "$name: exit $got, expected $code ($(head -c 300 "$work/err"))"; return; fi
  if ! grep -qE -- "$pattern" "$work/err" "$work/out"; then fail "$name: output lacks /$pattern/"; return; fi
  if [ "$code" -eq 2 ] && [ "$(wc -l <"$work/err")" -ne 1 ]; then fail "$name: usage error is not one line"; return; fi
  if grep -qiE 'core dumped|terminate called|Segmentation' "$work/err"; then fail "$name: crashed"; return; fi
  pass "$name"
}

python3 "$here/make_idx.py" "$work/data" 512 200
run=("$bin" --data "$work/data" --devices 2 --members 2 --batch-size 64 --progress plain)

expect "help" 0 "usage: mnist_ensemble" -- "$bin" --help
expect "bad number" 2 "--epochs: 'x' is not an integer" -- "$bin" --epochs x
expect "unknown flag" 2 "unknown flag '--nope'" -- "$bin" --nope
expect "missing value" 2 "--data needs a value" -- "$bin" --data
expect "missing data" 1 "error: .*train-images-idx3-ubyte" -- "$bin" --data "$work/none" --epochs 1
expect "members not multiple" 1 "--members 3 is not a multiple of --devices 2" -- "${run[@]}" --members 3 --epochs 1

# A full short run writing every output, then exact resume.
expect "train 2 epochs" 0 "ensemble" -- "${run[@]}" --epochs 2 --metrics-json "$work/m.json" \
  --metrics-csv "$work/m.csv" --plot "$work/p.svg" --save "$work/ck2.safetensors"
[ -s "$work/m.json" ] && [ -s "$work/m.csv" ] && [ -s "$work/p.svg" ] && pass "outputs written" || fail "outputs written"
python3 - "$work/m.json" <<'PY' && pass "metrics json shape" || fail "metrics json shape"
import json, sys
m = json.load(open(sys.argv[1]))
assert set(m) == {"config", "epochs", "final"}, m.keys()
assert len(m["epochs"]) == 2 and m["final"] == m["epochs"][-1]
e = m["final"]
for k in ("epoch", "train_loss", "train_accuracy", "test_loss", "member_test_accuracy",
          "ensemble_test_accuracy", "seconds", "model_images_per_second"):
    assert k in e, k
assert len(e["member_test_accuracy"]) == 2
assert m["config"]["members"] == 2 and m["config"]["devices"] == 2
PY
expect "train 1 epoch" 0 "ensemble" -- "${run[@]}" --epochs 1 --save "$work/ck1.safetensors"
expect "resume to 2" 0 "resumed after epoch 1" -- "${run[@]}" --epochs 2 --resume "$work/ck1.safetensors" \
  --save "$work/ck1b.safetensors" --metrics-json "$work/r.json"
# Two safetensors files hold the same tensor bytes (their metadata, with timings, may differ).
same_tensors() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
def tensors(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; return b[8 + n:]
sys.exit(0 if tensors(sys.argv[1]) == tensors(sys.argv[2]) else 1)
PY
}
cmp -s "$work/ck2.safetensors" "$work/ck1b.safetensors" && pass "resume is exact (checkpoint bytes equal)" \
  || { same_tensors "$work/ck2.safetensors" "$work/ck1b.safetensors" \
       && pass "resume is exact (tensor bytes equal; metadata timings differ)" || fail "resume is exact"; }

# --epochs 0 still writes what was asked for: the initial members' checkpoint, which resumes to the same
# training as a straight run, and metrics with no epochs.
expect "epochs 0 saves the initial members" 0 "ensemble" -- "${run[@]}" --epochs 0 --save "$work/ck0.safetensors" \
  --metrics-json "$work/m0.json"
python3 - "$work/m0.json" <<'PY' && pass "epochs 0 metrics json" || fail "epochs 0 metrics json"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["epochs"] == [] and m["final"] is None, m
PY
expect "resume from epoch 0" 0 "resumed after epoch 0" -- "${run[@]}" --epochs 1 --resume "$work/ck0.safetensors" \
  --save "$work/ck0b.safetensors"
same_tensors "$work/ck1.safetensors" "$work/ck0b.safetensors" && pass "resume from epoch 0 is exact" \
  || fail "resume from epoch 0 is exact"

# The CUDA backend: it trains on a GPU; where no GPU is usable it says so (exit 1) and does not crash.
# PMAPCC_REQUIRE_GPU=1 (scripts/gpu_checks.sh) demands the GPU run.
"${run[@]}" --backend cuda --epochs 1 --metrics-json "$work/cuda.json" >"$work/out" 2>"$work/err"; rc=$?
if [ "$rc" -eq 0 ] && [ -s "$work/cuda.json" ]; then
  pass "--backend cuda trains on the GPU"
elif [ "$rc" -eq 1 ] && grep -qE "error: (no GPU is usable here|CUDA devices requested, but)" "$work/err" \
     && [ "${PMAPCC_REQUIRE_GPU:-0}" != 1 ]; then
  pass "--backend cuda without a usable GPU: $(head -c 120 "$work/err")"
else
  fail "--backend cuda: exit $rc ($(head -c 300 "$work/err"))"
fi
# The CUDA kernels run on the host (CPU devices): the same training to float reassociation (2 steps: the
# host GEMM is a plain reference loop, slow under the sanitizers).
few=(--epochs 1 --train-limit 128 --test-limit 100)
expect "cuda kernels on the host" 0 "CUDA kernels run on the host" -- "${run[@]}" "${few[@]}" --kernels cuda-on-host \
  --metrics-json "$work/host.json"
expect "cpu kernels" 0 "ensemble" -- "${run[@]}" "${few[@]}" --metrics-json "$work/cpu.json"
python3 - "$work/host.json" "$work/cpu.json" <<'PY' && pass "cuda-on-host trains like the CPU ops" || fail "cuda-on-host trains like the CPU ops"
import json, sys
h, c = (json.load(open(p)) for p in sys.argv[1:])
assert h["config"]["kernels"] == "cuda-on-host" and c["config"]["kernels"] == "native"
hl, cl = h["final"]["train_loss"], c["final"]["train_loss"]
assert abs(hl - cl) <= 1e-5 * abs(cl), (hl, cl)
assert abs(h["final"]["test_loss"] - c["final"]["test_loss"]) <= 1e-4 * abs(c["final"]["test_loss"])
PY
expect "cuda-on-host needs CPU devices" 1 "for CPU devices" -- "${run[@]}" "${few[@]}" --kernels cuda-on-host --backend cuda
expect "bad kernels" 2 "--kernels: 'gpu' is not native or cuda-on-host" -- "$bin" --kernels gpu
expect "bad report interval" 2 "--report-every: 0 is out of range" -- "$bin" --report-every 0

head -c 1000 "$work/ck1.safetensors" >"$work/trunc.safetensors"
expect "truncated checkpoint" 1 "error: .*trunc.safetensors" -- "${run[@]}" --epochs 2 --resume "$work/trunc.safetensors"
expect "checkpoint seed mismatch" 1 "seed" -- "${run[@]}" --epochs 2 --seed 5 --resume "$work/ck1.safetensors"
printf 'garbage' >"$work/data/t10k-labels-idx1-ubyte"
expect "corrupt data" 1 "error: .*t10k-labels-idx1-ubyte" -- "${run[@]}" --epochs 1

echo "cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
