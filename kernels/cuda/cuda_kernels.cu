// CUDA kernels entry point: until the CUDA twins of the CPU ops land (issue 4), asking for the CUDA
// backend raises NotAvailable with that reason.
#include <pmap/error.h>

#include "kernels/backend.h"

namespace pmap::kernels::detail {

const Backend& cuda_backend() {
  throw NotAvailable("the CUDA kernels are not implemented in this version of pmapcc yet");
}

}  // namespace pmap::kernels::detail
