// Stub MPI backend: in a build without MPI every program is a single process, and a mesh naming
// another process's devices raises NotAvailable.
#include <pmap/error.h>

#include "availability.h"
#include "processes.h"

namespace pmap::detail {

bool mpi_available() { return false; }

bool initialize_processes() { return false; }
void shutdown_processes() {}
int process_index() { return 0; }
int process_count() { return 1; }

std::vector<std::vector<std::int64_t>> gather_from_processes(const std::vector<std::int64_t>& values,
                                                             const std::string&) {
  return {values};
}

std::unique_ptr<MeshTransport> make_mesh_transport(const std::vector<Device>&, const std::vector<AxisSpec>&,
                                                   const MeshOptions&) {
  throw NotAvailable("Mesh: its devices belong to several processes, but this build of pmapcc has no MPI "
                     "(configure with PMAPCC_WITH_MPI=ON)");
}

}  // namespace pmap::detail
