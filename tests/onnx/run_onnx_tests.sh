#!/usr/bin/env bash
# ONNX export end to end. First the exporter's zoo (every primitive with an emitter in one network), a
# residual network and a network with nn::LayerNorm, which pmapcc_tests writes with pmapcc's logits, in ONNX Runtime (npm's onnxruntime-node,
# ort_zoo.js). Then mnist_ensemble --export-onnx after training (ensemble, data-parallel and model-parallel
# runs) and with --evaluate (--members-subset, --export-member); each file accepted by onnx.checker
# (Debian's python3-onnx) and run by ONNX Runtime (ort_check.js) on the MNIST test images: the same class as
# pmapcc's --predict for every image, probabilities within 1e-5. Then the error paths. Exits 77 (skipped)
# without MNIST (after the zoo), or without ONNX Runtime, node or python3-onnx unless PMAPCC_REQUIRE_ORT=1
# (scripts/test.sh sets it: CI must run this), which makes those a failure.
# usage: run_onnx_tests.sh /path/to/mnist_ensemble /path/to/pmapcc_tests
set -uo pipefail
bin=$(realpath "$1")
tests_bin=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mnist=${PMAPCC_MNIST:-$repo/data/mnist}
export PMAPCC_ORT_NODE=${PMAPCC_ORT_NODE:-$repo/.cache/onnxruntime-node/node_modules/onnxruntime-node}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 passes=0
pass() { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
missing() {
  if [[ "${PMAPCC_REQUIRE_ORT:-0}" == 1 ]]; then echo "FAIL $1 (PMAPCC_REQUIRE_ORT=1)"; exit 1; fi
  echo "skipped: $1"; exit 77
}

command -v node >/dev/null || missing "no node on PATH (scripts/setup.sh installs npm and node)"
[[ -d "$PMAPCC_ORT_NODE" ]] || missing "no onnxruntime-node at $PMAPCC_ORT_NODE (scripts/get_onnxruntime.sh)"
py=/usr/bin/python3  # Debian's, which has python3-onnx (a python3 earlier on PATH may not)
"$py" -c "import onnx" 2>/dev/null || missing "no python3-onnx for $py (scripts/setup.sh)"

# Every primitive's emitter (the zoo), a residual network and one with nn::LayerNorm, written by pmapcc_tests
# with pmapcc's logits.
if PMAPCC_ONNX_ZOO_DIR="$work" "$tests_bin" -tc="onnx export: the zoo*" >"$work/out" 2>&1; then
  pass "zoo, resnet and normed: pmapcc_tests writes them"
  for name in zoo resnet normed; do
    "$py" - "$work/$name.onnx" <<'PY' && pass "$name: onnx.checker accepts it" || fail "$name: onnx.checker"
import onnx, sys
onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)
PY
  done
  node "$here/ort_zoo.js" "$work" zoo resnet normed && pass "zoo, resnet and normed: ONNX Runtime = pmapcc" ||
    fail "zoo, resnet and normed: ONNX Runtime = pmapcc"
else
  fail "zoo, resnet and normed: pmapcc_tests: $(tail -c 400 "$work/out")"
fi

# The program's exports need MNIST (the zoo and the residual network above do not).
if [[ ! -f "$mnist/t10k-images-idx3-ubyte" && ! -f "$mnist/t10k-images-idx3-ubyte.gz" ]]; then
  [[ $fails -eq 0 ]] || { echo "onnx export: $passes passed, $fails failed"; exit 1; }
  echo "skipped: no MNIST in $mnist (scripts/get_data.sh); the zoo and the residual network passed"
  exit 77
fi

# run NAME CODE ARGS...: runs the program, expecting exit status CODE.
run() {
  local name=$1 code=$2; shift 2
  "$bin" --data "$mnist" --progress none "$@" >"$work/out" 2>"$work/err"; local got=$?
  if [[ $got -ne $code ]]; then fail "$name: exit $got, expected $code: $(head -c 400 "$work/err")"; return 1; fi
  if grep -qiE 'core dumped|terminate called|Segmentation' "$work/err"; then fail "$name: crashed"; return 1; fi
  pass "$name"
}
# compare NAME MODEL PREDICT_CSV: onnx.checker, then ONNX Runtime against pmapcc's predictions.
compare() {
  local name=$1 model=$2 csv=$3
  "$py" - "$model" <<'PY' && pass "$name: onnx.checker accepts it" || fail "$name: onnx.checker"
import onnx, sys
m = onnx.load(sys.argv[1])
onnx.checker.check_model(m, full_check=True)
assert m.opset_import[0].version == 17, m.opset_import
PY
  node "$here/ort_check.js" "$model" "$mnist" "$csv" && pass "$name: ONNX Runtime = pmapcc" ||
    fail "$name: ONNX Runtime = pmapcc"
  echo "     $(basename "$model"): $(stat -c %s "$model") bytes"
}

# keras-convnet (BatchNorm, Dropout, strided and TensorFlow-"same" convolutions, global average pooling):
# an ensemble of 2 trained briefly, all 10,000 test images.
k=(--model keras-convnet --devices 2 --members 2 --epochs 1 --train-limit 3000)
run "keras-convnet: train and export" 0 "${k[@]}" --save "$work/k.st" --predict "$work/k.csv" \
  --metrics-json "$work/k.json" --export-onnx "$work/k.onnx" &&
  grep -q "ONNX: the ensemble written to $work/k.onnx" "$work/out" && pass "keras-convnet: says what it wrote" ||
  fail "keras-convnet: says what it wrote"
compare "keras-convnet ensemble" "$work/k.onnx" "$work/k.csv"
"$py" - "$work/k.onnx" "$work/k.json" <<'PY' && pass "keras-convnet: metadata" || fail "keras-convnet: metadata"
import json, onnx, sys
m = onnx.load(sys.argv[1])
meta = {p.key: p.value for p in m.metadata_props}
final = json.load(open(sys.argv[2]))["final"]
assert meta["model"] == "keras-convnet" and meta["members"] == "0,1" and meta["seed"] == "0", meta
assert meta["dataset"] == "mnist" and json.loads(meta["recipe"])["optimizer"] == "adam", meta
assert abs(float(meta["test_accuracy"]) - final["ensemble_test_accuracy"]) < 1e-6, (meta, final)
assert abs(float(meta["test_nll"]) - final["ensemble_test_nll"]) < 1e-6, (meta, final)
assert [o.name for o in m.graph.output] == ["probabilities", "class"]
ops = {n.op_type for n in m.graph.node}
assert "Dropout" not in ops and {"Conv", "BatchNormalization", "AveragePool", "Mean", "ArgMax"} <= ops, ops
# Channels first from the images' transpose to the one before the Dense layers' reshape: two per member.
inits = {i.name for i in m.graph.initializer}
moves = [n for n in m.graph.node if n.op_type == "Transpose" and n.input[0] not in inits]
assert len(moves) == 4, [n.name for n in moves]
PY

# One member alone, from the checkpoint (--evaluate, --members-subset keeps its index).
run "member 1 from the checkpoint" 0 --evaluate "$work/k.st" --devices 1 --members-subset 1 --predict "$work/k1.csv" \
  --export-onnx "$work/k1.onnx" --export-member 1
compare "keras-convnet member 1" "$work/k1.onnx" "$work/k1.csv"
"$py" - "$work/k1.onnx" <<'PY' && pass "member export: logits and probabilities" || fail "member export: outputs"
import onnx, sys
m = onnx.load(sys.argv[1])
assert [o.name for o in m.graph.output] == ["logits", "probabilities"], m.graph.output
assert {p.key: p.value for p in m.metadata_props}["members"] == "1"
PY

# The Flax CNN (average pooling, Flatten in (H, W, C) order) trained model-parallel, and data-parallel:
# checkpoints and the trainer hold whole tensors, so they export as any other.
f=(--epochs 1 --train-limit 1000 --test-limit 2000 --devices 2)
run "flax-cnn model-parallel: export" 0 "${f[@]}" --mode model-parallel --mesh 1x2 --predict "$work/f.csv" \
  --export-onnx "$work/f.onnx"
compare "flax-cnn model-parallel" "$work/f.onnx" "$work/f.csv"
run "keras-convnet data-parallel: export" 0 --model keras-convnet "${f[@]}" --mode data-parallel \
  --predict "$work/d.csv" --export-onnx "$work/d.onnx"
compare "keras-convnet data-parallel" "$work/d.onnx" "$work/d.csv"

# Bad input: one line, the right status, no file left behind.
run "--export-member without --export-onnx" 2 --evaluate "$work/k.st" --export-member 0
grep -q "give --export-onnx PATH" "$work/err" && pass "  ...names the flag" || fail "  ...names the flag"
run "--export-member of a member not evaluated" 1 --evaluate "$work/k.st" --devices 1 --members-subset 0 \
  --export-onnx "$work/bad.onnx" --export-member 1
grep -q "export-member 1: no such member" "$work/err" && [[ ! -e "$work/bad.onnx" ]] &&
  [[ -z "$(ls "$work" | grep '\.tmp-')" ]] && pass "  ...and writes nothing" || fail "  ...and writes nothing"
run "--export-member past the members, before training" 1 --epochs 1 --devices 2 --members 2 --export-onnx \
  "$work/m5.onnx" --export-member 5
grep -q "export-member 5: no such member among the 2 members" "$work/err" && ! grep -q "training:" "$work/out" &&
  pass "  ...refused before the run" || fail "  ...refused before the run"
run "--export-onnx of untrained members" 2 --epochs 0 --export-onnx "$work/u.onnx"
grep -q "would export untrained members" "$work/err" && pass "  ...says why" || fail "  ...says why"
run "--export-onnx into a missing directory" 2 --epochs 1 --train-limit 64 --export-onnx "$work/none/x.onnx"
grep -q "the directory '$work/none' does not exist" "$work/err" && pass "  ...checked before training" ||
  fail "  ...checked before training"

echo "onnx export: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
