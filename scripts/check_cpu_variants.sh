#!/usr/bin/env bash
# Checks that one ISA variant's build of the CPU kernels (avx2, avx512) is isolated from the rest of a program
# (see cmake/pmapccCpuVariants.cmake): its merged object defines exactly one global symbol,
# pmapcc_cpu_backend_<isa>; its Eigen is renamed (pmapcc_eigen_<isa>::) so no Eigen symbol is shared with
# another build; and in the linked program no symbol of the variant but the entry point is global.
#   scripts/check_cpu_variants.sh ISA BLOB.o PROGRAM
set -euo pipefail
isa=$1
blob=$2
program=$3
fail() { echo "check_cpu_variants: FAIL: $*" >&2; exit 1; }
entry=pmapcc_cpu_backend_$isa
eigen=pmapcc_eigen_$isa

globals=$(nm --defined-only -g "$blob" | awk '{print $3}')
[[ "$globals" == "$entry" ]] || fail "$blob defines global symbols other than $entry: $globals"

renamed=$(nm -C "$blob" | grep -c "$eigen::" || true)
[[ $renamed -gt 0 ]] || fail "$blob holds no $eigen:: symbol (was Eigen renamed?)"
if nm -C "$blob" | grep -E '[^_a-z0-9]Eigen::' >/dev/null; then
  fail "$blob refers to Eigen:: (the generic build's namespace): $(nm -C "$blob" | grep -E '[^_a-z0-9]Eigen::' | head -3)"
fi

leaked=$(nm -C --defined-only -g "$program" | grep -E "$eigen::|kernels::cpu::$isa::" || true)
[[ -z "$leaked" ]] || fail "$program exports $isa symbols: $(echo "$leaked" | head -3)"
# grep reads all of nm's output (no -q): an early exit would kill nm with SIGPIPE, which pipefail reports as
# a failure once the program's symbol table is large.
nm --defined-only "$program" | grep " T $entry\$" >/dev/null || fail "$program lacks $entry"

generic_eigen=$(nm -C "$program" | grep -c ' Eigen::' || true)
variant_eigen=$(nm -C "$program" | grep -c "$eigen::" || true)
echo "check_cpu_variants: ok: $entry is the only global $isa symbol; Eigen symbols in the program: $generic_eigen generic (Eigen::), $variant_eigen $isa ($eigen::, all local)"
