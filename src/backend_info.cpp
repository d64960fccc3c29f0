// Reports which backends this build of pmapcc has.
#include <pmap/backends.h>

#include "availability.h"

namespace pmap {

BuildInfo build_info() {
  return BuildInfo{PMAPCC_HAVE_CUDA != 0, detail::nccl_available(), detail::mpi_available()};
}

int cuda_device_count() { return detail::cuda_device_count(); }

std::vector<std::string> cuda_report() {
  std::vector<std::string> out = detail::cuda_report();
  if (detail::nccl_available()) out.push_back("NCCL " + detail::nccl_version());
  return out;
}

GpuStatus cuda_status() {
  const detail::GpuProbe& p = detail::cuda_probe();
  return GpuStatus{p.count, p.problem};
}

}  // namespace pmap
