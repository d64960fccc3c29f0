// PMAPCC_NCCL_CHECK: the NCCL member of the checking macro family (pmap/detail/check.h). A failed call
// throws pmap::NcclError naming the expression, file:line, the current GPU, NCCL's error string and its
// last-error detail. PMAPCC_NCCL_ISSUE: the same for a call on a nonblocking communicator, where
// ncclInProgress means "queued, completion pending".
#pragma once

#include <nccl.h>

#include <string>

#include <pmap/detail/cuda_check.h>

namespace pmap::detail {

// A call on a nonblocking communicator succeeded or was queued.
inline bool nccl_issued(ncclResult_t result) { return result == ncclSuccess || result == ncclInProgress; }

[[noreturn]] inline void throw_nccl_error(ncclResult_t result, const CheckSite& site) {
  std::string what = ncclGetErrorString(result);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') what += ": " + std::string(last);
  throw NcclError(gpu_check_message(site, what));
}

}  // namespace pmap::detail

#define PMAPCC_NCCL_CHECK(expr) PMAPCC_CHECK_GEN(expr, ncclSuccess, ::pmap::detail::throw_nccl_error)
#define PMAPCC_NCCL_ISSUE(expr) PMAPCC_CHECK_IF(expr, ::pmap::detail::nccl_issued, ::pmap::detail::throw_nccl_error)
