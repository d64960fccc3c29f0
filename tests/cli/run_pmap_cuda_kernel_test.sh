#!/usr/bin/env bash
# The pmap_cuda_kernel example: on a GPU, 2 devices' kernels on pmap::cuda_stream() give the expected sum
# (the program checks it: exit 0); without one it exits 1 saying why, which PMAPCC_REQUIRE_GPU=1
# (scripts/gpu_checks.sh) counts as a failure.
#   run_pmap_cuda_kernel_test.sh PATH/TO/pmap_cuda_kernel
set -u
out=$("$1" 2 2>&1)
rc=$?
echo "$out"
if [ $rc -eq 0 ]; then
  grep -q "^sum .*, expected" <<<"$out" || { echo "FAIL: no sum line"; exit 1; }
  echo "ok: the kernel ran on each device's stream, the sum is right"
  exit 0
fi
if [ "${PMAPCC_REQUIRE_GPU:-0}" = 1 ]; then echo "FAIL: exit $rc with PMAPCC_REQUIRE_GPU=1"; exit 1; fi
if [ $rc -eq 1 ] && grep -Eq "^pmap_cuda_kernel: .*(GPU|CUDA)" <<<"$out"; then
  echo "ok: no GPU, and it says so"
  exit 0
fi
echo "FAIL: exit $rc"
exit 1
