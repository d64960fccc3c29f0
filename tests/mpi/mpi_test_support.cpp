// Helpers of the multi-process test driver (see mpi_test_support.h).
#include "mpi_test_support.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float hard_value(int g, std::int64_t k) {
  const std::uint64_t h = splitmix((static_cast<std::uint64_t>(g) << 40) ^ static_cast<std::uint64_t>(k));
  const float mantissa = 1.0f + static_cast<float>(h & 0xffffff) / 16777216.0f;
  const int exponent = static_cast<int>((h >> 24) % 21) - 10;
  return std::ldexp((h >> 60) & 1 ? -mantissa : mantissa, exponent);
}

}  // namespace

pmap::Array hard_floats(int g, std::int64_t count) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) v[static_cast<std::size_t>(k)] = hard_value(g, k);
  return pmap::Array::from_host(v, {count});
}

void append_bits(std::vector<std::uint32_t>& out, const pmap::Array& a) {
  std::vector<std::uint32_t> words((a.nbytes() + 3) / 4);
  a.copy_to_host(words.data(), a.nbytes());
  out.insert(out.end(), words.begin(), words.end());
}

long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// shard by specs on a mesh (x = n / 2, y = 2) spanning the processes: a (n, 4) leaf split over both axes,
// each process keeping its devices' (2, 2) blocks; unshard refused where other processes hold blocks.
static int check_sharded_by_specs(const std::vector<pmap::Device>& devices, int rank, int processes) {
  const auto n = static_cast<int>(devices.size());
  pmap::Mesh mesh(devices, {{"x", n / 2}, {"y", 2}});
  std::vector<float> values(static_cast<std::size_t>(n * 4));
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = static_cast<float>(k);
  const auto sharded = pmap::shard(pmap::Array::from_host(values, {n, 4}), mesh, pmap::P("x", "y"));
  int bad = sharded.size() != static_cast<std::size_t>(mesh.local_size()) ? 1 : 0;
  for (int i = 0; i < mesh.local_size(); ++i) {
    const int g = mesh.local_devices()[static_cast<std::size_t>(i)].index;  // at (g / 2, g % 2)
    std::vector<float> want;
    for (int r = 2 * (g / 2); r < 2 * (g / 2) + 2; ++r)
      for (int c = 2 * (g % 2); c < 2 * (g % 2) + 2; ++c) want.push_back(static_cast<float>(r * 4 + c));
    bad += sharded[static_cast<std::size_t>(i)].to_vector<float>() != want;
  }
  bool refused = false;
  try {
    bad += pmap::unshard(sharded, mesh).to_vector<float>() != values;
  } catch (const pmap::ShapeError&) {
    refused = true;
  }
  bad += refused != (processes > 1);
  std::printf("rank %d: shard by P('x', 'y') over %s holds its devices' blocks%s: %s\n", rank, mesh.str().c_str(),
              refused ? ", unshard refused" : "", bad == 0 ? "ok" : "FAILED");
  return bad;
}

// shard_map on a mesh (x = n / 2, y = 2) spanning the processes: a (n, 4) input split over both axes, summed
// over "y" and gathered over "x" (replicated, so every process assembles it), bitwise the single-process run of
// n CPU devices; sharded()'s local blocks bitwise that run's blocks of the same devices; and an output that
// differs along "x" (across the processes) under an out spec that does not name it raises on every process.
static int check_shard_map(const std::vector<pmap::Device>& devices, int rank) {
  const auto n = static_cast<int>(devices.size());
  const pmap::Array x = hard_floats(0, n * 4).reshape({n, 4});
  auto summed = [](const pmap::Array& block) { return pmap::psum(block, "y"); };
  auto gathered = [](const pmap::Array& block) { return pmap::all_gather(pmap::psum(block, "y"), "x", 0, true); };
  pmap::Mesh mesh(devices, {{"x", n / 2}, {"y", 2}});
  pmap::Mesh reference(pmap::local_devices(pmap::DeviceKind::cpu, n), {{"x", n / 2}, {"y", 2}});
  const std::vector<pmap::TreeSpec> in{pmap::P("x", "y")};
  std::vector<std::uint32_t> got, want;
  append_bits(got, pmap::shard_map(gathered, mesh, in, pmap::P())(x));
  append_bits(want, pmap::shard_map(gathered, reference, in, pmap::P())(x));
  int bad = got != want;
  const auto mine = pmap::shard_map(summed, mesh, in, pmap::P("x")).sharded(x);
  const auto all = pmap::shard_map(summed, reference, in, pmap::P("x")).sharded(x);
  for (int i = 0; i < mesh.local_size(); ++i) {
    std::vector<std::uint32_t> a, b;
    append_bits(a, mine[static_cast<std::size_t>(i)]);
    append_bits(b, all[static_cast<std::size_t>(mesh.local_devices()[static_cast<std::size_t>(i)].index)]);
    bad += a != b;
  }
  std::string refused = "nothing raised";
  try {
    (void)pmap::shard_map(summed, mesh, in, pmap::P())(x);
    ++bad;
  } catch (const pmap::ValueError& e) {
    refused = e.what();
    bad += refused.find("does not name 'x'") == std::string::npos ||
           refused.find("compared by hash across the processes") == std::string::npos;
  }
  std::printf("rank %d: shard_map over %s: %zu result words and its blocks %s the %d-device single-process run; "
              "an unreduced 'x' refused: %s\n",
              rank, mesh.str().c_str(), got.size(), bad == 0 ? "bitwise equal to" : "DIFFER from", n,
              refused.c_str());
  // Faults that only some processes see: every process must raise (none may wait for the others).
  const bool one = rank == 1;
  auto expect = [&](const char* what, auto f, const char* here, const char* there) {
    std::string message = "nothing raised";
    try {
      (void)pmap::shard_map(f, mesh, in, pmap::P("x", "y"))(x);
    } catch (const pmap::Error& e) {
      message = e.what();
    }
    const bool ok = message.find(one ? here : there) != std::string::npos;
    bad += !ok;
    std::printf("rank %d: shard_map, %s: %s: %s\n", rank, what, ok ? "raised" : "WRONG", message.c_str());
  };
  auto short_here = [one](const pmap::Array& block) {  // rank 1's blocks are one row short
    return one ? block.slice_rows(0, 1, block.device()) : block.copy();
  };
  expect("rank 1's blocks short", short_here, "returned other leaves, dtypes or block shapes than cpu:0",
         "returned other leaves, dtypes or block shapes than cpu:0");
  auto ragged_here = [one](const pmap::Array& block) {  // rank 1's devices disagree with each other
    return one && pmap::axis_index("y") == 1 ? block.slice_rows(0, 1, block.device()) : block.copy();
  };
  expect("rank 1's blocks ragged", ragged_here, "every device's block of an output has one shape and dtype",
         "the outputs of process 1");
  auto rank_scalar = [](const pmap::Array& block) {
    return std::pair(block.copy(), pmap::distributed::process_index());
  };
  expect("a scalar that differs by process", rank_scalar, "output '1' (a scalar leaf", "output '1' (a scalar leaf");
  return bad;
}

int check_sharded(const std::vector<pmap::Device>& devices, int rank, int processes) {
  const auto n = static_cast<std::int64_t>(devices.size());
  pmap::Mesh mesh(devices, "i");
  std::vector<float> rows(static_cast<std::size_t>(n * 3));
  for (std::size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<float>(r);
  auto sharded = pmap::shard(pmap::Array::from_host(rows, {n * 3}), mesh);
  auto replicated = pmap::replicate(pmap::Array::scalar(10.0f), mesh);
  auto sums = pmap::pmap([](const pmap::Array& block, const pmap::Array& ten) {
    float s = 0;
    for (float v : block.to_vector<float>()) s += v;
    return pmap::psum(s, "i") + ten.item<float>();
  }, mesh)(sharded, replicated);
  int bad = sharded.size() != static_cast<std::size_t>(mesh.local_size()) ? 1 : 0;
  const float total = static_cast<float>(n * 3 * (n * 3 - 1) / 2);
  for (int i = 0; i < mesh.local_size(); ++i) {
    const int g = mesh.local_devices()[static_cast<std::size_t>(i)].index;
    bad += sharded[static_cast<std::size_t>(i)].to_vector<float>()[0] != static_cast<float>(g * 3);
    bad += sums[static_cast<std::size_t>(i)] != total + 10.0f;
  }
  bool unshard_refused = false;
  try {
    (void)pmap::unshard(sharded, mesh);
  } catch (const pmap::ShapeError&) {
    unshard_refused = true;
  }
  bad += unshard_refused != (processes > 1);
  std::printf("rank %d: shard/replicate/pmap over %s hold %zu local entries: %s\n", rank, mesh.str().c_str(),
              sharded.size(), bad == 0 ? "ok" : "FAILED");
  if (n % 2 == 0) bad += check_sharded_by_specs(devices, rank, processes) + check_shard_map(devices, rank);
  return bad;
}

int check_order_matters(int n, int local_n) {
  int differ = 0;
  for (std::int64_t k = 0; k < 1000; ++k) {
    float flat = hard_value(0, k);
    for (int g = 1; g < n; ++g) flat += hard_value(g, k);
    float total = 0;
    for (int p = 0; p < n / local_n; ++p) {
      float partial = hard_value(p * local_n, k);
      for (int i = 1; i < local_n; ++i) partial += hard_value(p * local_n + i, k);
      total = p == 0 ? partial : total + partial;
    }
    differ += std::memcmp(&flat, &total, sizeof flat) != 0;
  }
  std::printf("rank 0: a per-process partial sum would change %d of 1000 psum results\n", differ);
  return differ > 0 ? 0 : 1;
}
