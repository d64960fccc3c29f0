#!/usr/bin/env bash
# The resnet_ensemble example (residual networks trained with grad inside pmap) end to end on a small
# synthetic IDX dataset: it learns (the ensemble beats chance by far), 4 members on 2 devices run, a run
# repeats bit for bit, and bad flags are refused with a clear message.
#   run_resnet_ensemble_tests.sh PATH/TO/resnet_ensemble
set -u
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/example_checks.sh"
python3 "$here/make_idx.py" "$tmp/data" 1280 300 0.05 || exit 1
common=(--data "$tmp/data" --seed 5 --batch 64)

"$bin" "${common[@]}" --epochs 3 --members 2 --devices 2 --metrics-json "$tmp/a.json" >"$tmp/a.out" 2>&1
check "2 members on 2 devices train" test $? -eq 0
check "... and learn (ensemble test accuracy above 0.5; chance is 0.1)" \
  awk -v a="$(final "$tmp/a.json" ensemble_test_accuracy)" 'BEGIN { exit !(a > 0.5) }'
"$bin" "${common[@]}" --epochs 3 --members 2 --devices 2 --metrics-json "$tmp/b.json" >/dev/null 2>&1
check "a run repeats bit for bit (timings aside)" same_runs "$tmp/a.json" "$tmp/b.json"
"$bin" "${common[@]}" --members 4 --devices 2 --epochs 1 --metrics-json "$tmp/c.json" >"$tmp/c.out" 2>&1
check "4 members on 2 devices run" test $? -eq 0
check "... reporting 4 members" test "$(python3 -c "import json, sys; print(len(json.load(open(sys.argv[1]))['final']['member_test_accuracy']))" "$tmp/c.json")" = 4
"$bin" "${common[@]}" --members 3 --devices 2 >"$tmp/bad" 2>&1
check "members not a multiple of the devices exits 2" test $? -eq 2
check "... naming both flags" grep -q -- "--members 3 is not a multiple of --devices 2" "$tmp/bad"
"$bin" --data "$tmp/nowhere" --devices 1 >"$tmp/missing" 2>&1
check "a missing data directory exits 1 naming it" grep -q "nowhere" "$tmp/missing"
[ $fails -eq 0 ] || { echo "$fails failed"; cat "$tmp/a.out"; exit 1; }
echo "all passed"
