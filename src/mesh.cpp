// Mesh and MeshImpl: construction (devices, streams, communicators and workers, built eagerly so setup
// failures show at once), and pmap's run loop with failure handling. The topology is src/topology.cpp;
// the communicator plan src/comm_plan.cpp.
#include "mesh_impl.h"

#include <atomic>
#include <exception>
#include <limits>

#include <pmap/error.h>

#include "processes.h"

namespace pmap::detail {
namespace {

thread_local DeviceContext tls_context;

}  // namespace

DeviceContext& current_context(const char* what) {
  if (tls_context.mesh == nullptr)
    throw Error(std::string(what) + " can only be called inside a function run by pmap");
  return tls_context;
}

bool in_pmap() { return tls_context.mesh != nullptr; }

MeshImpl::MeshImpl(std::vector<Device> devices, std::vector<AxisSpec> axes, MeshOptions options)
    : devices_(std::move(devices)), axes_(std::move(axes)), options_(options) {
  validate();
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
  const bool use_nccl = plan_nccl(spans_processes);
  if (spans_processes) transport_ = make_mesh_transport(devices_, axes_, options_);
  std::vector<bool> local;
  for (const auto& d : devices_) {
    device_names_.push_back(d.str());
    local.push_back(d.process == me);
  }
  hub_ = std::make_unique<ThreadHub>(device_names_, local, options_.collective_timeout);
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

void MeshImpl::report_failure(const std::string& what) {
  hub_->abort(what);
  if (transport_) transport_->report_failure(what);
}

void MeshImpl::run(TaskRef fn) {
  if (in_pmap() || workers_->on_worker_thread())
    throw Error("pmap called inside a pmapped function: nested pmap is not supported (use a 2-D mesh)");
  std::lock_guard run_lock(run_mu_);  // one pmap at a time per mesh
  std::vector<Failure>& failures = failures_;
  failures.assign(local_.size(), Failure{});
  std::atomic<std::uint64_t> clock{0};
  if (transport_) transport_->begin_call();
  hub_->reset();
  workers_->run_all([&](int i) {
    const int d = local_[static_cast<std::size_t>(i)];
    tls_context = DeviceContext{this, d};
    const std::string& dev = device_names_[static_cast<std::size_t>(d)];
    Failure& f = failures[static_cast<std::size_t>(i)];
    const StreamHandle stream = streams_[static_cast<std::size_t>(d)].get();
    try {
      rethrow_worker_bind_error();
      cuda_set_thread_stream(stream);  // CUDA devices: every op of fn goes to the device's stream
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
    // A failed call still waits for the work it queued: the caller may free or read its arrays next.
    if (f.error && stream != nullptr) cuda_drain_current_stream();
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

}  // namespace pmap::detail

namespace pmap {

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
