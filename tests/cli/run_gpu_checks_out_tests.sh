#!/usr/bin/env bash
# scripts/gpu_checks.sh's $OUT and --budget, without a GPU (preflight only, which fails for want of a GPU;
# no stage here builds or writes under bench/): the logs and stage results land in $OUT/gpu_checks/, a stage
# the budget cannot hold is not started but recorded, and a budget that is not a number is refused (exit 2).
# usage: run_gpu_checks_out_tests.sh REPO
set -uo pipefail
repo=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

OUT="$work/out1" bash "$repo/scripts/gpu_checks.sh" --build "$work/b1" --budget 120 preflight >"$work/log1" 2>&1
status=$?
out1="$work/out1/gpu_checks"
check "preflight within the budget runs (it fails without a GPU)" \
  "[[ $status -le 1 ]] && grep -q '== \\[preflight\\] (limit 105 s' $work/log1"
check "its log is in \$OUT" "[[ -s $out1/preflight.log ]] && grep -q cmake $out1/preflight.log"
check "its result is in \$OUT" "grep -q '\"stage\": \"preflight\", \"exit\": [01]' $out1/stages.jsonl"

OUT="$work/out2" bash "$repo/scripts/gpu_checks.sh" --build "$work/b2" --budget 40 preflight >"$work/log2" 2>&1
check "a stage the budget cannot hold fails the run" "[[ $? -eq 1 ]]"
check "  ...says so" "grep -Eq 'not started: 2[0-5] s of --budget 40 left' $work/log2"  # (25 s less the seconds it took to get there)
check "  ...and is recorded in \$OUT" \
  "grep -q '\"exit\": 125.*\"skipped\": \"budget\"' $work/out2/gpu_checks/stages.jsonl"

bash "$repo/scripts/gpu_checks.sh" --build "$work/b3" --budget soon preflight >"$work/log3" 2>&1
check "--budget soon is refused" "[[ $? -eq 2 ]] && grep -q \"budget 'soon' is not a number of seconds\" $work/log3"
[[ -e "$work/b3" ]] && { echo "FAIL   ...before anything is made"; fails=$((fails + 1)); }

echo "gpu_checks OUT/budget: $fails failed"
[[ $fails -eq 0 ]]
