#!/usr/bin/env bash
# Runs one multi-process case under mpirun and checks it: the exit status (ok: zero; fail[:N]: non-zero,
# with at least N other processes printing a DETECTED line; reported:N: N such lines, whatever mpirun
# returns, for runs where mpirun does not watch exit codes), that PATTERN (extended regex) appears in
# the output, and for failures that the job ended within MAX_SECONDS of the injected failure.
# Usage: run_case.sh MPIEXEC NP ok|fail[:N]|reported:N MAX_SECONDS PATTERN -- [MPIRUN ARGS] PROGRAM ARGS...
set -u
mpiexec=$1 np=$2 expect=$3 max_s=$4 pattern=$5
shift 5
[ "${1:-}" = "--" ] && shift
flags=()
# Open MPI refuses root without these (containers and CI often run as root); other MPIs ignore them.
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$mpiexec" --version 2>&1 | grep -Eq "Open MPI|OpenRTE" && flags+=(--oversubscribe)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s%3N)
timeout $((max_s + 120)) "$mpiexec" "${flags[@]}" -np "$np" "$@" >"$out" 2>&1
rc=$?
end=$(date +%s%3N)
cat "$out"
echo "---- run_case: mpirun exited with status $rc after $((end - start)) ms"
status=0
fail() { echo "run_case FAILED: $*"; status=1; }
case "$expect" in
  ok) [ $rc -eq 0 ] || fail "expected exit status 0" ;;
  fail*) [ $rc -ne 0 ] || fail "expected a non-zero exit status" ;;
esac
[ $rc -eq 124 ] && fail "the job hung (killed by timeout)"
grep -Eq -- "$pattern" "$out" || fail "the output does not match /$pattern/"
fail_at=$(grep -o 'FAIL_AT_MS=[0-9]*' "$out" | head -1 | cut -d= -f2)
if [ "$expect" != ok ] && [ -n "$fail_at" ]; then
  n=0
  for at in $(grep -o 'DETECTED_AT_MS=[0-9]*' "$out" | cut -d= -f2); do
    echo "---- run_case: a process reported the failure $((at - fail_at)) ms after it happened"
    n=$((n + 1))
  done
  echo "---- run_case: the job ended $((end - fail_at)) ms after the failure"
  [ $((end - fail_at)) -le $((max_s * 1000)) ] || fail "the job took longer than $max_s s to end"
  [ "$expect" = fail ] || [ $n -ge "${expect#*:}" ] || fail "fewer than ${expect#*:} processes reported the failure"
elif [ "$expect" != ok ]; then
  fail "no FAIL_AT_MS line: the failure was never injected"
fi
exit $status
