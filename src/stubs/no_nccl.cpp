// Stub NCCL backend: GPU meshes without NCCL use the thread hub (device memory on one GPU, host staging
// across GPUs).
#include <pmap/error.h>

#include "availability.h"
#include "nccl_clique.h"

namespace pmap::detail {

bool nccl_available() { return false; }
std::string nccl_version() { return {}; }

std::unique_ptr<NcclClique> make_nccl_clique(const std::vector<int>&, const std::vector<int>&, int, bool, ThreadHub&,
                                             std::chrono::milliseconds, std::chrono::milliseconds) {
  throw NotAvailable("this pmapcc was built without NCCL (PMAPCC_WITH_NCCL=OFF or NCCL not found)");
}

}  // namespace pmap::detail
