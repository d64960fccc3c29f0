// Mesh and MeshImpl: topology, eager communicator setup (with a transport for groups that span
// processes), and pmap's run loop with failure handling.
#include "mesh_impl.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include <unistd.h>

#include <pmap/error.h>

#include "hash.h"
#include "processes.h"
#include "thread_communicator.h"

namespace pmap {

std::string AxisNames::str() const {
  if (names_.size() == 1) return "'" + names_[0] + "'";
  std::string s = "(";
  for (std::size_t i = 0; i < names_.size(); ++i) s += (i ? ", '" : "'") + names_[i] + "'";
  return s + ")";
}

namespace detail {
namespace {

thread_local DeviceContext tls_context;

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

DeviceContext& current_context(const char* what) {
  if (tls_context.mesh == nullptr)
    throw Error(std::string(what) + " can only be called inside a function run by pmap");
  return tls_context;
}

bool in_pmap() { return tls_context.mesh != nullptr; }

MeshImpl::MeshImpl(std::vector<Device> devices, std::vector<AxisSpec> axes, MeshOptions options)
    : devices_(std::move(devices)), axes_(std::move(axes)), options_(options) {
  if (axes_.empty()) throw AxisError("Mesh: at least one axis is needed");
  if (axes_.size() > 4) throw AxisError("Mesh: at most 4 axes are supported, got " + std::to_string(axes_.size()));
  std::set<std::string> seen;
  long long total = 1;
  for (const auto& a : axes_) {
    if (a.name.empty()) throw AxisError("Mesh: axis names must not be empty");
    if (!seen.insert(a.name).second) throw AxisError("Mesh: axis '" + a.name + "' appears twice");
    if (a.size < 1) throw ShapeError("Mesh: axis '" + a.name + "' has size " + std::to_string(a.size));
    total *= a.size;
  }
  if (total != static_cast<long long>(devices_.size()))
    throw ShapeError("Mesh: axis sizes multiply to " + std::to_string(total) + " but " +
                     std::to_string(devices_.size()) + " devices were given");
  std::set<std::pair<int, int>> ids;
  for (const auto& d : devices_)
    if (!ids.insert({static_cast<int>(d.kind), d.index}).second)
      throw ValueError("Mesh: device " + d.str() + " appears twice");
  if (options_.collective_timeout.count() <= 0) throw ValueError("Mesh: collective_timeout must be positive");
  if (options_.process_timeout.count() < 0) throw ValueError("Mesh: process_timeout must not be negative");
  const int me = process_index();
  for (int d = 0; d < size(); ++d) {
    if (devices_[static_cast<std::size_t>(d)].process != me) continue;
    local_.push_back(d);
    local_devices_.push_back(devices_[static_cast<std::size_t>(d)]);
  }
  if (local_.empty())
    throw ValueError("Mesh: none of its " + std::to_string(size()) + " devices belongs to this process (process " +
                     std::to_string(me) + ")");
  const bool spans_processes = local_.size() != devices_.size();
  const bool all_cuda = std::none_of(devices_.begin(), devices_.end(), [](const Device& d) { return d.is_cpu(); });
  // NCCL connects CUDA devices that each have a GPU of their own: within one process, or across
  // processes (a communicator over every process's devices, bootstrapped over MPI). Otherwise CUDA
  // collectives meet in the hub (see comm_kind).
  bool use_nccl = false;
  if (spans_processes && all_cuda) {
    const std::string clash = gpu_clash_across_processes(local_devices_);
    if (nccl_single_gpu() && (!nccl_available() || !clash.empty()))
      throw NotAvailable("Mesh: PMAPCC_NCCL_SINGLE_GPU=1 asks for NCCL across processes, but " +
                         (nccl_available() ? clash + ", and NCCL needs a GPU of its own for every device"
                                           : std::string("this pmapcc was built without NCCL")) +
                         "; unset PMAPCC_NCCL_SINGLE_GPU to stage the collectives through the host");
    use_nccl = nccl_available() && clash.empty();
  } else if (!spans_processes) {
    use_nccl = one_gpu_per_device(devices_) && nccl_available();
  }
  if (spans_processes) transport_ = make_mesh_transport(devices_, axes_, options_);
  std::vector<std::string> names;
  std::vector<bool> local;
  for (const auto& d : devices_) {
    names.push_back(d.str());
    local.push_back(d.process == me);
  }
  hub_ = std::make_unique<ThreadHub>(names, local, options_.collective_timeout);
  streams_.reserve(devices_.size());
  for (const auto& d : devices_) streams_.emplace_back(!d.is_cpu() && d.process == me, d.ordinal);
  if (use_nccl) {
    std::vector<int> ordinals;
    for (const auto& d : local_devices_) ordinals.push_back(d.ordinal);
    nccl_ = make_nccl_clique(local_, ordinals, size(), spans_processes, *hub_, options_.collective_timeout,
                             spans_processes ? process_timeout(options_.process_timeout) : options_.collective_timeout);
  }
  build_comms();
  workers_ = std::make_unique<WorkerPool>(local_devices_, options_.pin_threads);
  if (nccl_) build_nccl_comms();
}

MeshImpl::~MeshImpl() {
  release_nccl_comms();
  workers_.reset();
}

std::vector<int> MeshImpl::coords(int device) const {
  std::vector<int> c(axes_.size());
  for (int a = static_cast<int>(axes_.size()) - 1; a >= 0; --a) {
    c[static_cast<std::size_t>(a)] = device % axes_[static_cast<std::size_t>(a)].size;
    device /= axes_[static_cast<std::size_t>(a)].size;
  }
  return c;
}

std::string MeshImpl::scope_str() const {
  std::string s;
  for (const auto& a : axes_) s += (s.empty() ? "'" : ", '") + a.name + "'";
  return s;
}

std::vector<int> MeshImpl::resolve(const AxisNames& axes) const {
  std::vector<int> ids;
  if (axes.empty()) {
    for (std::size_t i = 0; i < axes_.size(); ++i) ids.push_back(static_cast<int>(i));
    return ids;
  }
  for (const auto& n : axes.names()) {
    auto it = std::find_if(axes_.begin(), axes_.end(), [&](const AxisSpec& a) { return a.name == n; });
    if (it == axes_.end()) throw AxisError("unknown axis name '" + n + "'; axes in scope: " + scope_str());
    int id = static_cast<int>(it - axes_.begin());
    if (std::find(ids.begin(), ids.end(), id) != ids.end())
      throw AxisError("axis '" + n + "' is named twice in " + axes.str());
    ids.push_back(id);
  }
  return ids;
}

int MeshImpl::axis_size(const AxisNames& axes) const {
  int n = 1;
  for (int id : resolve(axes)) n *= axes_[static_cast<std::size_t>(id)].size;
  return n;
}

int MeshImpl::axis_index(int device, const AxisNames& axes) const {
  auto c = coords(device);
  int idx = 0;
  for (int id : resolve(axes)) idx = idx * axes_[static_cast<std::size_t>(id)].size + c[static_cast<std::size_t>(id)];
  return idx;
}

std::uint64_t MeshImpl::tuple_key(const std::vector<int>& axis_ids) const {
  std::uint64_t key = 0;
  for (int id : axis_ids) key = key * (axes_.size() + 1) + static_cast<std::uint64_t>(id) + 1;
  return key;
}

std::uint64_t MeshImpl::tuple_key(const AxisNames& axes) const {
  const std::uint64_t base = axes_.size() + 1;
  std::uint64_t key = 0;
  if (axes.empty()) {
    for (std::size_t i = 0; i < axes_.size(); ++i) key = key * base + i + 1;
    return key;
  }
  std::uint64_t seen = 0;  // a bit per axis id (a mesh has far fewer than 64 axes: see the constructor)
  for (const auto& n : axes.names()) {
    auto it = std::find_if(axes_.begin(), axes_.end(), [&](const AxisSpec& a) { return a.name == n; });
    if (it == axes_.end()) throw AxisError("unknown axis name '" + n + "'; axes in scope: " + scope_str());
    const auto id = static_cast<std::uint64_t>(it - axes_.begin());
    if ((seen >> id & 1u) != 0) throw AxisError("axis '" + n + "' is named twice in " + axes.str());
    seen |= std::uint64_t{1} << id;
    key = key * base + id + 1;
  }
  return key;
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
// collective), each ending with a barrier; the first failure is rethrown after all are released.
void MeshImpl::build_nccl_comms() {
  std::vector<std::exception_ptr> errors(devices_.size());
  workers_->run_all([&](int i) {
    const int d = local_[static_cast<std::size_t>(i)];
    cuda_set_thread_stream(streams_[static_cast<std::size_t>(d)].get());
    try {
      for (auto& [k, ac] : comms_) {
        const auto du = static_cast<std::size_t>(d);
        if (ac.kind[du] != CommKind::nccl) continue;  // a thread-hub communicator
        const int color = ac.group_of[du];
        const Group& g = ac.groups[static_cast<std::size_t>(color)];
        const auto local_rank = std::find(g.members.begin(), g.members.end(), d) - g.members.begin();
        ac.comms[du] = nccl_->split(d, color, g.ranks[static_cast<std::size_t>(local_rank)], static_cast<int>(local_rank), g);
      }
    } catch (Error& e) {
      errors[static_cast<std::size_t>(d)] = std::current_exception();
      hub_->abort(devices_[static_cast<std::size_t>(d)].str() + " could not set up NCCL: " + e.message());
    } catch (...) {
      errors[static_cast<std::size_t>(d)] = std::current_exception();
      hub_->abort(devices_[static_cast<std::size_t>(d)].str() + " could not set up NCCL");
    }
    cuda_set_thread_stream(nullptr);
  });
  for (const auto& e : errors) {
    if (!e) continue;
    release_nccl_comms();
    std::rethrow_exception(e);
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

void MeshImpl::report_failure(const std::string& what) {
  hub_->abort(what);
  if (transport_) transport_->report_failure(what);
}

void MeshImpl::run(const std::function<void(int)>& fn) {
  if (in_pmap() || workers_->on_worker_thread())
    throw Error("pmap called inside a pmapped function: nested pmap is not supported (use a 2-D mesh)");
  std::lock_guard run_lock(run_mu_);  // one pmap at a time per mesh
  struct Failure {
    std::exception_ptr error;
    std::uint64_t order = std::numeric_limits<std::uint64_t>::max();
    bool aborted = false;
  };
  std::vector<Failure> failures(local_.size());
  std::atomic<std::uint64_t> clock{0};
  if (transport_) transport_->begin_call();
  hub_->reset();
  workers_->run_all([&](int i) {
    const int d = local_[static_cast<std::size_t>(i)];
    tls_context = DeviceContext{this, d};
    const std::string dev = devices_[static_cast<std::size_t>(d)].str();
    Failure& f = failures[static_cast<std::size_t>(i)];
    const StreamHandle stream = streams_[static_cast<std::size_t>(d)].get();
    cuda_set_thread_stream(stream);  // CUDA devices: every op of fn goes to the device's stream
    try {
      fn(i);
      if (stream != nullptr) cuda_sync_current_stream();  // pmap returns when the device's work is done
    } catch (Aborted& e) {
      e.set_device(dev);
      f = {std::current_exception(), clock++, true};
    } catch (Error& e) {
      e.set_device(dev);
      f = {std::current_exception(), clock++, false};
      report_failure(dev + " raised: " + e.message());
    } catch (const std::exception& e) {
      DeviceError err(e.what());
      err.set_device(dev);
      f = {std::make_exception_ptr(err), clock++, false};
      report_failure(dev + " raised: " + e.what());
    } catch (...) {
      DeviceError err("an exception that is not a std::exception");
      err.set_device(dev);
      f = {std::make_exception_ptr(err), clock++, false};
      report_failure(dev + " raised " + err.message());
    }
    hub_->finished(d, static_cast<bool>(f.error));
    cuda_set_thread_stream(nullptr);
    tls_context = DeviceContext{};
  });
  const Failure* first = nullptr;
  for (const auto& f : failures) {
    if (!f.error) continue;
    if (first == nullptr || (first->aborted && !f.aborted) || (first->aborted == f.aborted && f.order < first->order))
      first = &f;
  }
  if (first != nullptr) std::rethrow_exception(first->error);
}

}  // namespace detail

Mesh::Mesh(std::vector<Device> devices, std::vector<AxisSpec> axes, MeshOptions options)
    : impl_(std::make_unique<detail::MeshImpl>(std::move(devices), std::move(axes), options)) {}

Mesh::Mesh(std::vector<Device> devices, std::string axis_name, MeshOptions options)
    : Mesh(devices, {AxisSpec{std::move(axis_name), static_cast<int>(devices.size())}}, options) {}

Mesh::Mesh(Mesh&&) noexcept = default;
Mesh& Mesh::operator=(Mesh&&) noexcept = default;
Mesh::~Mesh() = default;

int Mesh::size() const { return impl_->size(); }
const std::vector<Device>& Mesh::devices() const { return impl_->devices(); }
const std::vector<Device>& Mesh::local_devices() const { return impl_->local_devices(); }
int Mesh::local_size() const { return static_cast<int>(impl_->local_devices().size()); }
const std::vector<AxisSpec>& Mesh::axes() const { return impl_->axes(); }
int Mesh::axis_size(const AxisNames& axes) const { return impl_->axis_size(axes); }
std::vector<int> Mesh::coords(int device) const { return impl_->coords(device); }
const MeshOptions& Mesh::options() const { return impl_->options(); }

std::string Mesh::str() const {
  std::string s = "Mesh(";
  for (std::size_t i = 0; i < axes().size(); ++i)
    s += (i ? ", " : "") + axes()[i].name + "=" + std::to_string(axes()[i].size);
  return s + "; " + devices().front().str() + ".." + devices().back().str() + ")";
}

}  // namespace pmap
