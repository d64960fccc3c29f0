// pmap::Feed on CPU meshes: replicated and sharded batches reach every device with the right rows, in push
// order, double-buffered (a push while the previous batch is still in use leaves it intact), and misuse is
// refused with a clear error. On CUDA meshes the same code copies asynchronously (tests/test_cuda_*.cpp
// train through it on a GPU).
#include <doctest/doctest.h>

#include <pmap/pmap.h>

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
