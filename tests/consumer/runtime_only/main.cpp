// The runtime alone through <pmap/pmap.h>, which pulls in the whole public API (random keys included):
// member i of split(key(0), 2) on device i, summed over 2 CPU devices, equals the host's sum.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <exception>

#include <pmap/pmap.h>

int main() {
  try {
    pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "i");
    const auto keys = pmap::split(pmap::key(0), 2);
    auto sums = pmap::pmap([&] {
      const pmap::Key k = keys[static_cast<std::size_t>(pmap::axis_index("i"))];
      return pmap::psum(static_cast<std::int64_t>(k.k1), "i");
    }, mesh)();
    const std::int64_t want = std::int64_t{keys[0].k1} + std::int64_t{keys[1].k1};
    if (sums.size() != 2 || sums[0] != want || sums[1] != want) {
      std::printf("runtime consumer: FAILED (got %" PRId64 " and %" PRId64 ", want %" PRId64 ")\n", sums[0], sums[1], want);
      return 1;
    }
    std::printf("runtime consumer: ok (psum over 2 CPU devices = %" PRId64 ")\n", want);
    return 0;
  } catch (const std::exception& e) {
    std::printf("runtime consumer: FAILED: %s\n", e.what());
    return 1;
  }
}
