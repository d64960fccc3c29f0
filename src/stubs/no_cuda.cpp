// Stub CUDA backend for builds without the CUDA toolkit: no CUDA devices exist.
#include "backend.h"

namespace pmap::detail {

int cuda_device_count() { return 0; }

}  // namespace pmap::detail
