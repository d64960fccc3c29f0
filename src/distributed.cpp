// pmap::distributed: the public face of multi-process meshes; the work is in the backend seam
// (processes.h), so this builds with or without MPI.
#include <pmap/distributed.h>
#include <pmap/error.h>
#include <pmap/pmap.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "processes.h"

namespace pmap::detail {

std::chrono::milliseconds process_timeout(std::chrono::milliseconds configured) {
  if (configured.count() > 0) return configured;
  const char* env = std::getenv("PMAPCC_MPI_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::seconds(8);  // a silent loss ends the job within 10 s
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(seconds > 0) || seconds > 1e6)
    throw ValueError("PMAPCC_MPI_TIMEOUT='" + std::string(env) + "' is not a number of seconds in (0, 1e6]");
  return std::chrono::milliseconds(std::max(1LL, std::llround(seconds * 1000)));
}

}  // namespace pmap::detail

namespace pmap::distributed {

void initialize() { detail::initialize_processes(); }
void shutdown() { detail::shutdown_processes(); }
int process_index() { return detail::process_index(); }
int process_count() { return detail::process_count(); }

std::vector<Device> global_devices(DeviceKind kind, int local_n) {
  std::vector<Device> local = local_devices(kind, local_n);
  const int processes = process_count();
  if (processes == 1) return local;
  // Each process sends [count, ordinal_0, ordinal_1, ...].
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(local.size())};
  for (const Device& d : local) mine.push_back(d.ordinal);
  const auto all = detail::gather_from_processes(mine, "global_devices(" + std::string(to_string(kind)) + ")");
  bool equal = true;
  for (const auto& v : all) equal = equal && v.at(0) == all[0].at(0);
  if (!equal) {
    std::string msg = "global_devices: every process must have the same number of local " +
                      std::string(to_string(kind)) + " devices, but";
    for (std::size_t p = 0; p < all.size(); ++p)
      msg += (p ? ", " : " ") + std::string("process ") + std::to_string(p) + " has " + std::to_string(all[p][0]);
    throw ValueError(msg);
  }
  const int per = static_cast<int>(all[0][0]);
  std::vector<Device> out;
  for (int p = 0; p < processes; ++p)
    for (int i = 0; i < per; ++i) {
      const int index = p * per + i;
      const auto& theirs = all[static_cast<std::size_t>(p)];
      const int ordinal = kind == DeviceKind::cpu ? index : static_cast<int>(theirs[static_cast<std::size_t>(i) + 1]);
      out.push_back(Device{kind, index, ordinal, p});
    }
  return out;
}

namespace {

template <Element T>
std::vector<T> allgather(const Mesh& mesh, const std::vector<std::vector<T>>& mine) {
  const auto& local = mesh.local_devices();
  if (mine.size() != local.size())
    throw ShapeError("process_allgather: " + std::to_string(mine.size()) + " vectors for the " +
                     std::to_string(local.size()) + " local devices of the mesh");
  std::vector<Array> arrays;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].size() != mine[0].size())
      throw ShapeError("process_allgather: the vector of " + local[i].str() + " has " +
                       std::to_string(mine[i].size()) + " elements, that of " + local[0].str() + " " +
                       std::to_string(mine[0].size()));
    arrays.push_back(Array::from_host(mine[i], Shape{static_cast<std::int64_t>(mine[i].size())}, local[i]));
  }
  auto gathered = pmap::pmap([](const Array& a) { return all_gather(a, AxisNames{}, /*tiled=*/true).to_vector<T>(); },
                             mesh)(Sharded<Array>(std::move(arrays)));
  return std::move(gathered[0]);
}

}  // namespace

std::vector<float> process_allgather(const Mesh& mesh, const std::vector<std::vector<float>>& mine) {
  return allgather(mesh, mine);
}

std::vector<std::int64_t> process_allgather(const Mesh& mesh, const std::vector<std::vector<std::int64_t>>& mine) {
  return allgather(mesh, mine);
}

}  // namespace pmap::distributed
