#!/usr/bin/env bash
# The flax_ensemble example (Flax's ensembling how-to in C++) end to end on a small synthetic IDX dataset:
# it trains the models mnist_ensemble --model flax-cnn trains from the same seed (the same losses to 1e-5
# relative, the same member and ensemble test accuracies), for one member per device and for two; a run
# repeats bit for bit; --precision bf16 trains mnist_ensemble --precision bf16's models; --cpu-threads keeps the
# bits; bad flags (exit 2) and a missing data directory (exit 1) are refused with a clear message.
#   run_flax_ensemble_tests.sh PATH/TO/flax_ensemble PATH/TO/mnist_ensemble
set -u
flax=$1
program=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/example_checks.sh"
python3 "$here/make_idx.py" "$tmp/data" 640 300 0.1 || exit 1
common=(--data "$tmp/data" --epochs 2 --seed 3)

# same.py A B: the final metrics agree (loss to 1e-5 relative; accuracies exactly)
cat >"$tmp/same.py" <<'PY'
import json, sys
a, b = (json.load(open(p))["final"] for p in sys.argv[1:3])
ok = abs(a["train_loss"] - b["train_loss"]) <= 1e-5 * abs(b["train_loss"])
ok = ok and a["member_test_accuracy"] == b["member_test_accuracy"]
ok = ok and a["ensemble_test_accuracy"] == b["ensemble_test_accuracy"]
if not ok:
    print("flax_ensemble:", {k: a[k] for k in ("train_loss", "member_test_accuracy", "ensemble_test_accuracy")})
    print("mnist_ensemble:", {k: b[k] for k in ("train_loss", "member_test_accuracy", "ensemble_test_accuracy")})
sys.exit(0 if ok else 1)
PY

for shape in "2 2" "4 2"; do
  set -- $shape
  "$flax" "${common[@]}" --members "$1" --devices "$2" --metrics-json "$tmp/flax-$1.json" >"$tmp/flax-$1.out" 2>&1
  check "$1 members on $2 devices train" test $? -eq 0
  "$program" "${common[@]}" --model flax-cnn --members "$1" --devices "$2" --metrics-json "$tmp/prog-$1.json" \
    >"$tmp/prog-$1.out" 2>&1
  check "... mnist_ensemble --model flax-cnn runs" test $? -eq 0
  check "... and trains the same models (loss to 1e-5, the same accuracies)" \
    python3 "$tmp/same.py" "$tmp/flax-$1.json" "$tmp/prog-$1.json"
  check "... its jitted steps traced once per device and replayed, nothing allocated inside but the results" \
    test "$(grep -cE "^jit (apply|update)_model: $2 trace\(s\), [0-9]+ replays \(0 left the plan\).* allocated 0 arrays besides" \
            "$tmp/flax-$1.out")" -eq $((2 * 2))
done

# --precision bf16: the products' operands rounded to bf16 (ops::DefaultPrecision), as mnist_ensemble's
# --precision bf16 rounds them: the same models again. Only where this CPU runs bf16 products.
precisions=fp32
"$program" "${common[@]}" --model flax-cnn --members 2 --devices 2 --precision bf16 --metrics-json "$tmp/prog-bf16.json" \
  >"$tmp/prog-bf16.out" 2>&1
if [ $? -eq 0 ]; then
  precisions=fp32,bf16
  "$flax" "${common[@]}" --members 2 --devices 2 --precision bf16 --metrics-json "$tmp/flax-bf16.json" \
    >"$tmp/flax-bf16.out" 2>&1
  check "--precision bf16 trains" test $? -eq 0
  check "... the models mnist_ensemble --precision bf16 trains" python3 "$tmp/same.py" "$tmp/flax-bf16.json" "$tmp/prog-bf16.json"
  check "... not the fp32 ones" test "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["final"]["train_loss"] == json.load(open(sys.argv[2]))["final"]["train_loss"])' "$tmp/flax-bf16.json" "$tmp/flax-2.json")" = False
else
  echo "skipped: --precision bf16 (mnist_ensemble refuses it on this CPU: $(tail -1 "$tmp/prog-bf16.out"))"
fi
"$flax" "${common[@]}" --precision fp16 >"$tmp/badprec" 2>&1
check "a bad --precision exits 2" test $? -eq 2
check "... naming the flag" grep -q -- "--precision" "$tmp/badprec"
# --cpu-threads: the products split over helper threads give the same bits.
"$flax" --data "$tmp/data" --epochs 1 --seed 3 --members 2 --devices 1 --cpu-threads 1 --metrics-json "$tmp/t1.json" >/dev/null 2>&1
"$flax" --data "$tmp/data" --epochs 1 --seed 3 --members 2 --devices 1 --cpu-threads 3 --metrics-json "$tmp/t3.json" >/dev/null 2>&1
check "--cpu-threads 1 and 3 train the same bits" same_runs "$tmp/t1.json" "$tmp/t3.json"

# The paired benchmark (bench/run_flax_bench.py) on this data, one round: the table (the whole epoch and after
# the warm-up) and the count of allocations inside a replayed step; bad --configs, --precisions and
# --warmup-limit values are refused.
build=$(cd "$(dirname "$flax")/.." && pwd)
python3 "$here/../../bench/run_flax_bench.py" --build "$build" --data "$tmp/data" --rounds 1 --configs 2x2 \
  --precisions "$precisions" --train-limit 640 --warmup-limit 384 >"$tmp/bench.out" 2>&1
check "the paired benchmark runs" test $? -eq 0
check "... and gives the rates after the warm-up" grep -q "after warm-up" "$tmp/bench.out"
check "... and counts no allocation inside a replayed step" grep -q "besides its results: 0 (target 0: met)" "$tmp/bench.out"
python3 "$here/../../bench/run_flax_bench.py" --build "$build" --data "$tmp/data" --configs 3x2 >"$tmp/bench-bad" 2>&1
check "... a --configs entry whose members are not a multiple of the devices exits 1" test $? -eq 1
check "... naming it" grep -q "configs entry '3x2'" "$tmp/bench-bad"
python3 "$here/../../bench/run_flax_bench.py" --build "$build" --data "$tmp/data" --precisions fp16 >"$tmp/bench-bad" 2>&1
check "... so is a --precisions entry that is not fp32 or bf16 (exit 1)" test $? -eq 1
check "... naming it" grep -q "precisions entry 'fp16'" "$tmp/bench-bad"
python3 "$here/../../bench/run_flax_bench.py" --build "$build" --data "$tmp/data" --train-limit 512 \
  --warmup-limit 512 >"$tmp/bench-bad" 2>&1
check "... so is a --warmup-limit not below --train-limit (exit 1)" test $? -eq 1
check "... naming it" grep -q "warmup-limit 512 must be" "$tmp/bench-bad"
python3 "$here/../../bench/run_flax_bench.py" --build "$build" --data "$tmp/data" --warmup-limit 256 >"$tmp/bench-bad" 2>&1
check "... and one of fewer than 3 batches (exit 1)" test $? -eq 1

# params.py A B: every parameter of the two safetensors files ("params/..." tensors, members stacked) agrees to
# 1e-5 of its tensor's largest magnitude, and both hold the same tensors; prints the largest difference.
cat >"$tmp/params.py" <<'PY'
import array, json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if not name.startswith("params/"):
            continue
        lo, hi = t["data_offsets"]
        values = array.array("f")
        values.frombytes(raw[8 + n + lo:8 + n + hi])
        out[name] = (t["shape"], values)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
ok = sorted(a) == sorted(b) and len(a) > 0
worst = 0.0
for name in sorted(set(a) & set(b)):
    (sa, va), (sb, vb) = a[name], b[name]
    if sa != sb:
        print(name, "shapes", sa, sb); ok = False; continue
    scale = max((abs(x) for x in vb), default=0.0) or 1.0
    for x, y in zip(va, vb):
        d = abs(x - y) / scale
        worst = float("inf") if d != d else max(worst, d)  # NaN counts as the worst
print("largest parameter difference (relative to each tensor's largest value): %.2e over %d tensors" % (worst, len(a)))
sys.exit(0 if ok and worst <= 1e-5 else 1)
PY
# 20 steps (640 images, batch 128, 4 epochs), then the parameters of both programs compared.
twenty=(--data "$tmp/data" --epochs 4 --seed 3 --members 4 --devices 2)
"$flax" "${twenty[@]}" --save "$tmp/flax.safetensors" >"$tmp/flax-save.out" 2>&1
check "--save writes the parameters" test -s "$tmp/flax.safetensors"
"$program" "${twenty[@]}" --model flax-cnn --save "$tmp/prog.safetensors" >"$tmp/prog-save.out" 2>&1
check "... and after 20 steps they are mnist_ensemble's to 1e-5" \
  python3 "$tmp/params.py" "$tmp/flax.safetensors" "$tmp/prog.safetensors"
"$flax" "${twenty[@]}" --save "$tmp/no/such/dir/x.safetensors" >"$tmp/nosave" 2>&1
check "an unwritable --save exits 1" test $? -eq 1
check "... naming the path" grep -q "no/such/dir" "$tmp/nosave"

"$flax" "${common[@]}" --members 4 --devices 2 --metrics-json "$tmp/again.json" >/dev/null 2>&1
check "a run repeats bit for bit (timings aside)" same_runs "$tmp/flax-4.json" "$tmp/again.json"
check "the final metrics hold the program's keys" has_final_keys "$tmp/flax-4.json"

"$flax" "${common[@]}" --members 3 --devices 2 >"$tmp/bad" 2>&1
check "members not a multiple of the devices exits 2" test $? -eq 2
check "... naming both flags" grep -q -- "--members 3 is not a multiple of --devices 2" "$tmp/bad"
"$flax" --data "$tmp/nowhere" --devices 1 >"$tmp/missing" 2>&1
check "a missing data directory exits 1" test $? -eq 1
check "... naming the file it looked for" grep -q "nowhere" "$tmp/missing"
"$flax" --data "$tmp/data" --epochs -1 >"$tmp/neg" 2>&1
check "a negative --epochs exits 2" test $? -eq 2
[ $fails -eq 0 ] || { echo "$fails failed"; cat "$tmp/flax-2.out" "$tmp/prog-2.out"; exit 1; }
echo "all passed"
