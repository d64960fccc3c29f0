// Mesh: devices arranged along named axes, 1-D ({"ensemble": 8}) or n-D ({"data": 2, "model": 4}),
// row-major (the last axis varies fastest). A Mesh owns one worker thread per local device and creates
// the communicators for every axis and tuple of axes eagerly, so setup failures show at construction.
// A mesh over distributed::global_devices() spans processes (see distributed.h): every process must
// build it, in the same order relative to its other multi-process meshes.
#pragma once

#include <chrono>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <pmap/device.h>

namespace pmap {

struct AxisSpec {
  std::string name;
  int size = 0;
};

struct MeshOptions {
  // How long a device waits in a collective for the others before raising Timeout.
  std::chrono::milliseconds collective_timeout = std::chrono::minutes(5);
  // Pin worker thread i to core i % cores (CPU devices only; a no-op where unsupported).
  bool pin_threads = false;
  // Meshes spanning processes: how long a collective waits for the other processes before declaring
  // the missing ones lost (Timeout). Zero: PMAPCC_MPI_TIMEOUT (seconds) from the environment, else 8 s.
  // The k-th collective of a call waits (4 - min(k - 1, 4)) * min(timeout / 40, 50 ms) less (so that in
  // a chain of waits the process at its head times out first and its report names the cause).
  std::chrono::milliseconds process_timeout{0};
};

// One axis name or a tuple of them ("data", {"data", "model"}). Empty means "every axis of the mesh".
class AxisNames {
 public:
  AxisNames() = default;
  AxisNames(const char* name) : names_{name} {}  // NOLINT: implicit on purpose, like JAX's axis_name
  AxisNames(std::string name) : names_{std::move(name)} {}  // NOLINT
  AxisNames(std::initializer_list<std::string> names) : names_(names) {}
  explicit AxisNames(std::vector<std::string> names) : names_(std::move(names)) {}
  const std::vector<std::string>& names() const { return names_; }
  bool empty() const { return names_.empty(); }
  std::string str() const;  // "'data'" or "('data', 'model')"
  friend bool operator==(const AxisNames&, const AxisNames&) = default;

 private:
  std::vector<std::string> names_;
};

namespace detail {
class MeshImpl;
}

class Mesh {
 public:
  // devices.size() must equal the product of the axis sizes; names must be unique and non-empty.
  Mesh(std::vector<Device> devices, std::vector<AxisSpec> axes, MeshOptions options = {});
  // A 1-D mesh over all `devices` along one axis.
  Mesh(std::vector<Device> devices, std::string axis_name, MeshOptions options = {});
  Mesh(Mesh&&) noexcept;
  Mesh& operator=(Mesh&&) noexcept;
  ~Mesh();  // stops and joins every worker thread

  int size() const;  // number of devices, over every process
  const std::vector<Device>& devices() const;
  // The devices this process runs, in mesh order: all of them unless the mesh spans processes.
  // Sharded arguments and pmap results hold one entry per local device, in this order.
  const std::vector<Device>& local_devices() const;
  int local_size() const;
  const std::vector<AxisSpec>& axes() const;
  int axis_size(const AxisNames& axes) const;  // product of the named axes' sizes; AxisError if unknown
  std::vector<int> coords(int device) const;   // the device's index along each axis
  const MeshOptions& options() const;
  std::string str() const;  // "Mesh(data=2, model=4; cpu:0..cpu:7)"

  detail::MeshImpl& impl() const { return *impl_; }

 private:
  std::unique_ptr<detail::MeshImpl> impl_;
};

}  // namespace pmap
