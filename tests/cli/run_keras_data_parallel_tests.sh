#!/usr/bin/env bash
# The keras_data_parallel example (the Keras multi-GPU guide's custom loop in C++) end to end on a small
# synthetic IDX dataset: it trains the model mnist_ensemble --model keras-convnet --mode data-parallel trains
# from the same seed (the same losses to a relative TOL, the same test accuracies) on 1 and 2 devices; 2
# devices equal 1 up to reassociation; a run repeats bit for bit; two models side by side report their
# ensemble; bad flags and a missing data directory are refused with a clear message.
#   run_keras_data_parallel_tests.sh PATH/TO/keras_data_parallel PATH/TO/mnist_ensemble
set -u
keras=$1
program=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/example_checks.sh"
python3 "$here/make_idx.py" "$tmp/data" 640 300 0.1 || exit 1
common=(--data "$tmp/data" --epochs 2 --seed 5)

# close.py A B TOL [accuracy]: the final losses agree to TOL relative (and the accuracies exactly)
cat >"$tmp/close.py" <<'PY'
import json, sys
a, b = (json.load(open(p))["final"] for p in sys.argv[1:3])
tol = float(sys.argv[3])
ok = abs(a["train_loss"] - b["train_loss"]) <= tol * abs(b["train_loss"])
if len(sys.argv) > 4:
    ok = ok and a["member_test_accuracy"] == b["member_test_accuracy"]
    ok = ok and a["ensemble_test_accuracy"] == b["ensemble_test_accuracy"]
if not ok:
    for name, d in (("a", a), ("b", b)):
        print(name, {k: d[k] for k in ("train_loss", "member_test_accuracy", "ensemble_test_accuracy")})
sys.exit(0 if ok else 1)
PY

for devices in 1 2; do
  "$keras" "${common[@]}" --devices "$devices" --metrics-json "$tmp/keras-$devices.json" >"$tmp/keras-$devices.out" 2>&1
  check "one model on $devices device(s) trains" test $? -eq 0
  "$program" "${common[@]}" --model keras-convnet --mode data-parallel --devices "$devices" \
    --metrics-json "$tmp/prog-$devices.json" >"$tmp/prog-$devices.out" 2>&1
  check "... mnist_ensemble --model keras-convnet --mode data-parallel runs" test $? -eq 0
  check "... and trains the same model (loss to 1e-5, the same accuracies)" \
    python3 "$tmp/close.py" "$tmp/keras-$devices.json" "$tmp/prog-$devices.json" 1e-5 accuracy
  check "... its jitted step traced once per device, replayed, nothing allocated inside but the results" \
    grep -qE "^jit train_step: $devices trace\(s\), [1-9][0-9]* replays \(0 left the plan\).* allocated 0 arrays besides" \
      "$tmp/keras-$devices.out"
done
check "2 devices train what 1 does (loss to 1e-4: the global batch's sums reassociate)" \
  python3 "$tmp/close.py" "$tmp/keras-2.json" "$tmp/keras-1.json" 1e-4
"$keras" "${common[@]}" --devices 2 --metrics-json "$tmp/again.json" >/dev/null 2>&1
check "a run repeats bit for bit (timings aside)" same_runs "$tmp/keras-2.json" "$tmp/again.json"
"$keras" --data "$tmp/data" --seed 5 --epochs 1 --devices 2 --members 2 --metrics-json "$tmp/two.json" >"$tmp/two.out" 2>&1
check "two models side by side train" test $? -eq 0
check "... and report two members, the ensemble and the program's final keys" python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))['final']
ok = all(k in f for k in ('train_loss', 'member_test_accuracy', 'ensemble_test_accuracy', 'model_images_per_second'))
sys.exit(not (ok and len(f['member_test_accuracy']) == 2 and 0 <= f['ensemble_test_accuracy'] <= 1))
" "$tmp/two.json"

"$keras" "${common[@]}" --devices 3 >"$tmp/bad" 2>&1
check "a batch that does not split over the devices exits 2" test $? -eq 2
check "... naming both flags" grep -q -- "--batch 64 does not split over 3 devices" "$tmp/bad"
"$keras" --data "$tmp/nowhere" --devices 1 >"$tmp/missing" 2>&1
check "a missing data directory exits 1" test $? -eq 1
check "... naming the file it looked for" grep -q "nowhere" "$tmp/missing"
"$keras" --data "$tmp/data" --lr -1 >"$tmp/neg" 2>&1
check "a negative --lr exits 2" test $? -eq 2
[ $fails -eq 0 ] || { echo "$fails failed"; cat "$tmp/keras-1.out" "$tmp/prog-1.out"; exit 1; }
echo "all passed"
