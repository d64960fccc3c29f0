// This variant's backend, exported as extern "C" pmapcc_cpu_backend_<variant>() for kernels/cpu/shared/cpu_backend.cpp,
// which chooses the active one.
#include <pmapcc/kernels/cpu/ops.h>

#define PMAPCC_CPU_CONCAT2(a, b) a##b
#define PMAPCC_CPU_CONCAT(a, b) PMAPCC_CPU_CONCAT2(a, b)

std::string PMAPCC_CPU_NS::Ops::isa() const { return PMAPCC_CPU_STR(PMAPCC_CPU_VARIANT); }

extern "C" const pmap::kernels::CpuBackend* PMAPCC_CPU_CONCAT(pmapcc_cpu_backend_, PMAPCC_CPU_VARIANT)() {
  static const PMAPCC_CPU_NS::Ops ops;
  return &ops;
}
