// MPI backend presence flag.
#include "availability.h"

namespace pmap::detail {

bool mpi_available() { return true; }

}  // namespace pmap::detail
