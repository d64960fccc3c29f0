#!/usr/bin/env bash
# Fuzzes the parsers of outside bytes with libFuzzer (tests/fuzz): builds the clang "fuzz" preset (ASan and
# UBSan on), replays every target's seed corpus and regression inputs, then fuzzes each target for a
# bounded time and prints what it did. scripts/test.sh runs it for 40 s per target; longer runs are this
# script with --seconds.
set -uo pipefail

usage() {
  cat <<'EOF2'
usage: bash scripts/fuzz.sh [--seconds N] [--jobs J] [--no-build] [TARGET...]
  Builds build/fuzz (cmake --preset fuzz; needs clang: scripts/setup.sh --fuzz), replays each target's
  corpus and regressions (ctest --preset fuzz), then runs each TARGET (default: all of fuzz_idx
  fuzz_safetensors fuzz_json fuzz_checkpoint fuzz_cli) for N seconds (default 60), J at a time (default:
  the number of CPUs, nproc; each libFuzzer run uses one core).
  Each run starts from tests/fuzz/corpus/<target> and tests/fuzz/regressions/<target> and grows its own
  corpus in build/fuzz/corpus/<target> (the committed corpora are left as they are). A crash, sanitizer
  report or broken property stops that target: its input is kept in build/fuzz/artifacts/<target>/ and the
  exit status is 1 (copy the input to tests/fuzz/regressions/<target>/ with the fix).
  Prints per target: executions, executions/s, coverage, corpus size, peak memory, and crashes.
  --jobs J    run J targets at once (a positive whole number)
  --no-build  use the binaries in build/fuzz as they are
  Example, a longer run of one target: bash scripts/fuzz.sh --seconds 3600 fuzz_safetensors
EOF2
}

all_targets=(fuzz_idx fuzz_safetensors fuzz_json fuzz_checkpoint fuzz_cli)
seconds=60 jobs=$(nproc 2>/dev/null || echo 1) build=1 targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { usage >&2; echo "fuzz.sh: error: --seconds needs a positive whole number of seconds" >&2; exit 2; }
      seconds="$2"; shift ;;
    --jobs)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { usage >&2; echo "fuzz.sh: error: --jobs needs a positive whole number" >&2; exit 2; }
      jobs="$2"; shift ;;
    --no-build) build=0 ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; echo "fuzz.sh: error: unknown option '$1'" >&2; exit 2 ;;
    *)
      [[ " ${all_targets[*]} " == *" $1 "* ]] || { usage >&2; echo "fuzz.sh: error: no fuzz target '$1' (targets: ${all_targets[*]})" >&2; exit 2; }
      targets+=("$1") ;;
  esac
  shift
done
[[ ${#targets[@]} -eq 0 ]] && targets=("${all_targets[@]}")

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root="$PWD"
bin="$root/build/fuzz/tests/fuzz"

if [[ $build -eq 1 ]]; then
  command -v clang++ >/dev/null 2>&1 || { echo "fuzz.sh: error: clang++ is not installed (bash scripts/setup.sh --fuzz)" >&2; exit 1; }
  cmake --preset fuzz >/dev/null || { echo "fuzz.sh: error: cmake --preset fuzz failed" >&2; exit 1; }
  cmake --build --preset fuzz || { echo "fuzz.sh: error: the fuzz build failed" >&2; exit 1; }
fi
for t in "${targets[@]}"; do
  [[ -x "$bin/$t" ]] || { echo "fuzz.sh: error: $bin/$t is not built (run without --no-build)" >&2; exit 1; }
done

# The seed corpora and regression inputs, once each (a known crash fails here, before any fuzzing).
ctest --preset fuzz --output-on-failure || { echo "fuzz.sh: error: replaying the corpora failed" >&2; exit 1; }

# fuzz_one TARGET: fuzzes one target; writes its summary line (and, on failure, the report's first lines) to
# build/fuzz/TARGET.result. Each libFuzzer run is one process on one core, so --jobs of them run at once.
fuzz_one() {
  local t="$1" work="$root/build/fuzz/corpus/$1" artifacts="$root/build/fuzz/artifacts/$1"
  local log="$root/build/fuzz/$1.log" result="$root/build/fuzz/$1.result" rc execs rate rss cov crashes
  mkdir -p "$work" "$artifacts"
  local seeds=("$root/tests/fuzz/corpus/$t")
  [[ -d "$root/tests/fuzz/regressions/$t" ]] && seeds+=("$root/tests/fuzz/regressions/$t")
  echo "==> fuzz.sh: $t for $seconds s (log: build/fuzz/$t.log)"
  # -timeout: an input taking over 10 s is a hang; -rss_limit_mb: a parser allocating past 2 GiB is a bug.
  "$bin/$t" "$work" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1)
  crashes=$(find "$artifacts" -type f | wc -l)
  if [[ $rc -eq 0 ]]; then
    echo "PASS  $t: ${execs:-?} execs (${rate:-?}/s), ${cov:-no coverage line}, peak ${rss:-?} MB, crashes 0" >"$result"
  else
    {
      echo "FAIL  $t (exit $rc): ${execs:-?} execs, crash inputs in build/fuzz/artifacts/$t/: $crashes"
      grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|.*property violated|.*deadly signal|.*uncaught exception|terminate called)' "$log" | head -5 | sed 's/^/      /'
    } >"$result"
  fi
}

for t in "${targets[@]}"; do
  rm -f "$root/build/fuzz/$t.result"
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n; done
  fuzz_one "$t" &
done
wait

failed=0
results=()
for t in "${targets[@]}"; do
  if [[ -f "$root/build/fuzz/$t.result" ]]; then
    mapfile -t lines <"$root/build/fuzz/$t.result"
    results+=("${lines[@]}")
    [[ ${lines[0]:-} == PASS* ]] || failed=1
  else
    failed=1
    results+=("FAIL  $t: no result (the run was killed)")
  fi
done

echo
echo "==> fuzz.sh summary ($seconds s per target)"
for line in "${results[@]}"; do echo "fuzz.sh: $line"; done
exit $failed
