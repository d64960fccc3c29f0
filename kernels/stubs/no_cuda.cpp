// Stub CUDA kernels for builds without the CUDA toolkit: asking for the CUDA backend throws NotAvailable.
#include <pmap/error.h>

#include "kernels/backend.h"

namespace pmap::kernels::detail {

const Backend& cuda_backend() {
  throw NotAvailable("the CUDA kernels were not built (PMAPCC_WITH_CUDA=OFF or no CUDA toolkit)");
}

}  // namespace pmap::kernels::detail
