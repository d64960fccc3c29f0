// Devices: a CPU device (one worker thread) or a CUDA device (a GPU, or a virtual slice of one).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace pmap {

enum class DeviceKind : std::uint8_t { cpu, cuda };

// One logical device. Several logical CUDA devices may share one physical GPU ("virtual devices"):
// `index` is the logical index among the devices of that kind (this process's from local_devices,
// the whole job's from distributed::global_devices), `ordinal` the GPU on the owning host.
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  int ordinal = 0;  // CUDA: physical GPU; CPU: equal to index
  int process = 0;  // the process that owns and runs it (distributed::process_index())

  // "cpu:3", "cuda:0"; a virtual CUDA device on a shared GPU prints as "cuda:5(gpu1)".
  std::string str() const;
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  friend bool operator==(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& os, const Device& d);

// "cpu" / "cuda" <-> DeviceKind; parse_device_kind throws ValueError for anything else.
std::string_view to_string(DeviceKind kind);
DeviceKind parse_device_kind(std::string_view text);

// The devices of one kind this process can use (owned by this process).
// - cpu: `n` devices; n < 0 takes PMAPCC_CPU_DEVICES from the environment, else the core count.
// - cuda: n < 0 gives one device per GPU; n > GPU count gives virtual devices, spread round-robin
//   (logical device i on GPU i % gpus). Throws NotAvailable when there is no GPU (or no CUDA in this
//   build), and CudaError, with the CUDA runtime's message, when a GPU is present but cannot be used.
// n == 0, or a malformed PMAPCC_CPU_DEVICES, throws ValueError naming the value.
std::vector<Device> local_devices(DeviceKind kind, int n = -1);

// The default CPU device count (PMAPCC_CPU_DEVICES, else std::thread::hardware_concurrency()).
int default_cpu_device_count();

}  // namespace pmap
