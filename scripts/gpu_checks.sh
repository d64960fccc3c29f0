#!/usr/bin/env bash
# Every check that needs a GPU, in order, from the repository root of a CUDA machine:
#   1. build (Release, CUDA on, NCCL when found)          5. compute-sanitizer racecheck (shared memory)
#   2. the CUDA tests (ctest -R cuda)                       6. compute-sanitizer synccheck
#   3. the whole suite                                      7. bench_cuda_train (model-images/s)
#   4. compute-sanitizer memcheck on the CUDA tests         8. side by side with the JAX / PyTorch anchors
# usage: scripts/gpu_checks.sh [--build DIR] [--data DIR] [--skip-build] [--only N[,N...]]
#   --data DIR     MNIST IDX files for step 8 (default data/mnist; step 8 is skipped when absent)
#   ANCHORS=DIR    where jax_cnn_ensemble.py and torch_cnn_ensemble.py live (default: shared/anchors,
#                  ../shared/anchors or /work/shared/anchors, the first that exists)
# Writes logs to <build>/gpu_checks/ and exits non-zero when a check fails (the others still run).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

build=build-gpu
data=data/mnist
skip_build=0
only=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --only) only=",$2,"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu_checks.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
logs="$build/gpu_checks"
mkdir -p "$logs"
failed=()

wanted() { [[ -z "$only" || "$only" == *",$1,"* ]]; }
# check N NAME COMMAND...: runs one check, logs it, records a failure.
check() {
  local n=$1 name=$2
  shift 2
  wanted "$n" || return 0
  echo "== [$n] $name: $*"
  if "$@" >"$logs/$n-$name.log" 2>&1; then
    echo "   ok ($(tail -n 1 "$logs/$n-$name.log"))"
  else
    echo "   FAILED, see $logs/$n-$name.log:"
    tail -n 20 "$logs/$n-$name.log" | sed 's/^/     /'
    failed+=("$n-$name")
  fi
}

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_checks.sh: no GPU here (nvidia-smi -L failed); nothing to check" >&2
  exit 1
fi
nvidia-smi -L
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
tests="$build/tests/pmapcc_tests"
cuda_cases='cuda*'   # every GPU test case's name starts with "cuda"

if [[ $skip_build == 0 ]]; then
  check 1 configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPMAPCC_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90
  # What the whole suite (step 3) runs: the tests, the program its CLI test drives, and the
  # multi-process tests when MPI was found (their mpi.cuda cases put CUDA devices across processes).
  targets=(pmapcc_tests bench_cuda_train mnist_ensemble)
  cmake --build "$build" --target help 2>/dev/null | grep -q pmapcc_mpi_tests && targets+=(pmapcc_mpi_tests)
  check 1 build cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
fi
check 2 cuda-tests ctest --test-dir "$build" -R cuda --output-on-failure
check 3 all-tests ctest --test-dir "$build" --output-on-failure -j 4
if [[ -x "$sanitizer" ]]; then
  check 4 memcheck "$sanitizer" --tool memcheck --leak-check full --error-exitcode 1 "$tests" -tc="$cuda_cases"
  check 5 racecheck "$sanitizer" --tool racecheck --error-exitcode 1 "$tests" -tc="$cuda_cases"
  check 6 synccheck "$sanitizer" --tool synccheck --error-exitcode 1 "$tests" -tc="$cuda_cases"
else
  echo "== [4-6] compute-sanitizer not found: skipped"
  failed+=("4-6-no-compute-sanitizer")
fi
check 7 bench "$build/bench/bench_cuda_train" --steps 200

anchors=${ANCHORS:-}
for dir in shared/anchors ../shared/anchors /work/shared/anchors; do
  [[ -z "$anchors" && -f "$dir/jax_cnn_ensemble.py" ]] && anchors=$dir
done
if wanted 8 && [[ -d "$data" && -n "$anchors" ]]; then
  check 8 build-mnist_ensemble cmake --build "$build" -j "$(nproc)" --target mnist_ensemble
  for members in 1 4 8; do
    check 8 "pmapcc-$members" "$build/examples/mnist_ensemble" --backend cuda --devices 1 --members "$members" \
      --epochs 1 --data "$data" --progress plain --metrics-json "$logs/pmapcc-$members.json"
    check 8 "torch-vmap-$members" python3 "$anchors/torch_cnn_ensemble.py" --data "$data" --members "$members" \
      --steps 200 --mode vmap --device cuda
    check 8 "torch-loop-$members" python3 "$anchors/torch_cnn_ensemble.py" --data "$data" --members "$members" \
      --steps 200 --mode loop --device cuda
    check 8 "jax-vmap-$members" python3 "$anchors/jax_cnn_ensemble.py" --data "$data" --members "$members" \
      --steps 200 --mode vmap
  done
  echo "   model_images_per_s:"
  grep -ho '"model_images_per_s": *[0-9.]*' "$logs"/8-*.log "$logs"/7-bench.log 2>/dev/null | sed 's/^/     /'
elif wanted 8; then
  echo "== [8] side by side skipped: need $data (MNIST IDX files) and the anchors (ANCHORS=...)"
fi

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "gpu_checks.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu_checks.sh: all checks passed"
