#!/usr/bin/env bash
# Checkpoints survive kills and failed writes (mnist_ensemble --save):
#   1. SIGKILL at random moments (KILLS times, default 50), each run resuming from the checkpoint the last
#      one left: after every kill the checkpoint on disk is absent (before the first save) or exactly one
#      of the uninterrupted run's per-epoch checkpoints, whole and loadable; the run finally completed from
#      it ends with tensors and metrics bitwise equal to the uninterrupted run's.
#   2. A write that fails (the file-size limit, as a full disk would: EFBIG), and a directory that is not
#      there or (when not running as root) not writable: one clear error naming the path, a non-zero exit,
#      and the previous checkpoint intact.
# usage: kill_checkpoints.sh /path/to/mnist_ensemble [KILLS] [SEED]
set -uo pipefail
bin=$(realpath "$1")
kills=${2:-50}
seed=${3:-$RANDOM}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "kill_checkpoints: $kills kills, seed $seed (rerun with: $0 $1 $kills $seed)"
RANDOM=$seed
fails=0
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

python3 "$here/make_idx.py" "$work/data" 384 100
epochs=6
run=("$bin" --data "$work/data" --devices 2 --members 2 --batch-size 64 --epochs $epochs --progress none)

# The tensor bytes (after the header) and epochs_done of a checkpoint; "missing" or "bad" otherwise.
fingerprint() {
  python3 - "$1" <<'PY'
import hashlib, json, struct, sys
try:
    b = open(sys.argv[1], "rb").read()
except FileNotFoundError:
    print("missing"); sys.exit()
try:
    n = struct.unpack("<Q", b[:8])[0]
    meta = json.loads(b[8:8 + n])["__metadata__"]
    tensors = b[8 + n:]
    assert len(tensors) > 0
    print(meta["epochs_done"], hashlib.sha256(tensors).hexdigest())
except Exception as e:
    print("bad", e)
PY
}

# The uninterrupted run's checkpoint after each epoch k (each run from scratch is the same run, bitwise).
declare -A reference
for k in $(seq 1 $epochs); do
  "${run[@]}" --epochs "$k" --save "$work/ref.st" --metrics-json "$work/ref-$k.json" >/dev/null 2>&1 || fail "reference run $k"
  reference[$k]=$(fingerprint "$work/ref.st")
done

ck="$work/ck.st"
done_runs=0 killed=0 mid_write=0
for i in $(seq 1 "$kills"); do
  args=("${run[@]}" --save "$ck" --metrics-json "$work/m.json")
  [ -e "$ck" ] && args+=(--resume "$ck")
  "${args[@]}" >/dev/null 2>"$work/err" &
  pid=$!
  # 0 to 1.5 s: from start-up through several epochs and their checkpoint writes.
  sleep "$(printf '0.%03d' $((RANDOM % 1000)))"
  [ $((RANDOM % 2)) -eq 0 ] && sleep "0.$((RANDOM % 5))"
  if kill -9 "$pid" 2>/dev/null; then killed=$((killed + 1)); fi
  wait "$pid" 2>/dev/null
  ls "$work"/ck.st.tmp-* >/dev/null 2>&1 && mid_write=$((mid_write + 1))
  rm -f "$work"/ck.st.tmp-*  # a killed write leaves its temp file; the checkpoint itself is never torn
  fp=$(fingerprint "$ck")
  case "$fp" in
    missing) ;;
    bad*) fail "kill $i: the checkpoint is unreadable: $fp" ;;
    *)
      k=${fp%% *}
      [ "${reference[$k]:-}" = "$fp" ] || fail "kill $i: the checkpoint at epoch $k is not the uninterrupted run's"
      [ "$k" = "$epochs" ] && { done_runs=$((done_runs + 1)); rm -f "$ck"; }  # finished: start over
      ;;
  esac
done
echo "kill_checkpoints: $killed kills landed ($mid_write during a checkpoint write), $done_runs runs finished between kills"
[ "$killed" -ge $((kills * 3 / 4)) ] || fail "only $killed of $kills kills landed on a running process"

# Finish from the last checkpoint: the same tensors and metrics as the uninterrupted run.
args=("${run[@]}" --save "$ck" --metrics-json "$work/m.json")
[ -e "$ck" ] && args+=(--resume "$ck")
"${args[@]}" >/dev/null 2>"$work/err" || fail "the final resumed run failed: $(head -c 300 "$work/err")"
[ "$(fingerprint "$ck")" = "${reference[$epochs]}" ] || fail "the resumed run's checkpoint differs from the uninterrupted run's"
python3 - "$work/ref-$epochs.json" "$work/m.json" <<'PY' || fail "the resumed run's metrics differ from the uninterrupted run's"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
timing = {"seconds", "eval_seconds", "model_images_per_second"}
strip = lambda e: {k: v for k, v in e.items() if k not in timing}
assert [strip(e) for e in a["epochs"]] == [strip(e) for e in b["epochs"]]
assert a["ensemble_size_curve"] == b["ensemble_size_curve"]
PY

# A write that fails: the file-size limit (EFBIG, as a full disk's ENOSPC), SIGXFSZ ignored as a daemon would.
before=$(fingerprint "$ck")
bash -c "trap '' XFSZ; ulimit -f 64; exec \"\$@\"" _ "${run[@]}" --epochs $((epochs + 1)) --resume "$ck" --save "$ck" \
  >/dev/null 2>"$work/err"
rc=$?
[ $rc -eq 1 ] && grep -q "error: $ck: write to temp file .* failed: File too large" "$work/err" \
  || fail "a failed write: exit $rc, $(head -c 300 "$work/err")"
[ "$(fingerprint "$ck")" = "$before" ] || fail "a failed write changed the previous checkpoint"
ls "$work"/ck.st.tmp-* >/dev/null 2>&1 && fail "a failed write left its temp file"
# A directory that is not there: refused before anything runs (the output paths are checked first).
"${run[@]}" --epochs 1 --save "$work/no/such/dir/ck.st" >/dev/null 2>"$work/err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--save $work/no/such/dir/ck.st: the directory '$work/no/such/dir' does not exist" "$work/err" \
  || fail "a missing directory: exit $rc, $(head -c 300 "$work/err")"
# A directory that is not writable (root writes anywhere: then there is nothing to test).
if [ "$(id -u)" != 0 ]; then
  mkdir "$work/ro" && cp "$ck" "$work/ro/ck.st" && chmod 555 "$work/ro"
  "${run[@]}" --epochs $((epochs + 1)) --resume "$work/ro/ck.st" --save "$work/ro/ck.st" >/dev/null 2>"$work/err"
  rc=$?
  chmod 755 "$work/ro"
  [ $rc -eq 2 ] && grep -q "is not writable" "$work/err" || fail "a read-only directory: exit $rc, $(head -c 300 "$work/err")"
  [ "$(fingerprint "$work/ro/ck.st")" = "$before" ] || fail "a read-only directory: the checkpoint changed"
else
  echo "kill_checkpoints: running as root, which writes anywhere: the read-only directory case is skipped"
fi

[ "$fails" -eq 0 ] && echo "kill_checkpoints: all checks passed" || echo "kill_checkpoints: $fails check(s) failed"
[ "$fails" -eq 0 ]
