// Device naming and discovery of local CPU and CUDA devices.
#include <pmap/device.h>
#include <pmap/error.h>

#include <charconv>
#include <cstdlib>
#include <ostream>
#include <thread>

#include "availability.h"
#include "processes.h"

namespace pmap {

std::string Device::str() const {
  std::string s = std::string(to_string(kind)) + ":" + std::to_string(index);
  if (kind == DeviceKind::cuda && ordinal != index) s += "(gpu" + std::to_string(ordinal) + ")";
  return s;
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

std::string_view to_string(DeviceKind kind) { return kind == DeviceKind::cpu ? "cpu" : "cuda"; }

DeviceKind parse_device_kind(std::string_view text) {
  if (text == "cpu") return DeviceKind::cpu;
  if (text == "cuda") return DeviceKind::cuda;
  throw ValueError("unknown device kind '" + std::string(text) + "' (expected cpu or cuda)");
}

int default_cpu_device_count() {
  if (const char* env = std::getenv("PMAPCC_CPU_DEVICES"); env != nullptr && *env != '\0') {
    std::string_view s(env);
    int n = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (ec != std::errc{} || end != s.data() + s.size() || n < 1 || n > 4096)
      throw ValueError("PMAPCC_CPU_DEVICES='" + std::string(s) + "' is not a device count in 1..4096");
    return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

std::vector<Device> local_devices(DeviceKind kind, int n) {
  if (n == 0) throw ValueError("local_devices: asked for 0 " + std::string(to_string(kind)) + " devices");
  std::vector<Device> out;
  const int process = detail::process_index();
  if (kind == DeviceKind::cpu) {
    if (n < 0) n = default_cpu_device_count();
    for (int i = 0; i < n; ++i) out.push_back(Device{DeviceKind::cpu, i, i, process});
    return out;
  }
  const detail::GpuProbe& probe = detail::cuda_probe();
  if (!probe.problem.empty()) throw CudaError("CUDA devices requested, but " + probe.problem);
  const int gpus = probe.count;
  if (gpus == 0)
    throw NotAvailable(PMAPCC_HAVE_CUDA ? "no GPU is usable here: CUDA found no device and no NVIDIA driver is loaded"
                                        : "no GPU is usable here: this pmapcc was built without CUDA");
  if (n < 0) n = gpus;
  for (int i = 0; i < n; ++i) out.push_back(Device{DeviceKind::cuda, i, i % gpus, process});
  return out;
}

}  // namespace pmap
