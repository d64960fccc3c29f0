// Tests of Devices, Arrays and trees (pytrees in C++).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <tuple>

#include <pmap/pmap.h>
#if defined(__linux__)
#include <cerrno>

#include <sys/mman.h>
#endif
#include <pmap/detail/allocation.h>

#include "src/host_cache.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

struct State {
  pmap::Array params;
  std::vector<pmap::Array> layers;
  std::int64_t step = 0;
};
PMAPCC_TREE(State, params, layers, step)

pmap::Array iota(std::int64_t n, pmap::Device d = {}) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(i);
  return pmap::Array::from_host(v, {n}, d);
}

}  // namespace

TEST_CASE("devices print and parse") {
  auto devs = pmap::local_devices(pmap::DeviceKind::cpu, 3);
  REQUIRE(devs.size() == 3);
  CHECK(devs[2].str() == "cpu:2");
  CHECK(pmap::parse_device_kind("cuda") == pmap::DeviceKind::cuda);
  CHECK_THROWS_AS(pmap::parse_device_kind("tpu"), pmap::ValueError);
  CHECK_THROWS_AS(pmap::local_devices(pmap::DeviceKind::cpu, 0), pmap::ValueError);
  CHECK(pmap::Device{pmap::DeviceKind::cuda, 5, 1}.str() == "cuda:5(gpu1)");
}

TEST_CASE("PMAPCC_CPU_DEVICES sets the default CPU device count and is validated") {
  const char* old = std::getenv("PMAPCC_CPU_DEVICES");
  std::string saved = old ? old : "";
  setenv("PMAPCC_CPU_DEVICES", "5", 1);
  CHECK(pmap::local_devices(pmap::DeviceKind::cpu).size() == 5);
  setenv("PMAPCC_CPU_DEVICES", "five", 1);
  CHECK_THROWS_WITH_AS(pmap::local_devices(pmap::DeviceKind::cpu), doctest::Contains("PMAPCC_CPU_DEVICES='five'"),
                       pmap::ValueError);
  setenv("PMAPCC_CPU_DEVICES", "0", 1);
  CHECK_THROWS_AS(pmap::default_cpu_device_count(), pmap::ValueError);
  if (old) setenv("PMAPCC_CPU_DEVICES", saved.c_str(), 1);
  else unsetenv("PMAPCC_CPU_DEVICES");
}

TEST_CASE("CUDA devices without a GPU are NotAvailable, never a crash") {
  if (pmap::cuda_device_count() > 0) return;
  CHECK_THROWS_AS(pmap::local_devices(pmap::DeviceKind::cuda), pmap::NotAvailable);
}

TEST_CASE("Array basics: shape, dtype, copies, reshape, slices") {
  pmap::Array a({2, 3}, pmap::DType::i32);
  CHECK(a.size() == 6);
  CHECK(a.nbytes() == 24);
  CHECK(a.dim(-1) == 3);
  CHECK(a.to_vector<std::int32_t>() == std::vector<std::int32_t>(6, 0));  // zero-filled
  CHECK_THROWS_AS(a.data<float>(), pmap::ShapeError);
  CHECK_THROWS_AS(pmap::Array({-1}, pmap::DType::f32), pmap::ShapeError);

  pmap::Array b = iota(12);
  pmap::Array c = b.copy();
  c.data<float>()[0] = 42;
  CHECK(b.data<float>()[0] == 0);  // copies are deep
  pmap::Array r = std::move(c).reshape({3, 4});
  CHECK(r.shape() == pmap::Shape{3, 4});
  CHECK_FALSE(c.valid());  // NOLINT: moved-from is empty by contract
  CHECK_THROWS_AS(std::move(r).reshape({5}), pmap::ShapeError);

  pmap::Array m = std::move(b).reshape({4, 3});
  pmap::Array rows = m.slice_rows(1, 3, pmap::Device{});
  CHECK(rows.shape() == pmap::Shape{2, 3});
  CHECK(rows.to_vector<float>() == std::vector<float>{3, 4, 5, 6, 7, 8});
  CHECK_THROWS_AS(m.slice_rows(2, 5, pmap::Device{}), pmap::ShapeError);

  auto s = pmap::Array::scalar(2.5);
  CHECK(s.ndim() == 0);
  CHECK(s.item<double>() == 2.5);
  CHECK_THROWS_AS(rows.item<float>(), pmap::ShapeError);
  std::vector<float> wrong(5);
  CHECK_THROWS_AS(rows.copy_from_host(wrong.data(), wrong.size() * 4), pmap::ShapeError);
}

TEST_CASE("Array::borrow: a view of the caller's memory that frees nothing, also after a move") {
  std::vector<float> memory{1, 2, 3, 4, 5, 6};
  {
    pmap::Array view = pmap::Array::borrow(memory.data(), {2, 3}, pmap::DType::f32);
    CHECK_FALSE(view.owns_data());
    CHECK(view.raw_data() == memory.data());
    CHECK(view.to_vector<float>() == memory);
    view.data<float>()[4] = 50;  // writes reach the caller's memory
    CHECK(memory[4] == 50);
    pmap::Array moved = std::move(view);  // the view moves, still not owning
    CHECK_FALSE(moved.owns_data());
    CHECK(moved.data<float>() == memory.data());
    pmap::Array copy = moved.copy();  // a copy owns its memory
    CHECK(copy.owns_data());
    CHECK(copy.data<float>() != memory.data());
    moved = iota(2);  // assigning over a view frees nothing of the caller's (ASan would see a bad free)
    CHECK(moved.owns_data());
  }
  CHECK(memory == std::vector<float>{1, 2, 3, 4, 50, 6});  // the views are gone, the memory is whole
  CHECK_THROWS_AS(pmap::Array::borrow(nullptr, {2}, pmap::DType::f32), pmap::ValueError);
  CHECK_THROWS_AS(pmap::Array::borrow(memory.data(), {-1}, pmap::DType::f32), pmap::ShapeError);
  CHECK(pmap::Array::borrow(nullptr, {0}, pmap::DType::f32).valid());  // no elements: no memory needed
}

TEST_CASE("concatenate and stack") {
  pmap::Array a = iota(4), b = iota(4);
  auto cat = pmap::concatenate({&a, &b}, pmap::Device{});
  CHECK(cat.shape() == pmap::Shape{8});
  auto st = pmap::concatenate({&a, &b}, pmap::Device{}, true);
  CHECK(st.shape() == pmap::Shape{2, 4});
  CHECK(st.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 0, 1, 2, 3});
  pmap::Array c({4}, pmap::DType::i32);
  CHECK_THROWS_AS(pmap::concatenate({&a, &c}, pmap::Device{}), pmap::ShapeError);
}

TEST_CASE("trees: containers, structs, paths, map") {
  State s;
  s.params = iota(3);
  s.layers.push_back(iota(2));
  s.layers.push_back(iota(1));
  s.step = 7;
  std::vector<std::string> paths;
  pmap::tree_for_each_with_path(s, [&](const std::string& p, const auto&) { paths.push_back(p); });
  CHECK(paths == std::vector<std::string>{"params", "layers/0", "layers/1", "step"});
  CHECK(pmap::tree_num_leaves(s) == 4);

  State doubled = pmap::tree_map(s, [](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, pmap::Array>) {
      pmap::Array out = leaf.copy();
      for (std::int64_t i = 0; i < out.size(); ++i) out.data<float>()[i] *= 2;
      return out;
    } else {
      return leaf * 2;
    }
  });
  CHECK(doubled.params.to_vector<float>() == std::vector<float>{0, 2, 4});
  CHECK(doubled.layers[0].to_vector<float>() == std::vector<float>{0, 2});
  CHECK(doubled.step == 14);

  std::map<std::string, std::tuple<pmap::Array, float>> m;
  m.emplace("b", std::make_tuple(iota(1), 1.5f));
  m.emplace("a", std::make_tuple(iota(2), 2.5f));
  paths.clear();
  pmap::tree_for_each_with_path(m, [&](const std::string& p, const auto&) { paths.push_back(p); });
  CHECK(paths == std::vector<std::string>{"a/0", "a/1", "b/0", "b/1"});
  std::array<pmap::Array, 2> arr{iota(1), iota(2)};
  auto arr2 = pmap::tree_copy(arr);
  CHECK(arr2[1].to_vector<float>() == std::vector<float>{0, 1});
}

TEST_CASE("large host blocks are reused, zero-filled again, and never shared by two live arrays") {
  const pmap::Shape big{512, 1024};  // 2 MiB: above the cache's threshold
  pmap::detail::host_cache_clear();  // blocks earlier tests left
  const auto before = pmap::detail::host_cache_stats();
  const void* first = nullptr;
  {
    pmap::Array a(big, pmap::DType::f32);
    first = a.raw_data();
    std::vector<float> ones(static_cast<std::size_t>(a.size()), 1.0f);
    a.copy_from_host(ones.data(), a.nbytes());
  }
  CHECK(pmap::detail::host_cache_stats().cached_bytes >= std::size_t{2} << 20);
  pmap::Array b(big, pmap::DType::f32);  // the block a held, zeroed
  CHECK(b.raw_data() == first);
  CHECK(pmap::detail::host_cache_stats().reused == before.reused + 1);
  const auto v = b.to_vector<float>();
  CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
  pmap::Array c(big, pmap::DType::f32);  // b is alive: a new block
  CHECK(c.raw_data() != b.raw_data());
  pmap::detail::host_cache_clear();
  CHECK(pmap::detail::host_cache_stats().cached_bytes == 0);
  pmap::Array small({4}, pmap::DType::f32);  // small blocks are malloc's, not counted
  CHECK(pmap::detail::host_cache_stats().allocated == before.allocated + 2);
  // A fresh block of kHugeBytes or more starts on a huge page (where huge_blocks()), is zero-filled and holds
  // what is written to it to its last element.
  pmap::Array huge({static_cast<std::int64_t>(pmap::detail::kHugeBytes / 4) + 5}, pmap::DType::f32);
  if (pmap::detail::huge_blocks()) {
    CHECK(reinterpret_cast<std::uintptr_t>(huge.raw_data()) % pmap::detail::kHugePage == 0);
#if defined(__linux__)
    // the block maps whole huge pages: its last one is the block's own (mincore fails on unmapped memory)
    const std::size_t pages = (huge.nbytes() + pmap::detail::kHugePage - 1) / pmap::detail::kHugePage;
    std::vector<unsigned char> resident(pages * pmap::detail::kHugePage / 4096 + 1);
    CHECK(mincore(huge.raw_data(), pages * pmap::detail::kHugePage, resident.data()) == 0);
#endif
  }
  std::vector<float> h = huge.to_vector<float>();
  CHECK(std::all_of(h.begin(), h.end(), [](float x) { return x == 0.0f; }));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i % 1000);
  huge.copy_from_host(h.data(), huge.nbytes());
  CHECK(huge.to_vector<float>() == h);
}

TEST_CASE("host cache: a release gives the largest cached blocks back first, never the small ones") {
  namespace d = pmap::detail;
  d::host_cache_clear();
  const auto floats = [](std::size_t bytes) { return pmap::Shape{static_cast<std::int64_t>(bytes / 4)}; };
  const std::size_t mib = std::size_t{1} << 20;
  const void* eight = nullptr;
  {
    pmap::Array a(floats(6 * mib), pmap::DType::f32), b(floats(8 * mib), pmap::DType::f32),
        c(floats(2 * mib), pmap::DType::f32);
    eight = b.raw_data();
  }  // all three cached now
  const auto before = d::host_cache_stats();
  CHECK(before.cached_bytes == 16 * mib);
  CHECK(d::host_cache_release(0) == 0);
  CHECK(d::host_cache_release(6 * mib) == 0);  // a cached block of that size waits for it
  CHECK(d::host_cache_release(7 * mib) == 8 * mib);  // the 8 MiB block covers it alone
#if defined(__linux__)
  if (d::huge_blocks()) {  // its pages went back to the kernel: no mapping there now
    unsigned char resident = 0;
    errno = 0;
    CHECK(mincore(const_cast<void*>(eight), 4096, &resident) == -1);
    CHECK(errno == ENOMEM);
  }
#endif
  CHECK(d::host_cache_stats().cached_bytes == 8 * mib);
  CHECK(d::host_cache_stats().released == before.released + 1);
  CHECK(d::host_cache_release(100 * mib) == 6 * mib);  // the 2 MiB block is below kHugeBytes: kept
  CHECK(d::host_cache_stats().cached_bytes == 2 * mib);
  CHECK(d::host_cache_release(100 * mib) == 0);
  CHECK(d::host_cache_stats().released == before.released + 2);
  const auto reused = d::host_cache_stats().reused;
  pmap::Array again(floats(6 * mib), pmap::DType::f32);  // a fresh block now, zero-filled
  CHECK(d::host_cache_stats().reused == reused);
  const auto v = again.to_vector<float>();
  CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
  pmap::Array small(floats(2 * mib), pmap::DType::f32);  // the small block, still cached
  CHECK(d::host_cache_stats().reused == reused + 1);
  d::host_cache_clear();
}

TEST_CASE("Array::uninitialized: poisoned in the tests (NaN floats), counted, and checked like the constructor") {
  // The test binary sets PMAPCC_POISON_UNINITIALIZED=1 (tests/main.cpp) unless the environment chose.
  const char* env = std::getenv("PMAPCC_POISON_UNINITIALIZED");
  const std::uint64_t before = pmap::detail::allocation_count();
  pmap::Array a = pmap::Array::uninitialized({3, 5}, pmap::DType::f32);
  CHECK(pmap::detail::allocation_count() == before + 1);
  CHECK(a.shape() == pmap::Shape{3, 5});
  CHECK(a.dtype() == pmap::DType::f32);
  if (env != nullptr && std::string(env) == "1") {
    const auto v = a.to_vector<float>();
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x != x; }));
  }
  CHECK(pmap::Array::uninitialized({0, 4}, pmap::DType::i32).size() == 0);
  CHECK_THROWS_AS(pmap::Array::uninitialized({2, -1}, pmap::DType::f32), pmap::ShapeError);
}

}  // namespace PMAPCC_TEST_FILE
