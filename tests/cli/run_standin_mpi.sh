#!/usr/bin/env bash
# mnist_ensemble --backend cuda in 2 MPI processes of one fake GPU each, on the CUDA stand-in: each process
# plays a machine of its own (PMAPCC_STANDIN_NODE), so the mesh's two GPUs meet over NCCL across the
# processes (the stand-in's ranks meet through files in PMAPCC_STANDIN_NCCL_DIR). Ensemble and data
# parallel; each run's checkpoint must equal, bit for bit, the host run of the same kernels on 2 CPU
# devices in one process (--kernels cuda-on-host), and the runs must repeat bit for bit. Ranks that cannot
# meet fail with NCCL's error.
# usage: run_standin_mpi.sh MPIEXEC /path/to/mnist_ensemble MAKE_IDX_PY [small]
#   small: 64 images in batches of 16 (4 steps) instead of 320 in batches of 32, for AddressSanitizer
set -uo pipefail
mpiexec=$1
bin=$(realpath "$2")
make_idx=$3
size=${4:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PMAPCC_STANDIN_NCCL_DIR=$work/nccl  # where the stand-in's NCCL ranks meet
mkdir -p "$PMAPCC_STANDIN_NCCL_DIR"
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags=()
"$mpiexec" --version 2>&1 | grep -Eq "Open MPI|OpenRTE" && flags+=(--oversubscribe)
fails=0 passes=0
pass() { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
same() { python3 "$root/scripts/compare_checkpoints.py" "$1" "$2" >"$work/cmp.out" 2>&1; }

case "$size" in
  "") images=(320 100) batch=32 ;;
  small) images=(64 16) batch=16 ;;
  *) echo "run_standin_mpi.sh: unknown size '$size' (small)" >&2; exit 2 ;;
esac
python3 "$make_idx" "$work/data" "${images[@]}" || exit 1
common=(--data "$work/data" --batch-size "$batch" --progress plain --epochs 1)
# Each rank plays the machine numbered by its rank (Open MPI's OMPI_COMM_WORLD_RANK, MPICH's PMI_RANK).
as_node='export PMAPCC_STANDIN_NODE=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:?no MPI rank in the environment}}; exec "$@"'

# check NAME ARGS...: 2 processes x 1 fake GPU against the host run on 2 CPU devices; then again.
check() {
  local name=$1; shift
  for run in 1 2; do
    if ! PMAPCC_STANDIN_GPUS=1 timeout 300 "$mpiexec" "${flags[@]}" -np 2 bash -c "$as_node" bash \
        "$bin" "${common[@]}" --backend cuda --devices 1 "$@" --save "$work/$name.mpi$run.st" \
        >"$work/$name.mpi$run.out" 2>&1; then
      fail "$name: 2 processes x 1 fake GPU failed: $(tail -c 600 "$work/$name.mpi$run.out")"; return
    fi
  done
  if ! "$bin" "${common[@]}" --backend cpu --kernels cuda-on-host --devices 2 "$@" --save "$work/$name.host.st" \
      >"$work/$name.host.out" 2>&1; then
    fail "$name: the host run failed: $(tail -c 400 "$work/$name.host.out")"; return
  fi
  if same "$work/$name.mpi1.st" "$work/$name.host.st"; then
    pass "$name: 2 processes x 1 fake GPU = the host run on 2 devices, bit for bit"
  else
    fail "$name: 2 processes x 1 fake GPU differ from the host run: $(grep -v ': same' "$work/cmp.out" | head -5)"
  fi
  same "$work/$name.mpi1.st" "$work/$name.mpi2.st" && pass "$name: the 2-process run repeats bit for bit" \
    || fail "$name: the 2-process run does not repeat bit for bit"
}

check ensemble --mode ensemble --members 2
check data-parallel --mode data-parallel
# The GPUs met over NCCL across the processes (not staged through the host): the stand-in's NCCL folders.
if compgen -G "$work/nccl/pmapcc-standin-nccl-*" >/dev/null; then
  folders=$(compgen -G "$work/nccl/pmapcc-standin-nccl-*" | wc -l)
  pass "the processes' GPUs met over NCCL ($folders communicator folders)"
else
  fail "no NCCL communicator spanned the processes"
fi
# Ranks that cannot meet (their folder is a file): every process exits 1 with NCCL's error, naming the call.
not_a_folder=$work/data/train-labels-idx1-ubyte
PMAPCC_STANDIN_GPUS=1 PMAPCC_STANDIN_NCCL_DIR=$not_a_folder timeout 300 "$mpiexec" "${flags[@]}" -np 2 \
  bash -c "$as_node" bash "$bin" "${common[@]}" --backend cuda --devices 1 --members 2 >"$work/nofolder.out" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && grep -q "ncclCommInitRankConfig" "$work/nofolder.out" \
    && ! grep -qiE "core dumped|terminate called" "$work/nofolder.out"; then
  pass "ranks that cannot meet: a clear NCCL error, exit $rc"
else
  fail "ranks that cannot meet: exit $rc ($(tail -c 400 "$work/nofolder.out"))"
fi
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
