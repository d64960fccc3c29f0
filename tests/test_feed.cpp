// pmap::Feed on CPU meshes: replicated and sharded batches reach every device with the right rows, in push
// order, double-buffered (a push while the previous batch is still in use leaves it intact), and misuse is
// refused with a clear error. On CUDA meshes the same code copies asynchronously (tests/test_cuda_*.cpp
// train through it on a GPU).
#include <doctest/doctest.h>

#include <map>
#include <string>

#include <pmap/pmap.h>

#include "cuda_testing.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

struct Batch {
  pmap::Array x;
  pmap::Array y;
};
PMAPCC_TREE(Batch, x, y)

Batch prototype(std::int64_t rows) {
  return Batch{pmap::Array({rows, 3}, pmap::DType::f32), pmap::Array({rows}, pmap::DType::i32)};
}

// Batch b: x[r, c] = 100 b + 10 r + c, y[r] = 1000 b + r.
void fill(Batch& host, int b) {
  const auto rows = host.x.shape()[0];
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < 3; ++c) host.x.data<float>()[r * 3 + c] = static_cast<float>(100 * b + 10 * r + c);
    host.y.data<std::int32_t>()[r] = static_cast<std::int32_t>(1000 * b + r);
  }
}

// What device d of n holds after batch b: all rows (replicated) or block d (sharded).
void check_rows(const Batch& got, int b, std::int64_t first, std::int64_t rows) {
  const auto x = got.x.to_vector<float>();
  const auto y = got.y.to_vector<std::int32_t>();
  REQUIRE(x.size() == static_cast<std::size_t>(rows * 3));
  for (std::int64_t r = 0; r < rows; ++r) {
    CHECK(y[static_cast<std::size_t>(r)] == 1000 * b + first + r);
    CHECK(x[static_cast<std::size_t>(r * 3 + 2)] == static_cast<float>(100 * b + 10 * (first + r) + 2));
  }
}

}  // namespace

TEST_CASE("Feed delivers replicated and sharded batches to every CPU device, in order, double-buffered") {
  for (int n : {1, 2, 3}) {
    for (bool shard : {false, true}) {
      CAPTURE(n);
      CAPTURE(shard);
      pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), "i");
      const std::int64_t rows = 6;
      pmap::Feed<Batch> feed(mesh, prototype(rows),
                             shard ? pmap::FeedLayout::sharded("i") : pmap::FeedLayout::replicated());
      fill(feed.next(), 0);
      feed.push();
      for (int b = 0; b < 4; ++b) {
        if (b + 1 < 4) {
          fill(feed.next(), b + 1);
          feed.push();
        }
        const pmap::Sharded<Batch>& on_devices = feed.pop();
        REQUIRE(on_devices.size() == static_cast<std::size_t>(n));
        auto seen = pmap::pmap([&](const Batch& mine) {
          const std::int64_t block = shard ? rows / n : rows;
          const std::int64_t first = shard ? pmap::axis_index("i") * block : 0;
          CHECK(mine.x.device() == pmap::current_device());
          check_rows(mine, b, first, block);
          return mine.y.to_vector<std::int32_t>()[0];
        }, mesh, "i")(on_devices);
        CHECK(seen[0] == 1000 * b);
      }
    }
  }
}

TEST_CASE("Feed refuses misuse: pop before push, a third pending batch, push without next, bad shards") {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "i");
  pmap::Feed<Batch> feed(mesh, prototype(4));
  CHECK_THROWS_WITH_AS(feed.pop(), doctest::Contains("no batch was pushed"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(feed.push(), doctest::Contains("call next()"), pmap::ValueError);
  fill(feed.next(), 0);
  feed.push();
  fill(feed.next(), 1);
  feed.push();
  CHECK_THROWS_WITH_AS(feed.next(), doctest::Contains("two batches are already pushed"), pmap::ValueError);
  feed.pop();
  fill(feed.next(), 2);  // a slot is free again
  feed.push();
  auto first_rows = [](const pmap::Sharded<Batch>& s) { return s[1].y.to_vector<std::int32_t>()[0]; };
  CHECK(first_rows(feed.pop()) == 1000);
  CHECK(first_rows(feed.pop()) == 2000);
  CHECK_THROWS_WITH_AS(pmap::Feed<Batch>(mesh, prototype(5), pmap::FeedLayout::sharded("i")),
                       doctest::Contains("not divisible by 2"), pmap::ShapeError);
  CHECK_THROWS_AS(pmap::Feed<Batch>(mesh, prototype(4), pmap::FeedLayout::sharded("nope")), pmap::AxisError);
}

namespace {

using Leaves = std::map<std::string, pmap::Array>;

// Batch b, leaf of `shape`: element at row-major offset k is 1000 b + k (i32 for "labels").
void fill_offsets(Leaves& host, int b) {
  for (auto& [path, a] : host) {
    for (std::int64_t k = 0; k < a.size(); ++k) {
      if (a.dtype() == pmap::DType::i32) a.data<std::int32_t>()[k] = static_cast<std::int32_t>(1000 * b + k);
      else a.data<float>()[k] = static_cast<float>(1000 * b + k);
    }
  }
}

// The offsets of block [lo, lo + n) of a 2-D leaf of `cols` columns, batch b.
std::vector<float> block_2d(int b, std::int64_t cols, std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc) {
  std::vector<float> out;
  for (std::int64_t r = r0; r < r0 + nr; ++r)
    for (std::int64_t c = c0; c < c0 + nc; ++c) out.push_back(static_cast<float>(1000 * b + r * cols + c));
  return out;
}

// A Feed partitioned over a 2x2 mesh ("data", "model"): columns over "model" (a block that is not one run:
// gathered), rows over "data" (one run), a leaf not named (replicated), batch after batch.
void check_partitioned_feed(const std::vector<pmap::Device>& devices) {
  pmap::Mesh mesh(devices, {{"data", 2}, {"model", 2}});
  Leaves prototype;
  prototype.emplace("x", pmap::Array({4, 6}, pmap::DType::f32));
  prototype.emplace("labels", pmap::Array({4, 2}, pmap::DType::i32));
  prototype.emplace("mask", pmap::Array({3}, pmap::DType::f32));
  pmap::Feed<Leaves> feed(mesh, prototype,
                          pmap::FeedLayout::partitioned(pmap::Specs{{"x", pmap::P(pmap::none, "model")},
                                                                    {"labels", pmap::P("data")}}));
  fill_offsets(feed.next(), 0);
  feed.push();
  for (int b = 0; b < 4; ++b) {
    CAPTURE(b);
    if (b + 1 < 4) {
      fill_offsets(feed.next(), b + 1);
      feed.push();
    }
    const pmap::Sharded<Leaves>& got = feed.pop();
    REQUIRE(got.size() == 4);
    REQUIRE(got.specs().size() == 3);
    CHECK(got.specs()[2].path == "x");
    CHECK(got.specs()[2].spec == pmap::P(pmap::none, "model"));
    auto ok = pmap::pmap([&](const Leaves& mine) {
      const int i = pmap::axis_index("data"), j = pmap::axis_index("model");
      bool same = mine.at("x").device() == pmap::current_device();
      same = same && mine.at("x").shape() == pmap::Shape{4, 3};
      same = same && mine.at("x").to_vector<float>() == block_2d(b, 6, 0, 4, 3 * j, 3);
      const auto labels = mine.at("labels").to_vector<std::int32_t>();
      const auto want = block_2d(b, 2, 2 * i, 2, 0, 2);
      same = same && std::vector<float>(labels.begin(), labels.end()) == want;
      return same && mine.at("mask").to_vector<float>() == block_2d(b, 3, 0, 1, 0, 3);
    }, mesh)(got);
    for (bool o : ok) CHECK(o);
    // It knows its mesh, as shard's values do: shard_map takes it on this mesh, and refuses it on another mesh
    // of the same devices (their axes differ).
    CHECK(got.mesh() == pmap::detail::mesh_identity(mesh));
    const pmap::Specs in{{"x", pmap::P(pmap::none, "model")}, {"labels", pmap::P("data")}};
    auto rows = pmap::shard_map([](const Leaves& mine) { return pmap::psum(mine.at("x"), "model"); }, mesh, {in},
                                pmap::P());
    CHECK(rows(got).shape() == pmap::Shape{4, 3});
    pmap::Mesh other(devices, {{"a", 2}, {"b", 2}});
    const pmap::Specs in_other{{"x", pmap::P(pmap::none, "b")}, {"labels", pmap::P("a")}};
    auto on_other = pmap::shard_map([](const Leaves& mine) { return mine.at("mask").copy(); }, other, {in_other},
                                    pmap::P());
    CHECK_THROWS_WITH_AS(on_other(got), doctest::Contains("shard_map: argument 0 was split on "), pmap::ValueError);
  }
  // Bad specs raise as shard's do, naming the Feed.
  CHECK_THROWS_WITH_AS(pmap::Feed<Leaves>(mesh, prototype, pmap::FeedLayout::partitioned(pmap::P(pmap::none, "nope"))),
                       doctest::Contains("Feed: 'labels' i32(4, 2): dimension 1 of spec P(None, 'nope') names axis 'nope'"),
                       pmap::AxisError);
  CHECK_THROWS_WITH_AS(pmap::Feed<Leaves>(mesh, prototype, pmap::FeedLayout::partitioned(pmap::Specs{{"y", pmap::P("data")}})),
                       doctest::Contains("Feed: the specs name 'y'"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::Feed<Leaves>(mesh, prototype, pmap::FeedLayout::partitioned(pmap::P("model", "data"))),
                       doctest::Contains("Feed: 'mask' f32(3,) has 1 dimension(s), but its spec P('model', 'data') "
                                         "gives 2 (dimension 1: 'data')"),
                       pmap::ShapeError);
  pmap::FeedLayout both = pmap::FeedLayout::partitioned(pmap::P("data"));
  both.shard = true;
  CHECK_THROWS_WITH_AS(pmap::Feed<Leaves>(mesh, prototype, both), doctest::Contains("sharded (the leading axis) or "
                                                                                    "partitioned (by specs), not both"),
                       pmap::ValueError);
}

}  // namespace

TEST_CASE("Feed partitioned by specs: blocks along any dimension reach every CPU device, batch after batch") {
  check_partitioned_feed(pmap::local_devices(pmap::DeviceKind::cpu, 4));
}

TEST_CASE("cuda Feed partitioned by specs: a block that is not one run is gathered into pinned memory and copied") {
  PMAPCC_REQUIRE_GPU();
  std::vector<pmap::Device> devices;  // 4 virtual devices on GPU 0
  for (int i = 0; i < 4; ++i) devices.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  check_partitioned_feed(devices);
}

}  // namespace PMAPCC_TEST_FILE
