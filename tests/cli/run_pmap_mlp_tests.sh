#!/usr/bin/env bash
# The pmap_mlp example (computing inside pmap with pmapcc's ops) end to end: it learns (the final loss far
# below the targets' variance), 1 and 4 data-parallel devices train the same model (to rounding), a run is
# bitwise repeatable, a bad flag is refused, and --backend cuda either trains as the CPU does (a GPU) or
# fails with a clear message (none).
#   run_pmap_mlp_tests.sh PATH/TO/pmap_mlp
set -u
bin=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() {  # check NAME COMMAND...: a named assertion
  local name=$1
  shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
final() { awk '/^final loss/ {print $3}' "$1"; }
variance() { awk '/variance/ {print $NF}' "$1"; }

"$bin" --devices 1 >"$tmp/one" 2>&1
check "1 device runs" test $? -eq 0
"$bin" --devices 4 >"$tmp/four" 2>&1
check "4 devices run" test $? -eq 0
"$bin" --devices 4 >"$tmp/again" 2>&1
check "the same run twice prints the same bits" cmp -s "$tmp/four" "$tmp/again"
check "it learns: final loss below a quarter of the targets' variance" \
  awk -v f="$(final "$tmp/four")" -v v="$(variance "$tmp/four")" 'BEGIN { exit !(f != "" && f < v / 4) }'
check "1 and 4 devices reach the same loss (to 1e-5 relative)" \
  awk -v a="$(final "$tmp/one")" -v b="$(final "$tmp/four")" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * a) }'

"$bin" --devices 3 --batch 256 >"$tmp/bad" 2>&1
rc=$?
check "an indivisible batch exits 2" test $rc -eq 2
check "... naming both flags" grep -q -- "--batch 256 is not divisible by --devices 3" "$tmp/bad"

"$bin" --backend cuda --devices 2 >"$tmp/cuda" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  check "a GPU: --backend cuda reaches the CPU's loss (to 1e-3 relative)" \
    awk -v a="$(final "$tmp/one")" -v b="$(final "$tmp/cuda")" \
    'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 1e-3 * a) }'
elif [ "${PMAPCC_REQUIRE_GPU:-}" = 1 ]; then  # a GPU machine, or the CUDA stand-in's fake GPUs
  check "PMAPCC_REQUIRE_GPU=1: --backend cuda trains ($(tail -c 200 "$tmp/cuda"))" false
else
  check "no GPU: --backend cuda exits 1" test $rc -eq 1
  check "... saying why" grep -Eq "^pmap_mlp: .*(GPU|CUDA)" "$tmp/cuda"
fi
[ $fails -eq 0 ] || { echo "$fails failed"; cat "$tmp/four"; exit 1; }
echo "all passed"
