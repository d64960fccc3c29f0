// The generator under pmapcc's checking macros (CUDA, cuBLAS, cuRAND: pmap/detail/cuda_check.h; NCCL:
// src/nccl/nccl_check.h; MPI: src/mpi/mpi_check.h). A failed call throws a typed pmap error naming the
// expression, file:line, where it ran (a GPU, a process) and the library's own message. CUDA-free, so
// every library's checks share it. Internal to pmapcc's sources.
#pragma once

#include <string>

namespace pmap::detail {

// Where a checked call was written.
struct CheckSite {
  const char* expr;
  const char* file;
  int line;
};

// "<expr> failed at <file>:<line> on <where>: <what>".
inline std::string check_message(const CheckSite& site, const std::string& where, const std::string& what) {
  return std::string(site.expr) + " failed at " + site.file + ":" + std::to_string(site.line) + " on " + where +
         ": " + what;
}

}  // namespace pmap::detail

// PMAPCC_CHECK_IF(expr, accepted, thrower): evaluates expr once; unless accepted(status), calls
// thrower(status, CheckSite), which throws. PMAPCC_CHECK_GEN(expr, ok, thrower): accepted means == ok.
#define PMAPCC_CHECK_IF(expr, accepted, thrower)                                                    \
  do {                                                                                              \
    const auto pmapcc_status_ = (expr);                                                             \
    if (!(accepted)(pmapcc_status_))                                                                \
      thrower(pmapcc_status_, ::pmap::detail::CheckSite{#expr, __FILE__, __LINE__});                \
  } while (0)
#define PMAPCC_CHECK_GEN(expr, ok, thrower) \
  PMAPCC_CHECK_IF(expr, [](const auto& pmapcc_s_) { return pmapcc_s_ == (ok); }, thrower)
