#!/usr/bin/env bash
# scripts/fuzz.sh refuses bad arguments before it builds or runs anything: exit 2 and a last line that
# names what is wrong. usage: check_fuzz_args.sh /path/to/scripts/fuzz.sh
set -u
script=$1
fails=0
expect() {  # expect PATTERN ARGS...
  local pattern=$1
  shift
  local err rc
  err=$(bash "$script" "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -ne 2 ]] || ! tail -n 1 <<<"$err" | grep -Eq "$pattern"; then
    echo "FAIL fuzz.sh $*: exit $rc, last line: $(tail -n 1 <<<"$err")"
    fails=$((fails + 1))
  else
    echo "ok   fuzz.sh $*: $(tail -n 1 <<<"$err")"
  fi
}
expect "^fuzz.sh: error: --seconds needs a positive whole number of seconds$" --seconds 0
expect "^fuzz.sh: error: --seconds needs a positive whole number of seconds$" --seconds 1.5
expect "^fuzz.sh: error: --seconds needs a positive whole number of seconds$" --seconds
expect "^fuzz.sh: error: --jobs needs a positive whole number$" --jobs 0
expect "^fuzz.sh: error: --jobs needs a positive whole number$" --jobs two
expect "^fuzz.sh: error: --jobs needs a positive whole number$" --jobs
expect "^fuzz.sh: error: no fuzz target 'fuzz_nothing' \(targets: fuzz_idx .*\)$" fuzz_nothing
expect "^fuzz.sh: error: unknown option '--fast'$" --fast
exit $((fails > 0))
