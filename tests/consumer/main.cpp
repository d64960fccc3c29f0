// A program outside the pmapcc tree, built against an installed pmapcc through find_package(pmapcc CONFIG):
// psum over 2 CPU devices (device r contributes r + 1, so every element must be 3), computed on with
// pmap::ops (the sum of the psum's 1000 threes is 3000). Exits non-zero if not.
#include <cstdio>
#include <exception>
#include <vector>

#include <pmapcc/io/idx.h>
#include <pmapcc/core/ops.h>
#include <pmap/pmap.h>

int main() {
  try {
    const pmap::BuildInfo info = pmap::build_info();
    std::printf("consumer: pmapcc built with cuda=%d nccl=%d mpi=%d\n", info.cuda, info.nccl, info.mpi);
    pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "i");
    auto sums = pmap::pmap([] {
      std::vector<float> mine(1000, static_cast<float>(pmap::axis_index("i") + 1));  // (1000,)
      return pmap::psum(pmap::Array::from_host(mine, {1000}), "i").to_vector<float>();
    }, mesh, "i")();
    auto totals = pmap::pmap([] {
      pmap::Array threes = pmap::psum(pmap::Array::from_host(std::vector<float>(1000, 1.5f), {1000}), "i");
      return pmap::ops::sum(threes).item<float>();
    }, mesh, "i")();
    int wrong = 0;
    for (const auto& device_sum : sums)
      for (float v : device_sum) wrong += v != 3.0f;
    // The formats library (and its zlib dependency) links too: a missing file is a DataError.
    bool data_error = false;
    try {
      pmap::io::read_idx("/nonexistent/pmapcc-consumer.idx", 1);
    } catch (const pmap::DataError&) {
      data_error = true;
    }
    if (wrong != 0 || sums.size() != 2 || !data_error || totals[0] != 3000.0f || totals[1] != 3000.0f) {
      std::printf("consumer: FAILED (%d wrong elements, %zu devices, DataError raised: %d, ops::sum %g)\n", wrong,
                  sums.size(), data_error, static_cast<double>(totals[0]));
      return 1;
    }
    std::printf("consumer: psum over 2 CPU devices = 3 on every element, ops::sum 3000: ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("consumer: FAILED with exception: %s\n", e.what());
    return 1;
  }
}
