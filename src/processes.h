// Seam between the runtime and the multi-process backend, implemented by src/mpi/* or by
// src/stubs/no_mpi.cpp: process identity, gathering small values from every process, and the
// per-mesh transport that carries collectives of groups spanning processes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pmap/device.h>
#include <pmap/mesh.h>

#include "group.h"

namespace pmap::detail {

// distributed::initialize / shutdown. initialize returns whether this program runs as several processes.
bool initialize_processes();
void shutdown_processes();
int process_index();  // 0 in a single-process program
int process_count();  // 1 in a single-process program

// How long a process waits for the others before declaring them lost: MeshOptions::process_timeout
// when positive, else PMAPCC_MPI_TIMEOUT (seconds), else 8 s. Malformed values raise ValueError.
std::chrono::milliseconds process_timeout(std::chrono::milliseconds configured);

// Every process's `values` (any length), in process order; `what` names the call in errors. Every
// process must call it at the same point; blocks at most process_timeout({}).
std::vector<std::vector<std::int64_t>> gather_from_processes(const std::vector<std::int64_t>& values,
                                                             const std::string& what);

// The part of a Mesh that talks to other processes; one per mesh whose devices span processes.
class MeshTransport {
 public:
  virtual ~MeshTransport() = default;
  // The exchange for a group that spans processes (`members`: mesh devices in rank order), or nullptr
  // when this process runs none of them. Every process calls this for the same groups, in the same
  // order; the transport owns the result.
  virtual RemoteExchange* exchange_for(const std::vector<int>& members, const std::string& axes) = 0;
  // A pmap call starts. Raises Aborted when an earlier failure left the processes out of step.
  virtual void begin_call() = 0;
  // A device of this process failed with `what`: the other processes are told, so that they raise
  // instead of waiting for this one, and this process's later calls raise Aborted.
  virtual void report_failure(const std::string& what) noexcept = 0;
};

// Checks that every process builds the same mesh (blocking, collective over all processes) and
// returns its transport. The stub raises NotAvailable.
std::unique_ptr<MeshTransport> make_mesh_transport(const std::vector<Device>& devices,
                                                   const std::vector<AxisSpec>& axes, const MeshOptions& options);

}  // namespace pmap::detail
