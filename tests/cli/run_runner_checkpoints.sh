#!/usr/bin/env bash
# Checkpoints the runner wrote (releases before train::Trainer, tests/data/runner/README.md) in today's
# program: --evaluate gives the runner's first-epoch evaluation, --resume the runner's second epoch. Losses
# within 1e-5 (the Trainer sums a test NLL in another order; another CPU's kernels round differently),
# accuracies within one test example of the 100.
# usage: run_runner_checkpoints.sh /path/to/mnist_ensemble
set -uo pipefail
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
fixtures="$here/../data/runner"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

# compare NAME GOT EXPECTED [EPOCH]: the metrics JSON GOT's epochs (or, with EPOCH, its "evaluation"
# against that epoch of EXPECTED, a runner's history) hold EXPECTED's figures.
compare() {
  if python3 - "$2" "$3" "${4:-}" <<'PY'; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
import json, math, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
pairs = [(got["evaluation"], want[int(sys.argv[3]) - 1])] if sys.argv[3] else list(zip(got["epochs"], want))
if not sys.argv[3] and len(got["epochs"]) != len(want):
    sys.exit(f"{len(got['epochs'])} epochs, the runner's history has {len(want)}")
LOSSES = {"train_loss", "test_loss", "member_test_nll", "member_test_brier", "ensemble_test_nll",
          "ensemble_test_brier"}
ACCURACIES = {"train_accuracy", "member_test_accuracy", "ensemble_test_accuracy"}
bad = []
for i, (g, w) in enumerate(pairs):
    for key in sorted((LOSSES | ACCURACIES) & set(w)):
        if sys.argv[3] and key.startswith("train"):
            continue  # an evaluation trains nothing
        a, b = g.get(key), w[key]
        a, b = (a, b) if isinstance(b, list) else ([a], [b])
        tol = 1e-5 if key in LOSSES else 0.0101
        if a is None or len(a) != len(b) or any(not math.isclose(x, y, rel_tol=0, abs_tol=tol) for x, y in zip(a, b)):
            bad.append(f"epoch {i + 1} {key}: {g.get(key)} where the runner had {w[key]}")
if bad:
    sys.exit("\n".join(bad))
PY
}

python3 "$here/make_idx.py" "$work/side4" 256 100 0.1 4
python3 "$here/make_idx.py" "$work/side12" 256 100 0.1 12
flax=("--model" flax-cnn --devices 1 --members 2 --lr 0.1,0.05 --batch-size 32 --seed 5)
keras=(--model keras-convnet --mode data-parallel --devices 2 --optimizer adam --lr 0.001 --batch-size 32 --seed 7)
for run in "flax_cnn_ensemble side4 flax" "keras_convnet_data_parallel side12 keras"; do
  read -r name data flags <<<"$run"
  declare -n args=$flags
  file="$fixtures/$name.safetensors" history="$fixtures/$name.history.json"
  if "$bin" --data "$work/$data" --evaluate "$file" --progress none --metrics-json "$work/$name.eval.json" \
       >"$work/out" 2>&1; then
    compare "$name: --evaluate gives the runner's first epoch" "$work/$name.eval.json" "$history" 1
  else
    echo "FAIL $name: --evaluate exited $?: $(tail -3 "$work/out")"; fails=$((fails + 1))
  fi
  if "$bin" --data "$work/$data" "${args[@]}" --epochs 2 --resume "$file" --progress none \
       --metrics-json "$work/$name.json" --save "$work/$name.safetensors" >"$work/out" 2>&1; then
    compare "$name: --resume trains the runner's second epoch" "$work/$name.json" "$history"
  else
    echo "FAIL $name: --resume exited $?: $(tail -3 "$work/out")"; fails=$((fails + 1))
  fi
  unset -n args
done
# What the runner recorded is checked too: another recipe is refused, naming the field.
if "$bin" --data "$work/side4" "${flax[@]}" --seed 6 --epochs 2 --resume "$fixtures/flax_cnn_ensemble.safetensors" \
     --progress none >"$work/out" 2>&1; then
  echo "FAIL another seed resumed the runner's file"; fails=$((fails + 1))
elif grep -q "flax_cnn_ensemble.safetensors: the checkpoint was written with seed = 5, this run has 6" "$work/out"; then
  echo "ok   another seed: refused, naming the field"
else
  echo "FAIL another seed: $(tail -2 "$work/out")"; fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] && echo "all runner checkpoints passed" || { echo "$fails failed"; exit 1; }
