#!/usr/bin/env bash
# End-to-end checks of the mnist_ensemble program: a short real run with every output flag, exact
# resume, and the error paths (usage errors exit 2 with one line; data/checkpoint errors exit 1).
# usage: run_cli_tests.sh /path/to/mnist_ensemble
set -uo pipefail
bin=$(realpath "$1")
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

python3 "$here/make_idx.py" "$work/data" 384 200  # 6 steps of 64 an epoch: minutes under the sanitizers
run=("$bin" --data "$work/data" --devices 2 --members 2 --batch-size 64 --progress plain)
ev=("$bin" --data "$work/data" --devices 2 --progress plain)  # --evaluate: the checkpoint has the recipe

expect "help" 0 "usage: mnist_ensemble" -- "$bin" --help
expect "version" 0 "^mnist_ensemble \\(pmapcc [0-9]+\\.[0-9]+\\.[0-9]+\\): CUDA (on|off), NCCL (on|off), MPI (on|off)$" -- \
  "$bin" --version
# Output paths are checked before anything is read or trained: a run that would lose its table at the end
# stops at once instead (the data here is fine; no epoch runs).
expect "output directory missing" 2 "--predict $work/none/p.csv: the directory '$work/none' does not exist" -- \
  "${run[@]}" --epochs 1 --predict "$work/none/p.csv"
! grep -q "epoch" "$work/out" && pass "output directory missing: nothing trained" || fail "output directory missing: nothing trained"
expect "output is a directory" 2 "--metrics-json $work: is a directory, not a file" -- \
  "${run[@]}" --epochs 1 --metrics-json "$work"
expect "two outputs, one file" 2 "--plot $work/./a: the same file as --metrics-json" -- \
  "${run[@]}" --epochs 1 --metrics-json "$work/a" --plot "$work/./a"
expect "evaluate takes no training flag" 2 "--evaluate trains nothing: --epochs is a training flag" -- \
  "$bin" --evaluate x --epochs 2
expect "evaluate takes no optimizer flag" 2 "--evaluate trains nothing: --lr is a training flag" -- \
  "$bin" --evaluate x --lr 0.1
expect "evaluate takes no --no-summary" 2 "--no-summary is for training" -- "$bin" --evaluate x --no-summary
expect "summary and no summary" 2 "--summary excludes --no-summary" -- "$bin" --summary --no-summary
expect "bad number" 2 "--epochs: 'x' is not an integer" -- "$bin" --epochs x
expect "unknown flag" 2 "unknown flag '--nope'" -- "$bin" --nope
expect "missing value" 2 "--data needs a value" -- "$bin" --data
expect "missing data" 1 "error: .*train-images-idx3-ubyte" -- "$bin" --data "$work/none" --epochs 1
expect "members not multiple" 1 "--members 3 is not a multiple of --devices 2" -- "${run[@]}" --members 3 --epochs 1

# A full short run writing every output, then exact resume.
expect "train 2 epochs" 0 "ensemble" -- "${run[@]}" --epochs 2 --metrics-json "$work/m.json" \
  --metrics-csv "$work/m.csv" --plot "$work/p.svg" --save "$work/ck2.safetensors"
[ -s "$work/m.json" ] && [ -s "$work/m.csv" ] && [ -s "$work/p.svg" ] && pass "outputs written" || fail "outputs written"
# The model's table is printed at the start, before the first epoch (Keras's summary: the Flax CNN's 824,458).
python3 - "$work/out" <<'PY' && pass "model summary at the start" || fail "model summary at the start"
import sys
out = open(sys.argv[1]).read()
assert "Total params: 824,458" in out and out.index("Total params") < out.index("epoch 1/2"), out[:2000]
PY
expect "no summary" 0 "ensemble" -- "${run[@]}" --epochs 1 --train-limit 64 --no-summary
! grep -q "Total params" "$work/out" && pass "--no-summary leaves the table out" || fail "--no-summary leaves the table out"
python3 - "$work/m.json" <<'PY' && pass "metrics json shape" || fail "metrics json shape"
import json, sys
m = json.load(open(sys.argv[1]))
assert set(m) == {"config", "epochs", "final", "ensemble_size_curve"}, m.keys()
assert len(m["epochs"]) == 2 and m["final"] == m["epochs"][-1]
e = m["final"]
for k in ("epoch", "train_loss", "train_accuracy", "test_loss", "member_test_accuracy",
          "ensemble_test_accuracy", "seconds", "model_images_per_second", "member_test_nll", "member_test_brier",
          "member_test_ece", "member_test_entropy", "ensemble_test_nll", "ensemble_test_brier", "ensemble_test_ece",
          "ensemble_test_entropy", "ensemble_reliability", "best_member_reliability"):
    assert k in e, k
assert len(e["member_test_accuracy"]) == 2 and len(e["member_test_nll"]) == 2
assert len(e["ensemble_reliability"]["count"]) == 15
assert sum(e["ensemble_reliability"]["count"]) == 200  # every test image in one bin
curve = m["ensemble_size_curve"]
assert [p["members"] for p in curve] == [1, 2]
assert curve[0]["test_accuracy"] == e["member_test_accuracy"][0]
assert m["config"]["members"] == 2 and m["config"]["devices"] == 2
assert m["config"]["lr"] == 0.1 and m["config"]["momentum"] == 0.9 and m["config"]["dataset"] == "mnist"
assert m["config"]["optimizer"] == "sgd" and m["config"]["lr_schedule"] == "constant" and m["config"]["weight_decay"] == 0
PY
grep -q '"lr": 0.1,' "$work/m.json" && pass "the config is recorded as given (lr 0.1)" || fail "the config is recorded as given"
# The ensemble saved after epoch 2, evaluated alone on the same devices: the run's final evaluation, bitwise;
# --predict writes one line per test image with the members' votes.
expect "evaluate a checkpoint" 0 "evaluating .*ck2.safetensors \\(epoch 2\\)" -- "${ev[@]}" --evaluate "$work/ck2.safetensors" \
  --metrics-json "$work/e.json" --predict "$work/pred.csv" --plot "$work/e.svg"
python3 - "$work/m.json" "$work/e.json" "$work/pred.csv" <<'PY' && pass "evaluate equals the run's last epoch; predictions" || fail "evaluate equals the run's last epoch; predictions"
import csv, json, sys
t, e = json.load(open(sys.argv[1]))["final"], json.load(open(sys.argv[2]))
ev = e["evaluation"]
assert ev["train_loss"] is None and ev["train_accuracy"] is None, ev  # nothing was trained
for k, v in ev.items():
    if k not in ("train_loss", "train_accuracy", "seconds", "eval_seconds", "model_images_per_second"):
        assert t[k] == v, (k, t[k], v)
assert e["ensemble_size_curve"] == json.load(open(sys.argv[1]))["ensemble_size_curve"]
rows = list(csv.reader(open(sys.argv[3])))
assert rows[0] == ["index", "label", "prediction", "probability", "entropy", "member_0", "member_1"], rows[0]
assert len(rows) == 201
assert sum(r[1] == r[2] for r in rows[1:]) == round(ev["ensemble_test_accuracy"] * 200)
assert all(0 < float(r[3]) <= 1 and float(r[4]) >= 0 for r in rows[1:])
PY
# keras-convnet: its recipe's defaults (adam, batch 64), BatchNorm's moving statistics in the checkpoint, its
# evaluation equal to the run's last epoch.
kr=("$bin" --data "$work/data" --devices 2 --members 2 --progress plain --model keras-convnet)
expect "keras-convnet trains" 0 "adam lr 0.001" -- "${kr[@]}" --epochs 1 --metrics-json "$work/k.json" \
  --save "$work/k.safetensors"
grep -q "Non-trainable params: 136" "$work/out" && pass "keras-convnet summary" || fail "keras-convnet summary"
expect "keras-convnet evaluates" 0 "ensemble" -- "${ev[@]}" --evaluate "$work/k.safetensors" --metrics-json "$work/ke.json"
python3 - "$work/k.json" "$work/ke.json" "$work/k.safetensors" <<'PY' && pass "keras-convnet: recipe, state, evaluation" || fail "keras-convnet: recipe, state, evaluation"
import json, struct, sys
t, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert t["config"]["model"] == "keras-convnet" and t["config"]["optimizer"] == "adam", t["config"]
assert t["config"]["batch_size"] == 64
assert e["evaluation"]["member_test_accuracy"] == t["final"]["member_test_accuracy"]
assert e["evaluation"]["ensemble_test_nll"] == t["final"]["ensemble_test_nll"]
with open(sys.argv[3], "rb") as f:
    n, = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
assert header["state/BatchNorm_0/moving_variance"]["shape"] == [2, 12], header.get("state/BatchNorm_0/moving_variance")
PY
expect "resume keras-convnet as flax-cnn" 1 "architecture|model" -- "${run[@]}" --epochs 2 --resume "$work/k.safetensors"
expect "evaluate a subset" 0 "ensemble" -- "${ev[@]}" --devices 1 --evaluate "$work/ck2.safetensors" --members-subset 1 \
  --predict "$work/sub.csv" --metrics-json "$work/sub.json"
# The subset's member keeps its own index (1) in the table and the predictions, and its run's accuracy.
grep -qE "^ +1 +0 +[0-9.]+ %" "$work/out" && grep -q "(member 1)" "$work/out" && \
  head -n 1 "$work/sub.csv" | grep -qx "index,label,prediction,probability,entropy,member_1" && \
  python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['final']; e=json.load(open(sys.argv[2])); \
assert e['members_subset'] == [1] and e['evaluation']['member_test_accuracy'] == [t['member_test_accuracy'][1]]" \
  "$work/m.json" "$work/sub.json" && pass "a subset keeps its members' indices" || fail "a subset keeps its members' indices"
expect "subset out of range" 1 "--members-subset: member 5 is not among the checkpoint's 2 members" -- \
  "${ev[@]}" --devices 1 --evaluate "$work/ck2.safetensors" --members-subset 0,5
expect "subset not a multiple of the devices" 1 "--members 1 is not a multiple of --devices 2" -- \
  "${ev[@]}" --evaluate "$work/ck2.safetensors" --members-subset 1
# Without --devices, a device count that divides the members: one member on the two default devices runs
# on one, with the --devices 1 evaluation's numbers.
expect "evaluate one member without --devices" 0 "evaluating on 1 of the 2 devices" -- env PMAPCC_CPU_DEVICES=2 "$bin" --data "$work/data" \
  --progress plain --evaluate "$work/ck2.safetensors" --members-subset 1 --metrics-json "$work/sub_auto.json"
python3 -c "import json,sys; a=json.load(open(sys.argv[1]))['evaluation']; b=json.load(open(sys.argv[2]))['evaluation']; \
assert a['member_test_accuracy'] == b['member_test_accuracy'] and a['ensemble_test_nll'] == b['ensemble_test_nll']" \
  "$work/sub.json" "$work/sub_auto.json" && pass "without --devices: the same numbers" || fail "without --devices: the same numbers"
expect "subset without evaluate" 2 "--members-subset picks members of the checkpoint given with --evaluate" -- \
  "$bin" --members-subset 0
expect "subset twice" 2 "--members-subset: member 1 is named twice" -- "$bin" --evaluate x --members-subset 1,1
expect "evaluate takes no save" 2 "--evaluate trains nothing" -- "$bin" --evaluate x --save y
expect "evaluate a missing checkpoint" 1 "error: .*nope.safetensors" -- "${ev[@]}" --evaluate "$work/nope.safetensors"
expect "evaluate a non-checkpoint" 1 "error: .*m.json" -- "${ev[@]}" --evaluate "$work/m.json"
# --dataset names the data and picks its directory (data/fashion-mnist, relative to where it runs).
(cd "$work" && "$bin" --dataset fashion-mnist --epochs 1 >"$work/out" 2>"$work/err"); rc=$?
[ $rc -eq 1 ] && grep -q "data/fashion-mnist/train-images-idx3-ubyte" "$work/err" && pass "--dataset picks data/fashion-mnist" \
  || fail "--dataset picks data/fashion-mnist: exit $rc ($(head -c 200 "$work/err"))"
expect "fashion title" 0 "Fashion-MNIST" -- "${run[@]}" --dataset fashion-mnist --epochs 1 --train-limit 128 \
  --test-limit 100 --plot "$work/f.svg"
grep -q "Fashion-MNIST ensemble" "$work/f.svg" && pass "fashion plot title" || fail "fashion plot title"
expect "bad dataset" 2 "--dataset: 'cifar' is not mnist or fashion-mnist" -- "$bin" --dataset cifar
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

# Data parallelism with a batch the devices do not divide: 64 on 3 devices (blocks of 22, 21 and 21) trains
# as one device does, to rounding; a batch smaller than the devices is refused.
dp=("$bin" --data "$work/data" --mode data-parallel --batch-size 64 --epochs 1 --progress plain)
expect "data parallel, 64 on 3 devices" 0 "ensemble" -- "${dp[@]}" --devices 3 --metrics-json "$work/dp3.json"
expect "data parallel, 64 on 1 device" 0 "ensemble" -- "${dp[@]}" --devices 1 --metrics-json "$work/dp1.json"
python3 - "$work/dp3.json" "$work/dp1.json" <<'PY' && pass "data parallel: 3 uneven blocks train as 1 device" \
  || fail "data parallel: 3 uneven blocks train as 1 device"
import json, sys
three, one = (json.load(open(p))["epochs"][-1] for p in sys.argv[1:])
for k in ("train_loss", "test_loss"):
    assert abs(three[k] - one[k]) <= 1e-5 * abs(one[k]), (k, three[k], one[k])
assert three["train_accuracy"] == one["train_accuracy"], (three["train_accuracy"], one["train_accuracy"])
PY
expect "data parallel, batch below the devices" 1 \
  "--batch-size 2 is smaller than --devices 3: data parallel gives every device at least one example" -- \
  "$bin" --data "$work/data" --mode data-parallel --batch-size 2 --devices 3 --epochs 1

# Model parallelism: one model, its dense weights split over 'model' (the header and the metrics say how),
# checkpoints of whole tensors that reshard onto another mesh shape bit for bit, an evaluation on the
# training's split that gives its numbers, and the errors that name the flag or the weight.
mp=("$bin" --data "$work/data" --mode model-parallel --batch-size 64 --progress plain)
dense_split="Dense_0/kernel \\(None, 'model'\\), Dense_0/bias \\('model',\\), Dense_1/kernel \\('model', None\\)"
expect "model parallel 1x2" 0 "weights split over 'model': $dense_split; the rest replicated: 421642 of 824458" -- \
  "${mp[@]}" --mesh 1x2 --epochs 1 --save "$work/mp1.safetensors" --metrics-json "$work/mp.json" \
  --plot "$work/mp.svg" --predict "$work/mp.csv"
grep -q "Mesh(data=1, model=2" "$work/out" && pass "model parallel: the header names the mesh" \
  || fail "model parallel: the header names the mesh"
grep -q "</svg>" "$work/mp.svg" && [ "$(wc -l <"$work/mp.csv")" = 201 ] && pass "model parallel: plot and predictions" \
  || fail "model parallel: plot and predictions"
python3 - "$work/mp.json" <<'PY' && pass "model parallel: mesh and layout in the metrics" || fail "model parallel: mesh and layout in the metrics"
import json, sys
c = json.load(open(sys.argv[1]))["config"]
assert c["mode"] == "model-parallel" and c["mesh"] == "1x2" and c["members"] == 1, c
assert c["layout"][0] == {"pattern": "Dense_0/kernel", "spec": "(None, 'model')"}, c["layout"]
PY
expect "model parallel: reshard 1x2 onto 2x1" 0 "resumed after epoch 1" -- "${mp[@]}" --mesh 2x1 --epochs 1 \
  --resume "$work/mp1.safetensors" --save "$work/mp1b.safetensors"
same_tensors "$work/mp1.safetensors" "$work/mp1b.safetensors" && pass "model parallel: resharded tensors are equal" \
  || fail "model parallel: resharded tensors are equal"
conv_split="Conv_0/kernel \\(None, None, None, 'model'\\), Conv_0/bias \\('model',\\), Conv_1/kernel \\(None, None, 'model', None\\)"
expect "model parallel: --layout, resumed for epoch 2" 0 "weights split over 'model': $conv_split, $dense_split" -- \
  "${mp[@]}" --mesh 1x2 --epochs 2 --resume "$work/mp1.safetensors" --layout 'Conv_0/kernel=None,None,None,model' \
  --layout Conv_0/bias=model --layout "Conv_1/kernel=(None, None, 'model', None)"
expect "model parallel: evaluate on the training's split" 0 "evaluating" -- "${ev[@]}" --mesh 1x2 \
  --evaluate "$work/mp1.safetensors" --metrics-json "$work/mpe.json"
python3 - "$work/mp.json" "$work/mpe.json" <<'PY' && pass "model parallel: the evaluation gives the run's numbers" || fail "model parallel: the evaluation gives the run's numbers"
import json, sys
t, e = json.load(open(sys.argv[1]))["final"], json.load(open(sys.argv[2]))["evaluation"]
for k in ("member_test_accuracy", "test_loss", "ensemble_test_accuracy", "ensemble_test_nll"):
    assert t[k] == e[k], (k, t[k], e[k])
PY
expect "model parallel: mesh and devices disagree" 1 "--mesh 2x2 needs 4 devices, the run has 2" -- "${mp[@]}" \
  --devices 2 --mesh 2x2 --epochs 1
expect "model parallel: a layout the layers cannot run" 1 "Dense_1/kernel" -- "${mp[@]}" --mesh 1x2 --epochs 1 \
  --layout Dense_1/kernel=None,model
expect "model parallel: a --layout rule that matches no weight" 1 \
  "layout rule 'Dense_9/kernel=.*' gives no weight of model 'flax-cnn' its layout" -- "${mp[@]}" --mesh 1x2 \
  --epochs 1 --layout 'Dense_9/kernel=None,model'
# Dense_1 whole: Dense_0's split outputs are gathered for it (one psum); an output layout that keeps them
# split cannot run.
expect "model parallel: gathered for a whole Dense_1" 0 "weights split over 'model': Dense_0/kernel \\(None, 'model'\\), Dense_0/bias \\('model',\\); the rest" \
  -- "${mp[@]}" --mesh 1x2 --epochs 1 --train-limit 128 --test-limit 100 --layout 'Dense_1/kernel=()'
expect "model parallel: an output layout that cannot be kept" 1 \
  "layout of Dense_0/output keeps its features split over P\\('model'\\), but Dense_1 \\(its kernel P\\(\\)" \
  -- "${mp[@]}" --mesh 1x2 --epochs 1 --layout 'Dense_1/kernel=()' --layout "Dense_0/output=('data', 'model')"
expect "model parallel: a weight split over 'data'" 1 "splits it over 'data', which holds other examples" -- \
  "${mp[@]}" --mesh 2x1 --epochs 1 --layout Dense_0/kernel=None,data
expect "bad mesh" 2 "--mesh: '2x' is not AxM" -- "$bin" --mesh 2x
expect "layout without a model axis" 2 "--layout splits weights over 'model'" -- "$bin" --layout Dense_0/kernel=model
# An ensemble of 2 members, each split over 2 devices: the same members as unsplit, to float reassociation.
expect "ensemble on a 1x2 (ensemble, model) mesh" 0 "Mesh\\(ensemble=1, model=2" -- "${run[@]}" --mesh 1x2 \
  --epochs 1 --metrics-json "$work/em.json"
expect "the same ensemble unsplit" 0 "ensemble" -- "${run[@]}" --epochs 1 --metrics-json "$work/eu.json"
python3 - "$work/em.json" "$work/eu.json" <<'PY' && pass "ensemble x model trains as unsplit" || fail "ensemble x model trains as unsplit"
import json, sys
a, b = (json.load(open(p))["final"] for p in sys.argv[1:])
assert abs(a["train_loss"] - b["train_loss"]) <= 1e-5 * abs(b["train_loss"]), (a["train_loss"], b["train_loss"])
assert len(a["member_test_accuracy"]) == 2
for x, y in zip(a["member_test_nll"], b["member_test_nll"]):
    assert abs(x - y) <= 1e-4 * abs(y), (x, y)
PY

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
# bf16 precision: a bad PMAPCC_BF16_PATH is refused before anything trains (on a CPU without AVX512_BF16,
# bf16 itself is).
few=(--epochs 1 --train-limit 128 --test-limit 100)
expect "bad PMAPCC_BF16_PATH" 1 "PMAPCC_BF16_PATH: unknown bf16 GEMM path 'dpbf16'|lacks AVX512_BF16" -- \
  env PMAPCC_BF16_PATH=dpbf16 "${run[@]}" "${few[@]}" --precision bf16
! grep -q "epoch" "$work/out" && pass "bad PMAPCC_BF16_PATH: nothing trained" || fail "bad PMAPCC_BF16_PATH: nothing trained"
# Helper threads for the CPU ops: a bad PMAPCC_CPU_THREADS is refused before anything trains; a good one
# trains (kernels/cpu_backend.h: the same bits as one thread, which the unit tests check).
expect "bad PMAPCC_CPU_THREADS" 1 "PMAPCC_CPU_THREADS: 'two' is not a thread count" -- \
  env PMAPCC_CPU_THREADS=two "${run[@]}" "${few[@]}"
! grep -q "epoch" "$work/out" && pass "bad PMAPCC_CPU_THREADS: nothing trained" \
  || fail "bad PMAPCC_CPU_THREADS: nothing trained"
expect "PMAPCC_CPU_THREADS=2" 0 "ensemble" -- env PMAPCC_CPU_THREADS=2 "${run[@]}" "${few[@]}"
expect "--cpu-threads 0" 2 "--cpu-threads: '0' is not a thread count \(1..64\) or auto" -- "${run[@]}" "${few[@]}" \
  --cpu-threads 0
expect "--cpu-threads many" 2 "--cpu-threads: 'many' is not a thread count" -- "${run[@]}" "${few[@]}" \
  --cpu-threads many
# The thread count changes no bit: one device on 1 and on 3 threads per device, the same metrics.
one=("$bin" --data "$work/data" --devices 1 --members 1 --batch-size 64 --progress none --epochs 1)
if "${one[@]}" --cpu-threads 1 --metrics-json "$work/t1.json" >/dev/null 2>&1 \
    && "${one[@]}" --cpu-threads 3 --metrics-json "$work/t3.json" >/dev/null 2>&1 \
    && python3 "$here/same_metrics.py" "$work/t1.json" "$work/t3.json"; then
  pass "--cpu-threads 1 and 3: the same metrics"
else
  fail "--cpu-threads 1 and 3: the same metrics"
fi
# The CUDA kernels run on the host (CPU devices): the same training to float reassociation (2 steps: the
# host GEMM is a plain reference loop, slow under the sanitizers).
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
# The same with the weights split over 'model' (the layers' collectives around the CUDA kernels).
expect "model parallel: cuda kernels on the host" 0 "CUDA kernels run on the host" -- "${mp[@]}" --mesh 1x2 "${few[@]}" \
  --kernels cuda-on-host --metrics-json "$work/mp_host.json"
expect "model parallel: cpu kernels" 0 "ensemble" -- "${mp[@]}" --mesh 1x2 "${few[@]}" --metrics-json "$work/mp_cpu.json"
python3 - "$work/mp_host.json" "$work/mp_cpu.json" <<'PY' && pass "model parallel: cuda-on-host trains like the CPU ops" \
  || fail "model parallel: cuda-on-host trains like the CPU ops"
import json, sys
h, c = (json.load(open(p))["final"] for p in sys.argv[1:])
assert abs(h["train_loss"] - c["train_loss"]) <= 1e-5 * abs(c["train_loss"]), (h["train_loss"], c["train_loss"])
assert abs(h["test_loss"] - c["test_loss"]) <= 1e-4 * abs(c["test_loss"])
PY
expect "cuda-on-host needs CPU devices" 1 "for CPU devices" -- "${run[@]}" "${few[@]}" --kernels cuda-on-host --backend cuda
expect "bad kernels" 2 "--kernels: 'gpu' is not native or cuda-on-host" -- "$bin" --kernels gpu
expect "bad report interval" 2 "--report-every: 0 is out of range" -- "$bin" --report-every 0
# Sizes beyond the machine: one clear line, at once (no thread storm, no std::bad_alloc, no huge log).
expect "too many devices" 2 "--devices: 100000 is out of range \\(1..4096\\)" -- "$bin" --devices 100000
expect "members beyond memory" 1 "100000 members .* need [0-9]+ GB; this machine has [0-9]+ GB of memory" -- \
  "${run[@]}" --members 100000 --devices 1 --epochs 1
expect "a report interval past the epoch" 0 "ensemble" -- "${run[@]}" "${few[@]}" --report-every 1000000000

# A validation split: epochs evaluated on it (val_ columns, "evaluated_on"), the test set once at the end
# ("final"); early stopping per member, each member's best epoch reported, and its flags' errors.
expect "validation split and early stopping" 0 "early stopping \\(patience 1, on the validation NLL\\)" -- \
  "${run[@]}" --epochs 3 --train-limit 384 --validation-split 0.25 --early-stopping-patience 1 --no-summary \
  --metrics-json "$work/v.json" --metrics-csv "$work/v.csv" --plot "$work/v.svg"
grep -q "288 train / 96 validation / 200 test images" "$work/out" && grep -q "val_loss" "$work/out" &&
  grep -q "evaluating on the 200 test images (every member at its best epoch)" "$work/out" &&
  grep -Eq "^  member 1: best epoch [1-3] \(validation NLL [0-9.]+\), (stopped after epoch [2-3]|trained every epoch)" \
    "$work/out" && pass "validation: header, epoch lines, final test evaluation, best epochs" ||
  fail "validation: header, epoch lines, final test evaluation, best epochs"
python3 - "$work/v.json" "$work/v.csv" "$work/v.svg" <<'PY' && pass "validation: metrics files" || fail "validation: metrics files"
import csv, json, sys
m = json.load(open(sys.argv[1]))
assert m["config"]["validation_split"] == 0.25 and m["config"]["early_stopping_patience"] == 1
assert all(e["evaluated_on"] == "validation" for e in m["epochs"]), m["epochs"]
final = m["final"]
assert "evaluated_on" not in final and final["epoch"] == len(m["epochs"]), final  # the test set's
assert [s["member"] for s in m["early_stopping"]] == [0, 1]
for s in m["early_stopping"]:
    e = m["epochs"][s["best_epoch"] - 1]
    assert s["best_validation_nll"] == e["member_test_nll"][s["member"]], (s, e["member_test_nll"])
header = next(csv.reader(open(sys.argv[2])))
assert "val_loss" in header and "ensemble_val_accuracy" in header and not any("test" in h for h in header), header
assert "Validation accuracy" in open(sys.argv[3]).read()
PY
# A run with early stopping resumes from its checkpoint (each member's record and best tensors load): 2 epochs
# saved and resumed for a third end as 3 straight epochs (patience 5: no member stops, and each member's best
# is its last epoch, so the end of the 2-epoch run restores nothing). That the records themselves carry over
# is tests/test_train_early_stopping.cpp's ("a run saved ...").
es=("${run[@]}" --train-limit 384 --validation-split 0.25 --early-stopping-patience 5 --no-summary)
expect "early stopping: 2 epochs saved" 0 "early stopping" -- "${es[@]}" --epochs 2 --save "$work/es2.st"
expect "early stopping: resumed for a third" 0 "resumed after epoch 2" -- "${es[@]}" --epochs 3 \
  --resume "$work/es2.st" --save "$work/es3b.st" --metrics-json "$work/es3b.json"
expect "early stopping: 3 straight" 0 "early stopping" -- "${es[@]}" --epochs 3 --save "$work/es3.st" \
  --metrics-json "$work/es3.json"
same_tensors "$work/es3.st" "$work/es3b.st" && python3 - "$work/es3.json" "$work/es3b.json" <<'PY' &&
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["early_stopping"] == b["early_stopping"], (a["early_stopping"], b["early_stopping"])
assert [s["best_epoch"] for s in a["early_stopping"]] == [3, 3], a["early_stopping"]
assert [e["member_test_nll"] for e in a["epochs"]] == [e["member_test_nll"] for e in b["epochs"]]
PY
  pass "early stopping resumes exactly (tensors, records, history)" || fail "early stopping resumes exactly"
expect "patience needs a validation split" 2 "--early-stopping-patience watches the validation NLL" -- \
  "$bin" --early-stopping-patience 2
expect "validation split out of range" 2 "--validation-split: must be in \\[0, 1\\), got 1.5" -- "$bin" --validation-split 1.5
expect "evaluate takes no validation split" 2 "--evaluate trains nothing: --validation-split is a training flag" -- \
  "$bin" --evaluate x --validation-split 0.1
expect "validation split leaves too few" 1 "larger than the 39 training examples \\(see --train-limit and --validation-split\\)" \
  -- "${run[@]}" --epochs 1 --train-limit 384 --validation-split 0.9
expect "validation split holds out nothing" 1 "--validation-split 0.001 of 384 training examples leaves no validation example" \
  -- "${run[@]}" --epochs 1 --train-limit 384 --validation-split 0.001

head -c 1000 "$work/ck1.safetensors" >"$work/trunc.safetensors"
expect "truncated checkpoint" 1 "error: .*trunc.safetensors" -- "${run[@]}" --epochs 2 --resume "$work/trunc.safetensors"
expect "checkpoint seed mismatch" 1 "seed" -- "${run[@]}" --epochs 2 --seed 5 --resume "$work/ck1.safetensors"
printf 'garbage' >"$work/data/t10k-labels-idx1-ubyte"
expect "corrupt data" 1 "error: .*t10k-labels-idx1-ubyte" -- "${run[@]}" --epochs 1

echo "cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
