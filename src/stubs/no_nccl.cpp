// Stub NCCL backend: GPU meshes without NCCL are not available in this build.
#include "backend.h"

namespace pmap::detail {

bool nccl_available() { return false; }

}  // namespace pmap::detail
