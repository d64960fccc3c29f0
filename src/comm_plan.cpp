// The communicator plan of a mesh: which groups each axis tuple has, and how each group's devices talk
// (comm_kind: the host hub, the device hub, or NCCL, deciding GPU identity across processes first), the
// communicators built accordingly, and NCCL's split and release on the workers.
#include "mesh_impl.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <set>
#include <string_view>

#include <unistd.h>

#include <pmap/detail/hash.h>
#include <pmap/error.h>

#include "availability.h"
#include "processes.h"
#include "thread_communicator.h"

namespace pmap::detail {
namespace {

std::vector<std::vector<int>> ordered_tuples(int n) {
  // Every non-empty ordered tuple of distinct axis indices: permutations of every subset.
  std::vector<std::vector<int>> out;
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    std::vector<int> t;
    for (int i = 0; i < n; ++i)
      if (mask & (1u << i)) t.push_back(i);
    do out.push_back(t);
    while (std::next_permutation(t.begin(), t.end()));
  }
  return out;
}

// PMAPCC_NCCL_SINGLE_GPU=1 (for tests on one-GPU machines): NCCL also for meshes of one CUDA device and
// for groups of one device, so the NCCL path runs where there is a single GPU.
bool nccl_single_gpu() {
  const char* v = std::getenv("PMAPCC_NCCL_SINGLE_GPU");
  return v != nullptr && std::string_view(v) == "1";
}

// Two or more CUDA devices (one with PMAPCC_NCCL_SINGLE_GPU=1), each on its own GPU: NCCL connects them.
bool one_gpu_per_device(const std::vector<Device>& devices) {
  std::set<int> gpus;
  for (const auto& d : devices)
    if (d.is_cpu() || !gpus.insert(d.ordinal).second) return false;
  return devices.size() > 1 || (devices.size() == 1 && nccl_single_gpu());
}

// A mesh of CUDA devices spanning processes: "" when no GPU runs two of its devices (NCCL needs a GPU of
// its own for each rank), else which GPU does. GPUs are told apart by UUID (ordinals differ between
// processes that see different GPUs), or by host name and ordinal where the UUID cannot be read.
// Collective over every process.
std::string gpu_clash_across_processes(const std::vector<Device>& local) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::vector<std::int64_t> mine;  // pairs: (GPU identity hash, ordinal)
  for (const Device& d : local) {
    const std::string uuid = cuda_gpu_uuid(d.ordinal);
    mine.push_back(static_cast<std::int64_t>(
        detail::fnv1a(uuid.empty() ? std::string(host) + ":" + std::to_string(d.ordinal) : "uuid:" + uuid)));
    mine.push_back(d.ordinal);
  }
  const auto all = gather_from_processes(mine, "Mesh construction (GPUs per device)");
  std::map<std::int64_t, std::size_t> owner;  // GPU -> process
  for (std::size_t p = 0; p < all.size(); ++p)
    for (std::size_t k = 0; k + 1 < all[p].size(); k += 2) {
      auto [it, fresh] = owner.emplace(all[p][k], p);
      if (!fresh)
        return "one GPU runs devices of process " + std::to_string(it->second) +
               (it->second == p ? " twice" : " and process " + std::to_string(p)) + " (GPU " +
               std::to_string(all[p][k + 1]) + " of process " + std::to_string(p) + ")";
    }
  return {};
}

}  // namespace

// NCCL connects CUDA devices that each have a GPU of their own: within one process, or across processes (a
// communicator over every process's devices, bootstrapped over MPI). Otherwise CUDA collectives meet in
// the hub (see comm_kind).
bool MeshImpl::plan_nccl(bool spans_processes) const {
  if (!spans_processes) return one_gpu_per_device(devices_) && nccl_available();
  if (std::any_of(devices_.begin(), devices_.end(), [](const Device& d) { return d.is_cpu(); })) return false;
  const std::string clash = gpu_clash_across_processes(local_devices_);  // collective over the processes
  if (nccl_single_gpu() && (!nccl_available() || !clash.empty()))
    throw NotAvailable("Mesh: PMAPCC_NCCL_SINGLE_GPU=1 asks for NCCL across processes, but " +
                       (nccl_available() ? clash + ", and NCCL needs a GPU of its own for every device"
                                         : std::string("this pmapcc was built without NCCL")) +
                       "; unset PMAPCC_NCCL_SINGLE_GPU to stage the collectives through the host");
  return nccl_available() && clash.empty();
}

void MeshImpl::build_comms() {
  std::map<std::uint64_t, std::vector<std::vector<int>>> members;  // whole groups, by tuple_key
  for (const auto& tuple : ordered_tuples(static_cast<int>(axes_.size()))) {
    std::vector<std::string> names;
    for (int id : tuple) names.push_back(axes_[static_cast<std::size_t>(id)].name);
    AxisNames an(names);
    AxisComms ac;
    auto& whole = members[tuple_key(tuple)];
    ac.group_of.assign(devices_.size(), -1);
    std::map<std::vector<int>, int> by_rest;  // coordinates on the other axes -> group
    for (int d = 0; d < size(); ++d) {
      auto c = coords(d);
      std::vector<int> rest;
      for (std::size_t a = 0; a < axes_.size(); ++a)
        if (std::find(tuple.begin(), tuple.end(), static_cast<int>(a)) == tuple.end()) rest.push_back(c[a]);
      auto [it, fresh] = by_rest.emplace(rest, static_cast<int>(ac.groups.size()));
      if (fresh) {
        ac.groups.push_back(Group{{}, an.str(), {}, axis_size(an), nullptr});
        whole.emplace_back(static_cast<std::size_t>(axis_size(an)), -1);
      }
      whole[static_cast<std::size_t>(it->second)][static_cast<std::size_t>(axis_index(d, an))] = d;
      ac.group_of[static_cast<std::size_t>(d)] = it->second;
    }
    comms_.emplace(tuple_key(tuple), std::move(ac));
  }
  // This process's view of each group; groups spanning processes get their exchange, created in the
  // same order on every process. Communicators hold references to groups: create them once the map
  // no longer moves. NCCL ones are made later, on the workers (build_nccl_comms).
  for (auto& [k, ac] : comms_) {
    for (std::size_t g = 0; g < ac.groups.size(); ++g) {
      Group& group = ac.groups[g];
      const auto& whole = members[k][g];
      bool spans = false;
      for (std::size_t r = 0; r < whole.size(); ++r) {
        const Device& dev = devices_[static_cast<std::size_t>(whole[r])];
        spans = spans || dev.process != devices_[static_cast<std::size_t>(whole[0])].process;
        if (dev.process != process_index()) continue;
        group.members.push_back(whole[r]);
        group.ranks.push_back(static_cast<int>(r));
      }
      if (spans) group.remote = transport_->exchange_for(whole, group.axes);
    }
    ac.comms.resize(devices_.size());
    ac.kind.assign(devices_.size(), CommKind::host_hub);
    for (int d : local_) {
      const Group& g = ac.groups[static_cast<std::size_t>(ac.group_of[static_cast<std::size_t>(d)])];
      int local_rank = static_cast<int>(std::find(g.members.begin(), g.members.end(), d) - g.members.begin());
      const CommKind kind = comm_kind(g);
      ac.kind[static_cast<std::size_t>(d)] = kind;
      if (kind != CommKind::nccl)
        ac.comms[static_cast<std::size_t>(d)] =
            std::make_unique<ThreadCommunicator>(*hub_, g, d, local_rank, kind == CommKind::device_hub);
    }
  }
}

// CPU devices meet in the host hub. CUDA devices: NCCL when every device of the mesh has a GPU of its own
// (within one process or across processes), for groups of two or more devices. Otherwise, within one
// process, virtual devices meet in the hub and move the data on the GPU, in device order (bitwise the CPU
// devices' results): on one GPU, or across GPUs that can all reach each other's memory (peer access);
// otherwise the group is staged through the host. A mesh spanning processes without NCCL stages every
// CUDA group through the host (the hub, and MPI for groups that span processes), including its groups
// that happen to lie within one process: one rule for the whole mesh, and no device pointers ever reach
// the MPI exchange (with NCCL, the MPI exchange only checks that the processes call the same collective).
MeshImpl::CommKind MeshImpl::comm_kind(const Group& g) {
  if (nccl_ && (g.size > 1 || nccl_single_gpu())) return CommKind::nccl;
  if (transport_ != nullptr || g.remote != nullptr) return CommKind::host_hub;
  const Device& first = devices_[static_cast<std::size_t>(g.members.front())];
  if (first.is_cpu()) return CommKind::host_hub;
  std::set<int> gpus;
  for (int m : g.members) {
    const Device& d = devices_[static_cast<std::size_t>(m)];
    if (d.is_cpu()) return CommKind::host_hub;
    gpus.insert(d.ordinal);
  }
  if (gpus.size() == 1 || cuda_enable_peer_access(std::vector<int>(gpus.begin(), gpus.end()))) {
    return CommKind::device_hub;
  }
  return CommKind::host_hub;
}

// Splits every device's NCCL communicators from its root, concurrently on the workers (the split is
// collective), each ending with a barrier; after all are released, the first device's own failure is rethrown
// (a device cancelled because of it only when there is none).
void MeshImpl::build_nccl_comms() {
  std::vector<std::exception_ptr> errors(devices_.size());
  std::vector<char> cancelled(devices_.size(), 0);  // each device writes its own (not vector<bool>: bits share bytes)
  workers_->run_all([&](int i) {
    const int d = local_[static_cast<std::size_t>(i)];
    try {
      rethrow_worker_bind_error();
      cuda_set_thread_stream(streams_[static_cast<std::size_t>(d)].get());
      for (auto& [k, ac] : comms_) {
        const auto du = static_cast<std::size_t>(d);
        if (ac.kind[du] != CommKind::nccl) continue;  // a thread-hub communicator
        const int color = ac.group_of[du];
        const Group& g = ac.groups[static_cast<std::size_t>(color)];
        const auto local_rank = std::find(g.members.begin(), g.members.end(), d) - g.members.begin();
        ac.comms[du] = nccl_->split(d, color, g.ranks[static_cast<std::size_t>(local_rank)], static_cast<int>(local_rank), g);
      }
      // Every split has completed on every rank (each ended with a barrier): the root, which no collective
      // uses, gives its NCCL resources back now rather than at the mesh's end (review L5).
      nccl_->release(d);
    } catch (Aborted&) {  // cancelled because another device failed: that failure is the one to raise
      errors[static_cast<std::size_t>(d)] = std::current_exception();
      cancelled[static_cast<std::size_t>(d)] = 1;
    } catch (Error& e) {
      errors[static_cast<std::size_t>(d)] = std::current_exception();
      hub_->abort(devices_[static_cast<std::size_t>(d)].str() + " could not set up NCCL: " + e.message());
    } catch (...) {
      errors[static_cast<std::size_t>(d)] = std::current_exception();
      hub_->abort(devices_[static_cast<std::size_t>(d)].str() + " could not set up NCCL");
    }
    cuda_set_thread_stream(nullptr);
  });
  for (int pass = 0; pass < 2; ++pass) {  // the first device's own failure, else the first cancellation
    for (std::size_t d = 0; d < errors.size(); ++d) {
      if (!errors[d] || (pass == 0 && cancelled[d])) continue;
      release_nccl_comms();
      std::rethrow_exception(errors[d]);
    }
  }
  hub_->reset();
}

// NCCL communicators are finalized collectively: every device's worker releases its own at once.
void MeshImpl::release_nccl_comms() noexcept {
  if (!nccl_ || !workers_) return;
  workers_->run_all([&](int i) {
    const int d = local_[static_cast<std::size_t>(i)];
    for (auto& [k, ac] : comms_) {
      const auto du = static_cast<std::size_t>(d);
      if (ac.kind[du] == CommKind::nccl) ac.comms[du].reset();
    }
    nccl_->release(d);
  });
  nccl_.reset();
}

const MeshImpl::AxisComms& MeshImpl::lookup(const AxisNames& axes) const { return comms_.at(tuple_key(axes)); }

MeshImpl::Endpoint MeshImpl::endpoint(int device, const AxisNames& axes) const {
  const AxisComms& ac = lookup(axes);
  const auto d = static_cast<std::size_t>(device);
  return Endpoint{ac.comms[d].get(), ac.kind[d] != CommKind::host_hub};
}

const Group& MeshImpl::group(int device, const AxisNames& axes) const {
  const AxisComms& ac = lookup(axes);
  return ac.groups[static_cast<std::size_t>(ac.group_of[static_cast<std::size_t>(device)])];
}

}  // namespace pmap::detail
