// MPI backend presence flag.
#include "backend.h"

namespace pmap::detail {

bool mpi_available() { return true; }

}  // namespace pmap::detail
