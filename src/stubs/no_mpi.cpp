// Stub MPI backend: in a build without MPI every program is a single process.
#include "backend.h"

namespace pmap::detail {

bool mpi_available() { return false; }

}  // namespace pmap::detail
