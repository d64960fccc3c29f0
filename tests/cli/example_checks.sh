# What the training examples' CLI tests share (sourced): a temporary directory removed on exit, named
# assertions counted in $fails, and the checks on a metrics file every example writes.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check NAME COMMAND...: a named assertion
  local name=$1
  shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
# final FILE KEY: the final metrics' KEY
final() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['final'][sys.argv[2]])" "$1" "$2"; }
# same_runs A B: two metrics files agree bit for bit, timings aside
same_runs() {
  python3 -c "
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for d in (a, b):
    for e in d['epochs'] + [d['final']]:
        e.pop('seconds'); e.pop('model_images_per_second')
sys.exit(a != b)" "$1" "$2"
}
# has_final_keys FILE: the final metrics hold the program's keys
has_final_keys() {
  python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))['final']
sys.exit(not all(k in f for k in ('train_loss', 'member_test_accuracy', 'ensemble_test_accuracy', 'model_images_per_second')))
" "$1"
}
