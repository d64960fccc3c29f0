// MeshImpl: a mesh's topology (src/topology.cpp), communicators (src/comm_plan.cpp), worker threads and
// the pmap execution loop (src/mesh.cpp). Device ids are mesh positions over every process; workers exist
// for the local devices only.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <pmap/communicator.h>
#include <pmap/mesh.h>

#include "cuda_seam.h"
#include "nccl_clique.h"
#include "processes.h"
#include "thread_hub.h"
#include "workers.h"

namespace pmap::detail {

class MeshImpl {
 public:
  MeshImpl(std::vector<Device> devices, std::vector<AxisSpec> axes, MeshOptions options);
  ~MeshImpl();

  const std::vector<Device>& devices() const { return devices_; }
  const std::vector<AxisSpec>& axes() const { return axes_; }
  const MeshOptions& options() const { return options_; }
  int size() const { return static_cast<int>(devices_.size()); }
  const std::vector<Device>& local_devices() const { return local_devices_; }
  const std::vector<int>& local_ids() const { return local_; }  // mesh position of each local device
  std::vector<int> coords(int device) const;
  // Indices of the named axes in tuple order (empty = all axes); AxisError names the axes in scope.
  std::vector<int> resolve(const AxisNames& axes) const;
  int axis_size(const AxisNames& axes) const;
  // The device's index along the axis tuple (row-major over the tuple, in the tuple's order).
  int axis_index(int device, const AxisNames& axes) const;
  // A local device's communicator for an axis tuple, built with the mesh. device_memory: the communicator
  // takes buffers in the device's own memory (NCCL, or the device hub of virtual devices; single-process
  // meshes only); false: host memory (CPU devices, or CUDA devices staged through the host, which every
  // mesh spanning processes does).
  struct Endpoint {
    Communicator* comm;
    bool device_memory;
  };
  // Raises AxisError as resolve() does. Builds nothing: the tuple's key is computed from the names.
  Endpoint endpoint(int device, const AxisNames& axes) const;
  const Group& group(int device, const AxisNames& axes) const;  // this process's view of the device's group
  // Device d's CUDA stream (the one its worker's work goes to); null for CPU and other processes' devices.
  StreamHandle stream(int device) const { return streams_[static_cast<std::size_t>(device)].get(); }
  std::string scope_str() const;  // "'data', 'model'"

  // Runs fn(i) on the worker of every local device i (an index into local_devices()); rethrows the
  // first failure (see pmap.h).
  void run(TaskRef fn);

 private:
  // How the devices of one group talk: see comm_kind.
  enum class CommKind : unsigned char { host_hub, device_hub, nccl };
  struct AxisComms {
    std::vector<Group> groups;  // this process's view of each group
    std::vector<int> group_of;  // per device
    std::vector<std::unique_ptr<Communicator>> comms;  // per device; null for other processes' devices
    std::vector<CommKind> kind;                        // per device
  };
  void validate() const;  // topology.cpp: axes, devices and options, or the error naming what is wrong
  // comm_plan.cpp: whether NCCL connects the devices (collective over the processes when the mesh spans
  // several), and the communicators of every axis tuple.
  bool plan_nccl(bool spans_processes) const;
  void build_comms();
  CommKind comm_kind(const Group& g);
  void build_nccl_comms();
  void release_nccl_comms() noexcept;
  void report_failure(const std::string& what);
  // An axis tuple's key in comms_: its axis ids in tuple order as the digits, id + 1, of a number in base
  // (number of axes + 1). The AxisNames overload validates the names as resolve() does.
  std::uint64_t tuple_key(const std::vector<int>& axis_ids) const;
  std::uint64_t tuple_key(const AxisNames& axes) const;
  // Calls f(id) for the named axes' ids in tuple order (every axis when none is named), raising AxisError
  // for an unknown or repeated name: resolve() and tuple_key() share it.
  template <class F> void for_each_axis(const AxisNames& axes, F&& f) const;
  const AxisComms& lookup(const AxisNames& axes) const;

  std::vector<Device> devices_;
  std::vector<std::string> device_names_;  // devices_[d].str()
  std::vector<AxisSpec> axes_;
  MeshOptions options_;
  std::vector<int> local_;
  std::vector<Device> local_devices_;
  std::unique_ptr<MeshTransport> transport_;  // meshes spanning processes; outlives the groups
  std::unique_ptr<ThreadHub> hub_;
  std::vector<DeviceStream> streams_;  // per device: its CUDA stream (empty for CPU and other processes' devices)
  std::unique_ptr<NcclClique> nccl_;  // single process, one GPU per device, NCCL built: the root communicators
  std::map<std::uint64_t, AxisComms> comms_;  // by tuple_key; the same order in every process
  std::mutex run_mu_;
  // A device's failure in a run; the first one (by time, an Aborted only when no other) is rethrown.
  struct Failure {
    std::exception_ptr error;
    std::uint64_t order = std::numeric_limits<std::uint64_t>::max();
    bool aborted = false;
  };
  std::vector<Failure> failures_;  // per local device, reused by every run (under run_mu_)
  std::unique_ptr<WorkerPool> workers_;  // last: threads stop before the rest is destroyed
};

// The device a pmapped function runs on; set on worker threads for the duration of a pmap call.
struct DeviceContext {
  MeshImpl* mesh = nullptr;
  int device = -1;
  std::uint64_t collectives = 0;  // entered by this device in this call (collectives_entered())
};
// The calling thread's context; throws pmap::Error naming `what` when called outside pmap.
DeviceContext& current_context(const char* what);
bool in_pmap();

}  // namespace pmap::detail
