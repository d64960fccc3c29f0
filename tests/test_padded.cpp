// Sizes that do not divide (include/pmap/padded.h, pmean with weights): shard_padded's pieces, masks and counts,
// unshard_padded giving every row back, the weighted mean over the real rows, and a data-parallel step on 3
// devices whose gradient for batches of 127 and 128 rows is the single-device gradient of the same rows. On CPU
// devices and on virtual CUDA devices (the stand-in's, or a GPU's).
#include "cuda_testing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::random_floats;
using cuda_testing::relative_error;
using pmap::Array;
namespace ops = pmap::ops;

struct Rows {
  Array x;  // (n, 3) f32: row r is r, r + 0.5, -r
  Array id;  // (n) i32: r
};
PMAPCC_TREE(Rows, x, id)

Rows rows_of(std::int64_t n) {
  std::vector<float> x;
  std::vector<std::int32_t> id;
  for (std::int64_t r = 0; r < n; ++r) {
    x.insert(x.end(), {float(r), float(r) + 0.5f, -float(r)});
    id.push_back(static_cast<std::int32_t>(r));
  }
  return {Array::from_host(x, {n, 3}), Array::from_host(id, {n})};
}

std::vector<pmap::Device> virtual_cuda_devices(int n) {  // virtual devices on GPU 0
  std::vector<pmap::Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  return devices;
}

void check_pieces(const std::vector<pmap::Device>& devices) {
  const int n = static_cast<int>(devices.size());
  pmap::Mesh mesh(devices, "data");
  for (std::int64_t total : {std::int64_t{0}, std::int64_t{1}, std::int64_t{5}, std::int64_t{127}, std::int64_t{128}}) {
    CAPTURE(total);
    const std::int64_t block = (total + n - 1) / n;
    auto pieces = pmap::shard_padded(rows_of(total), mesh, "data");
    REQUIRE(pieces.size() == static_cast<std::size_t>(n));
    std::int64_t seen = 0;
    for (int d = 0; d < n; ++d) {
      CAPTURE(d);
      const auto& p = pieces[static_cast<std::size_t>(d)];
      const std::int64_t count = std::max<std::int64_t>(0, std::min(block, total - d * block));
      CHECK(p.count == count);
      CHECK(p.value.x.shape() == pmap::Shape{block, 3});
      CHECK(p.value.x.device() == devices[static_cast<std::size_t>(d)]);
      CHECK(p.mask.device() == devices[static_cast<std::size_t>(d)]);
      const auto x = p.value.x.to_vector<float>();
      const auto id = p.value.id.to_vector<std::int32_t>();
      const auto mask = p.mask.to_vector<float>();
      for (std::int64_t r = 0; r < block; ++r) {
        const bool real = r < count;
        const auto at = static_cast<std::size_t>(r);
        const float row = real ? float(d * block + r) : 0.0f;
        CHECK(mask[at] == (real ? 1.0f : 0.0f));
        CHECK(id[at] == (real ? static_cast<std::int32_t>(row) : 0));
        CHECK(x[3 * at] == row);
        CHECK(x[3 * at + 1] == (real ? row + 0.5f : 0.0f));
      }
      seen += count;
    }
    CHECK(seen == total);
    // Per-row results come back without the padding: every row once, in order.
    auto doubled = pmap::pmap([](const pmap::Padded<Rows>& p) { return ops::scale(p.value.x, 2.0f); }, mesh)(pieces);
    const Array back = pmap::unshard_padded(doubled, mesh, pieces, "data");
    CHECK(back.shape() == pmap::Shape{total, 3});
    const auto want = rows_of(total).x.to_vector<float>();
    const auto got = back.to_vector<float>();
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == 2.0f * want[i]);
  }
}

TEST_CASE("shard_padded: 1, 5, 127 and 128 rows on 3 CPU devices: pieces of ceil(n / 3), the last padded with zeros") {
  check_pieces(pmap::local_devices(pmap::DeviceKind::cpu, 3));
  check_pieces(pmap::local_devices(pmap::DeviceKind::cpu, 4));  // 5 rows: 2, 2, 1 and a device with none
}

TEST_CASE("cuda shard_padded: pieces, masks and unshard_padded on 3 virtual CUDA devices") {
  PMAPCC_REQUIRE_GPU();
  check_pieces(virtual_cuda_devices(3));
}

TEST_CASE("shard_padded on a 2-D mesh: devices along the other axis share a piece, and bad trees raise") {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"data", 2}, {"model", 2}});
  auto pieces = pmap::shard_padded(rows_of(7), mesh, "data");  // 4 and 3 (+1)
  const std::vector<std::int64_t> counts{4, 4, 3, 3};
  for (std::size_t d = 0; d < 4; ++d) CHECK(pieces[d].count == counts[d]);
  CHECK(pieces[1].value.id.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(pieces[3].value.id.to_vector<std::int32_t>() == std::vector<std::int32_t>{4, 5, 6, 0});
  auto ids = pmap::pmap([](const pmap::Padded<Rows>& p) { return p.value.id.copy(); }, mesh)(pieces);
  CHECK(pmap::unshard_padded(ids, mesh, pieces, "data").to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6});
  // Over every axis: 4 pieces of 2 rows.
  auto all = pmap::shard_padded(rows_of(7), mesh);
  CHECK(all[3].count == 1);

  std::map<std::string, Array> unequal;
  unequal.emplace("a", Array(pmap::Shape{5, 2}, pmap::DType::f32));
  unequal.emplace("b", Array(pmap::Shape{4}, pmap::DType::f32));
  CHECK_THROWS_WITH_AS(pmap::shard_padded(unequal, mesh, "data"),
                       "shard_padded: leaves have different leading sizes: 'a' has 5; 'b' has 4", pmap::ShapeError);
  CHECK_THROWS_WITH_AS(pmap::shard_padded(Array::scalar(1.0f), mesh, "data"),
                       "shard_padded: the array is a scalar array and has no leading axis", pmap::ShapeError);
  auto short_result = pmap::pmap([](const pmap::Padded<Rows>& p) {
    return ops::slice(p.value.x, {0, 0}, {1, 3});
  }, mesh)(pieces);
  CHECK_THROWS_WITH_AS(pmap::unshard_padded(short_result, mesh, pieces, "data"),
                       "unshard_padded: the result of cpu:0 is f32(1, 3), fewer rows than its piece's 4 real ones",
                       pmap::ShapeError);
  CHECK_THROWS_WITH_AS(pmap::unshard_padded(ids, mesh, pieces),  // split over "data", assembled over every axis
                       "unshard_padded: local device 1 holds piece 0 of the padded argument, but piece 1 when split "
                       "over all axes: give the axes (and mesh) shard_padded split it over",
                       pmap::ValueError);
  pmap::Mesh two(pmap::local_devices(pmap::DeviceKind::cpu, 2), "data");
  CHECK_THROWS_WITH_AS(pmap::unshard_padded(ids, two, pieces, "data"),
                       "unshard_padded: the results have 4 entries and the padded argument 4, but the mesh has 2 local "
                       "devices",
                       pmap::ShapeError);
}

struct Pair {
  Array a;
  double b;
};
PMAPCC_TREE(Pair, a, b)

void check_weighted_mean(const std::vector<pmap::Device>& devices) {
  const int n = static_cast<int>(devices.size());
  pmap::Mesh mesh(devices, "data");
  // x_d = (d + 1) * (1, -2, 3), weight_d = 2 d + 1: sum(w x) and sum(w) are exact, so the mean is one rounding.
  auto run = [&](auto body) { return pmap::pmap([&](int) { return body(pmap::axis_index("data")); }, mesh)(0); };
  double weights = 0, weighted = 0;
  for (int d = 0; d < n; ++d) {
    weights += 2 * d + 1;
    weighted += double(2 * d + 1) * (d + 1);
  }
  auto x_of = [](int d) {
    const float v = float(d + 1);
    return Array::from_host(std::vector<float>{v, -2 * v, 3 * v}, {3}, pmap::current_device());
  };
  const auto mean = run([&](int d) { return pmap::pmean(x_of(d), "data", 2.0 * d + 1).to_vector<float>(); });
  auto over = [](double sum, double w) {
    std::vector<float> out;
    for (float c : {1.0f, -2.0f, 3.0f}) out.push_back(static_cast<float>(c * sum) / static_cast<float>(w));
    return out;
  };
  for (const auto& got : mean.values()) CHECK(got == over(weighted, weights));
  // A device of weight 0 adds nothing, a NaN included.
  if (n > 1) {
    const auto skip = run([&](int d) {
      Array x = d == 0 ? Array::from_host(std::vector<float>(3, std::numeric_limits<float>::quiet_NaN()), {3},
                                          pmap::current_device())
                       : x_of(d);
      return pmap::pmean(x, "data", d == 0 ? 0.0 : 1.0).to_vector<float>();
    });
    double rest = 0;
    for (int d = 1; d < n; ++d) rest += d + 1;
    CHECK(skip[0] == over(rest, n - 1));
  }
  // Trees: the weights summed once; a scalar leaf weighted too.
  const auto tree = run([&](int d) {
    Pair p = pmap::pmean(Pair{x_of(d), double(d + 1)}, "data", 2.0 * d + 1);
    return std::pair(p.a.to_vector<float>(), p.b);
  });
  CHECK(tree[0].first == mean[0]);
  CHECK(tree[0].second == weighted / weights);
  // f64: the same sums, in double.
  const auto wide = run([&](int d) {
    return pmap::pmean(Array::from_host(std::vector<double>{double(d + 1)}, {1}, pmap::current_device()), "data",
                       2.0 * d + 1)
        .to_vector<double>();
  });
  CHECK(wide[0][0] == weighted / weights);
}

TEST_CASE("pmean with weights: the sum of w x over the sum of w, one rounding, weight 0 adding nothing, and errors") {
  check_weighted_mean(pmap::local_devices(pmap::DeviceKind::cpu, 3));
  check_weighted_mean(pmap::local_devices(pmap::DeviceKind::cpu, 1));
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 3), "data");
  auto call = [&](auto body) { return pmap::pmap([&](int) { return body(pmap::axis_index("data")); }, mesh)(0); };
  const auto x = [] { return Array::from_host(std::vector<float>{1, 2}, {2}, pmap::current_device()); };
  CHECK_THROWS_WITH_AS(call([&](int d) { return pmap::pmean(x(), "data", d == 1 ? -1.0 : 1.0).size(); }),
                       "cpu:1: pmean: weight -1: a weight must be finite and non-negative",
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(call([&](int) { return pmap::pmean(x(), "data", std::nan("")).size(); }),
                       doctest::Contains("a weight must be finite and non-negative"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(call([&](int) { return pmap::pmean(x(), "data", 0.0).size(); }),
                       doctest::Contains("pmean: every weight over 'data' is 0; there is nothing to average"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(call([&](int) {
                         return pmap::pmean(Array::from_host(std::vector<std::int32_t>{1}, {1}, pmap::current_device()),
                                            "data", 1.0).size();
                       }),
                       doctest::Contains("pmean"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(call([&](int) {
                         return pmap::grad([](const Array& v) { return ops::sum(pmap::pmean(v, "data", 2.0)); })(x())
                             .size();
                       }),
                       doctest::Contains("inside grad or vmap: not supported there; inside grad, divide the loss's sum "
                                         "by psum(count) and psum the gradients instead"),
                       pmap::ValueError);
}

TEST_CASE("cuda pmean with weights on 3 virtual CUDA devices") {
  PMAPCC_REQUIRE_GPU();
  check_weighted_mean(virtual_cuda_devices(3));
}

// y = relu(x w1 + b1) w2 + b2; the squared error summed over outputs, averaged over rows.
struct Net {
  Array w1, b1, w2, b2;
};
PMAPCC_TREE(Net, w1, b1, w2, b2)
struct Batch {
  Array x, t;
};
PMAPCC_TREE(Batch, x, t)

// Each row's squared error (rows), summed over the outputs.
Array row_errors(const Net& p, const Batch& b) {
  const Array y = ops::add(ops::matmul(ops::linear(b.x, p.w1, p.b1, true), p.w2), p.b2);
  return ops::sum(ops::square(ops::subtract(y, b.t)), {1});
}

TEST_CASE("uneven data parallel: with 3 devices and batches of 127 and 128, the step's gradient is one device's") {
  const std::int64_t in = 5, hidden = 8, out = 2;
  auto host = [](std::int64_t count, std::uint32_t seed, pmap::Shape shape) {
    return Array::from_host(random_floats(static_cast<std::size_t>(count), seed), shape);
  };
  const Net net{host(in * hidden, 1, {in, hidden}), host(hidden, 2, {hidden}), host(hidden * out, 3, {hidden, out}),
                host(out, 4, {out})};
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 3), "data");
  auto params = pmap::replicate(net, mesh);
  // 2 rows: 1, 1 and none, where (b)'s mean of no rows is NaN and its weight 0 drops it.
  for (std::int64_t rows : {std::int64_t{2}, std::int64_t{127}, std::int64_t{128}}) {
    CAPTURE(rows);
    const Batch batch{host(rows * in, 5, {rows, in}), host(rows * out, 6, {rows, out})};
    const Net whole = pmap::grad([&](const Net& p) { return ops::mean(row_errors(p, batch)); })(net);
    auto pieces = pmap::shard_padded(batch, mesh, "data");
    // (a) The loss's sum over the real rows divided by every device's rows; the gradients psum'd.
    // (b) Each device's mean over its real rows; the gradients averaged weighted by the real rows.
    auto step = pmap::pmap([](const Net& p, const pmap::Padded<Batch>& b) {
      const double total = pmap::psum(static_cast<double>(b.count), "data");
      auto masked_sum = [&](const Net& q) { return ops::sum(ops::multiply(row_errors(q, b.value), b.mask)); };
      Net a = pmap::psum(pmap::grad([&](const Net& q) {
        return ops::scale(masked_sum(q), static_cast<float>(1.0 / total));
      })(p), "data");
      Net m = pmap::pmean(pmap::grad([&](const Net& q) {
        return ops::scale(masked_sum(q), 1.0f / static_cast<float>(b.count));
      })(p), "data", static_cast<double>(b.count));
      return std::pair(std::move(a), std::move(m));
    }, mesh)(params, pieces);
    auto worst = [&](const Net& g) {  // the largest relative error of the four gradients
      return std::max({relative_error(g.w1.to_vector<float>(), whole.w1.to_vector<float>()),
                       relative_error(g.b1.to_vector<float>(), whole.b1.to_vector<float>()),
                       relative_error(g.w2.to_vector<float>(), whole.w2.to_vector<float>()),
                       relative_error(g.b2.to_vector<float>(), whole.b2.to_vector<float>())});
    };
    double sum_err = 0, mean_err = 0;
    for (std::size_t d = 0; d < 3; ++d) {
      sum_err = std::max(sum_err, worst(step[d].first));
      mean_err = std::max(mean_err, worst(step[d].second));
    }
    CHECK(sum_err <= 1e-5);
    CHECK(mean_err <= 1e-5);
    MESSAGE(rows << " rows on 3 devices: the gradient's relative error against one device's, psum of sum / total "
                 << sum_err << ", pmean weighted by the counts " << mean_err);
    // Evaluation keeps every row: the per-row errors of the pieces are the whole batch's.
    auto errors = pmap::pmap([](const Net& p, const pmap::Padded<Batch>& b) { return row_errors(p, b.value); },
                             mesh)(params, pieces);
    const Array all = pmap::unshard_padded(errors, mesh, pieces, "data");
    CHECK(all.shape() == pmap::Shape{rows});
    CHECK(relative_error(all.to_vector<float>(), row_errors(net, batch).to_vector<float>()) <= 1e-6);
  }
}

}  // namespace

}  // namespace PMAPCC_TEST_FILE
