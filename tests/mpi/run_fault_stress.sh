#!/usr/bin/env bash
# Randomized collective faults over processes: runs `PROGRAM fault-stress SEED` under mpirun with NP
# processes for consecutive seeds until SECONDS have passed (at least 3 jobs), and checks that every
# job ended within its limit with a "VERDICT rank R: ok" from every process (files in a scratch directory:
# after a fault MPI is left unfinalized on purpose, the processes being out of step, so mpirun's exit
# status is not the verdict and it may cut a process's output short).
# PMAPCC_STRESS_SEED sets the first seed (default: random; printed, with the seed of any failing job).
# With SEED, every job replays that one seed (a regression case: a race is tried several times).
# Usage: run_fault_stress.sh MPIEXEC NP PROGRAM SECONDS [SEED]
set -u
mpiexec=$1 np=$2 program=$3 budget=$4 fixed=${5:-}
flags=()
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$mpiexec" --version 2>&1 | grep -Eq "Open MPI|OpenRTE" && flags+=(--oversubscribe --quiet)
first=${fixed:-${PMAPCC_STRESS_SEED:-$(( (RANDOM << 15 | RANDOM) ))}}
echo "run_fault_stress: $np processes, first seed $first (PMAPCC_STRESS_SEED=$first replays this run), ${budget} s"
out=$(mktemp)
dir=$(mktemp -d)
trap 'rm -rf "$out" "$dir"' EXIT
declare -A kinds=()
jobs=0 seed=$first start=$SECONDS
while [ $((SECONDS - start)) -lt "$budget" ] || [ $jobs -lt 3 ]; do
  # A job takes under 12 s by its own check; 60 s means it hung.
  rm -f "$dir"/verdict.*
  PMAPCC_STRESS_DIR=$dir timeout 60 "$mpiexec" "${flags[@]}" -np "$np" "$program" fault-stress "$seed" >"$out" 2>&1
  rc=$?
  ok=$(cat "$dir"/verdict.* 2>/dev/null | grep -c '^VERDICT rank [0-9]*: ok')
  kind=$(sed -n 's/^FAULT_STRESS rank [0-9]* seed .*; fault: //p' "$out" | head -1 | sed 's/ on cpu:.*//')
  if [ $rc -eq 124 ] || [ "$ok" -ne "$np" ]; then
    cat "$out"
    [ $rc -eq 124 ] && echo "run_fault_stress FAILED: the job with seed $seed hung (killed after 60 s)"
    echo "run_fault_stress FAILED: seed $seed: $ok of $np processes reported ok (mpirun status $rc)"
    echo "replay: $mpiexec ${flags[*]} -np $np $program fault-stress $seed"
    exit 1
  fi
  kinds[$kind]=$((${kinds[$kind]:-0} + 1))
  jobs=$((jobs + 1))
  [ -z "$fixed" ] && seed=$((seed + 1))
done
summary=""
for k in "${!kinds[@]}"; do summary+="$k ${kinds[$k]}, "; done
seeds="seeds $first..$((seed - 1))"
[ -n "$fixed" ] && seeds="seed $fixed each time"
echo "run_fault_stress: $jobs jobs of $np processes passed in $((SECONDS - start)) s ($seeds): ${summary%, }"
