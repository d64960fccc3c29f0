// NCCL backend presence flag.
#include "backend.h"

namespace pmap::detail {

bool nccl_available() { return true; }

}  // namespace pmap::detail
