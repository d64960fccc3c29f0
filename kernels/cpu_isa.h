// Which build of the CPU kernels runs. kernels/cpu is compiled for the baseline ISA ("generic") and, on
// x86-64 with GCC/Clang and GNU binutils, again with AVX2+FMA ("avx2"); one binary runs on any x86-64 CPU
// and uses AVX2+FMA where the CPU (and OS) support it. The choice is made once, at the first kernel call:
// PMAPCC_CPU_ISA=generic|avx2|auto if set, else the best variant available.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pmap::kernels::cpu {

// The variants built into this binary that this CPU can run, worst first: {"generic"} or {"generic", "avx2"}.
std::vector<std::string> available_isas();

// The active variant ("generic" or "avx2"), choosing it first if no kernel has run yet. Throws
// pmap::ValueError when PMAPCC_CPU_ISA is not one of generic, avx2, auto (or empty), and pmap::NotAvailable
// when it names a variant that was not built or that this CPU cannot run (e.g. avx2 without AVX2 or FMA);
// every CPU kernel call throws the same until the variable is fixed.
std::string isa();

// Makes `name` ("generic", "avx2" or "auto": the best) the active variant for the whole process, for
// tests and benchmarks. Not thread-safe against kernels running on other threads: call it between runs.
// Throws as isa() does for a bad or unavailable name. Results of the variants differ in rounding (FMA).
void set_isa(std::string_view name);

}  // namespace pmap::kernels::cpu
