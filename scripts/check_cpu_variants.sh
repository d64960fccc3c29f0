#!/usr/bin/env bash
# Checks that the AVX2 build of the CPU kernels is isolated from the rest of a program (see
# cmake/pmapccCpuVariants.cmake): its merged object defines exactly one global symbol, pmapcc_cpu_backend_avx2;
# its Eigen is renamed (pmapcc_eigen_avx2::) so no Eigen symbol is shared with the generic build; and in
# the linked program no avx2 symbol but the entry point is global.
#   scripts/check_cpu_variants.sh BLOB.o PROGRAM
set -euo pipefail
blob=$1
program=$2
fail() { echo "check_cpu_variants: FAIL: $*" >&2; exit 1; }

globals=$(nm --defined-only -g "$blob" | awk '{print $3}')
[[ "$globals" == "pmapcc_cpu_backend_avx2" ]] || fail "$blob defines global symbols other than pmapcc_cpu_backend_avx2: $globals"

renamed=$(nm -C "$blob" | grep -c 'pmapcc_eigen_avx2::' || true)
[[ $renamed -gt 0 ]] || fail "$blob holds no pmapcc_eigen_avx2:: symbol (was Eigen renamed?)"
if nm -C "$blob" | grep -E '[^_a-z]Eigen::' >/dev/null; then
  fail "$blob refers to Eigen:: (the generic build's namespace): $(nm -C "$blob" | grep -E '[^_a-z]Eigen::' | head -3)"
fi

leaked=$(nm -C --defined-only -g "$program" | grep -E 'pmapcc_eigen_avx2|kernels::cpu::avx2' || true)
[[ -z "$leaked" ]] || fail "$program exports avx2 symbols: $(echo "$leaked" | head -3)"
# grep reads all of nm's output (no -q): an early exit would kill nm with SIGPIPE, which pipefail reports as
# a failure once the program's symbol table is large.
nm --defined-only "$program" | grep ' T pmapcc_cpu_backend_avx2$' >/dev/null || fail "$program lacks pmapcc_cpu_backend_avx2"

generic_eigen=$(nm -C "$program" | grep -c ' Eigen::' || true)
avx2_eigen=$(nm -C "$program" | grep -c 'pmapcc_eigen_avx2::' || true)
echo "check_cpu_variants: ok: pmapcc_cpu_backend_avx2 is the only global avx2 symbol; Eigen symbols in the program: $generic_eigen generic (Eigen::), $avx2_eigen avx2 (pmapcc_eigen_avx2::, all local)"
