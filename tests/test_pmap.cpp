// Tests of pmap and the named-axis collectives on CPU devices, with computed expectations:
// device r contributes r + 1, so psum over n devices is n(n+1)/2 exactly.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include <pmap/pmap.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

pmap::Mesh cpu_mesh(int n, const std::string& axis = "i") {
  return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), axis);
}

pmap::Array filled(std::int64_t n, float v) {
  return pmap::Array::from_host(std::vector<float>(static_cast<std::size_t>(n), v), {n});
}

}  // namespace

TEST_CASE("pmap runs once per device, concurrently, on worker threads") {
  for (int n : {1, 2, 3, 5, 8}) {
    auto mesh = cpu_mesh(n);
    std::atomic<int> inside{0}, peak{0};
    auto out = pmap::pmap([&](int base) {
      int now = ++inside;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {}
      pmap::barrier("i");  // every device must be inside at once to pass this
      --inside;
      return base + pmap::axis_index("i") * 10 + pmap::axis_size("i") * 1000;
    }, mesh, "i")(7);
    REQUIRE(out.size() == static_cast<std::size_t>(n));
    for (int d = 0; d < n; ++d) CHECK(out[static_cast<std::size_t>(d)] == 7 + d * 10 + n * 1000);
    CHECK(peak.load() == n);
  }
}

TEST_CASE("collectives on 1-D meshes of 1, 2, 3, 5 and 8 devices: computed expectations") {
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    auto mesh = cpu_mesh(n, "ens");
    const float tri = static_cast<float>(n * (n + 1) / 2);
    pmap::pmap([&](int) {
      const int r = pmap::axis_index("ens");
      pmap::Array x = filled(5, static_cast<float>(r + 1));
      CHECK(pmap::psum(x, "ens").to_vector<float>() == std::vector<float>(5, tri));
      CHECK(pmap::pmean(x, "ens").to_vector<float>() == std::vector<float>(5, tri / static_cast<float>(n)));
      CHECK(pmap::pmax(x, "ens").to_vector<float>() == std::vector<float>(5, static_cast<float>(n)));
      CHECK(pmap::pmin(x, "ens").to_vector<float>() == std::vector<float>(5, 1.0f));
      CHECK(pmap::psum(r + 1, "ens") == n * (n + 1) / 2);
      CHECK(pmap::pmean(static_cast<double>(r + 1), "ens") == (n + 1) / 2.0);
      std::vector<int> expect_g(static_cast<std::size_t>(n));
      for (int k = 0; k < n; ++k) expect_g[static_cast<std::size_t>(k)] = k + 1;
      CHECK(pmap::all_gather(r + 1, "ens") == expect_g);
      // all_gather stacked and tiled of a (2,) array [r, 10 r].
      auto v = pmap::Array::from_host(std::vector<std::int32_t>{r, 10 * r}, {2});
      auto stacked = pmap::all_gather(v, "ens");
      auto tiled = pmap::all_gather(v, "ens", true);
      CHECK(stacked.shape() == pmap::Shape{n, 2});
      CHECK(tiled.shape() == pmap::Shape{2 * n});
      std::vector<std::int32_t> expect_t;
      for (int k = 0; k < n; ++k) expect_t.insert(expect_t.end(), {k, 10 * k});
      CHECK(tiled.to_vector<std::int32_t>() == expect_t);
      CHECK(stacked.to_vector<std::int32_t>() == expect_t);
      // psum_scatter: x[k] = (r+1) * (k+1); device r keeps sum over devices of x[r] = tri * (r+1).
      std::vector<float> xs;
      for (int k = 0; k < n; ++k) xs.insert(xs.end(), 3, static_cast<float>((r + 1) * (k + 1)));
      auto blocks = pmap::Array::from_host(xs, {n, 3});
      auto mine = pmap::psum_scatter(blocks, "ens");
      CHECK(mine.shape() == pmap::Shape{3});
      CHECK(mine.to_vector<float>() == std::vector<float>(3, tri * static_cast<float>(r + 1)));
      auto flat = pmap::Array::from_host(xs, {3 * n});
      auto mine_t = pmap::psum_scatter(flat, "ens", true);
      CHECK(mine_t.to_vector<float>() == std::vector<float>(3, tri * static_cast<float>(r + 1)));
      // ppermute: a ring shift r -> r+1; and a partial permutation where only 0 -> n-1 is sent.
      std::vector<std::pair<int, int>> ring;
      for (int k = 0; k < n; ++k) ring.emplace_back(k, (k + 1) % n);
      auto got = pmap::ppermute(x, "ens", ring);
      CHECK(got.to_vector<float>() == std::vector<float>(5, static_cast<float>((r - 1 + n) % n + 1)));
      auto partial = pmap::ppermute(x, "ens", {{0, n - 1}});
      float want = (r == n - 1) ? 1.0f : 0.0f;
      CHECK(partial.to_vector<float>() == std::vector<float>(5, want));
      pmap::psum_inplace(x, "ens");
      CHECK(x.to_vector<float>() == std::vector<float>(5, tri));
    }, mesh, "ens")(0);
  }
}

TEST_CASE("collectives_entered counts this device's collectives in the current call") {
  const pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"a", 2}, {"b", 2}});
  const auto counts = pmap::pmap([] {
    std::vector<std::uint64_t> seen{pmap::collectives_entered()};
    pmap::Array x = pmap::Array::scalar(1.0f);
    pmap::psum_inplace(x, "a");
    pmap::pmean_inplace(x, {"a", "b"});  // one collective, however many axes
    seen.push_back(pmap::collectives_entered());
    (void)pmap::all_gather(x, "b");
    pmap::barrier("a");
    (void)pmap::axis_index("a");  // not a collective
    seen.push_back(pmap::collectives_entered());
    return seen;
  }, mesh)();
  for (const auto& seen : counts) CHECK(seen == std::vector<std::uint64_t>{0, 2, 4});
  // A new call starts from zero.
  const auto again = pmap::pmap([] { return pmap::collectives_entered(); }, mesh)();
  REQUIRE(again.size() == 4);
  for (std::uint64_t n : again) CHECK(n == 0);
  CHECK_THROWS_AS(pmap::collectives_entered(), pmap::Error);  // outside pmap
}

TEST_CASE("2-D meshes: collectives over either axis, both, and both in the other order") {
  for (auto [rows, cols] : {std::pair{2, 3}, std::pair{2, 4}, std::pair{3, 1}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, rows * cols), {{"data", rows}, {"model", cols}});
    auto out = pmap::pmap([&] {
      const int i = pmap::axis_index("data"), j = pmap::axis_index("model");
      const int g = pmap::axis_index({"data", "model"});
      CHECK(g == i * cols + j);
      CHECK(pmap::axis_index({"model", "data"}) == j * rows + i);
      CHECK(pmap::axis_size({"data", "model"}) == rows * cols);
      // Contribution 1 + global index: sums along model within row i, along data within column j.
      const int v = g + 1;
      int row_sum = 0, col_sum = 0;
      for (int c = 0; c < cols; ++c) row_sum += i * cols + c + 1;
      for (int r = 0; r < rows; ++r) col_sum += r * cols + j + 1;
      CHECK(pmap::psum(v, "model") == row_sum);
      CHECK(pmap::psum(v, "data") == col_sum);
      CHECK(pmap::psum(v, {"data", "model"}) == rows * cols * (rows * cols + 1) / 2);
      // all_gather over ("model", "data") orders by model first.
      auto gathered = pmap::all_gather(v, {"model", "data"});
      for (int c = 0; c < cols; ++c)
        for (int r = 0; r < rows; ++r) CHECK(gathered[static_cast<std::size_t>(c * rows + r)] == r * cols + c + 1);
      return g;
    }, mesh, {"data", "model"})();
    for (int d = 0; d < rows * cols; ++d) CHECK(out[static_cast<std::size_t>(d)] == d);
  }
}

TEST_CASE("all_gather along an axis, stacked and tiled, as JAX's all_gather(x, axis=..., tiled=...)") {
  // Device d holds x (2, 3) with x[i][j] = 100 d + 10 i + j; gathered over "model" of a 2x3 mesh.
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 6), {{"data", 2}, {"model", 3}});
  pmap::pmap([&] {
    const int n = 3, me = pmap::axis_index("model");
    auto value = [](int d, int i, int j) { return static_cast<float>(100 * d + 10 * i + j); };
    std::vector<float> mine;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) mine.push_back(value(me, i, j));
    const auto x = pmap::Array::from_host(mine, {2, 3});
    // Expected layouts, computed from the definition: the gathered index d at the named position.
    std::vector<float> at1, at2;  // stacked at axis 1: (2, n, 3); at axis 2 (= -1): (2, 3, n)
    for (int i = 0; i < 2; ++i)
      for (int d = 0; d < n; ++d)
        for (int j = 0; j < 3; ++j) at1.push_back(value(d, i, j));
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int d = 0; d < n; ++d) at2.push_back(value(d, i, j));
    const auto s1 = pmap::all_gather(x, "model", 1);
    CHECK(s1.shape() == pmap::Shape{2, 3, 3});
    CHECK(s1.to_vector<float>() == at1);
    const auto s2 = pmap::all_gather(x, "model", -1);
    CHECK(s2.shape() == pmap::Shape{2, 3, 3});
    CHECK(s2.to_vector<float>() == at2);
    CHECK(pmap::all_gather(x, "model", 2).to_vector<float>() == at2);
    // Tiled along the last axis: (2, 3 n), each row the devices' rows side by side (the same bytes as at1).
    const auto t1 = pmap::all_gather(x, "model", -1, true);
    CHECK(t1.shape() == pmap::Shape{2, 9});
    CHECK(t1.to_vector<float>() == at1);
    // Axis 0 is the leading-axis gather.
    CHECK(pmap::all_gather(x, "model", 0).to_vector<float>() == pmap::all_gather(x, "model").to_vector<float>());
    CHECK(pmap::all_gather(x, "model", 0, true).shape() == pmap::Shape{6, 3});
    // Over a tuple of axes: all 6 devices, in mesh order.
    CHECK(pmap::all_gather(x, {"data", "model"}, -1, true).shape() == pmap::Shape{2, 18});
    // Out of range, named.
    CHECK_THROWS_WITH_AS(pmap::all_gather(x, "model", 3), doctest::Contains("the axis must be in [-3, 3)"),
                         pmap::ShapeError);
    CHECK_THROWS_WITH_AS(pmap::all_gather(x, "model", 2, true), doctest::Contains("all_gather(axis=2, tiled)"),
                         pmap::ShapeError);
    CHECK_THROWS_AS(pmap::all_gather(x, "model", -4), pmap::ShapeError);
  }, mesh)();
}

TEST_CASE("collectives of empty arrays: empty results of the right shapes (no copy of null pointers)") {
  pmap::Mesh mesh = cpu_mesh(2);
  auto shapes = pmap::pmap([] {
    const pmap::Array empty(pmap::Shape{0}, pmap::DType::f32), rows(pmap::Shape{3, 0}, pmap::DType::f32);
    return std::vector<pmap::Shape>{pmap::psum(empty, "i").shape(), pmap::pmax(empty, "i").shape(),
                                    pmap::all_gather(empty, "i").shape(), pmap::all_gather(empty, "i", true).shape(),
                                    pmap::all_gather(rows, "i", 1, false).shape(),
                                    pmap::all_gather(rows, "i", -1, true).shape()};
  }, mesh, "i")();
  for (const auto& s : shapes) {
    CHECK(s[0] == pmap::Shape{0});
    CHECK(s[1] == pmap::Shape{0});
    CHECK(s[2] == pmap::Shape{2, 0});
    CHECK(s[3] == pmap::Shape{0});
    CHECK(s[4] == pmap::Shape{3, 2, 0});
    CHECK(s[5] == pmap::Shape{3, 0});
  }
}

TEST_CASE("CPU reductions are bitwise identical on every device and from run to run") {
  auto mesh = cpu_mesh(5);
  auto run = [&] {
    return pmap::pmap([](int) {
      const int r = pmap::axis_index("i");
      std::vector<float> v(1000);
      for (std::size_t k = 0; k < v.size(); ++k) v[k] = 1.0f / static_cast<float>(r * 7 + static_cast<int>(k) + 1) * 1e3f;
      return pmap::psum(pmap::Array::from_host(v, {1000}), "i").to_vector<float>();
    }, mesh)(0);
  };
  auto a = run(), b = run();
  // Expected: left-to-right sum in device order, as the library promises.
  std::vector<float> expect(1000, 0.0f);
  for (std::size_t k = 0; k < 1000; ++k) {
    float acc = 1.0f / static_cast<float>(static_cast<int>(k) + 1) * 1e3f;
    for (int r = 1; r < 5; ++r) acc = acc + 1.0f / static_cast<float>(r * 7 + static_cast<int>(k) + 1) * 1e3f;
    expect[k] = acc;
  }
  for (int d = 0; d < 5; ++d) {
    CHECK(a[static_cast<std::size_t>(d)] == expect);
    CHECK(b[static_cast<std::size_t>(d)] == expect);
  }
}

TEST_CASE_TEMPLATE("psum and psum_scatter equal the scalar rank-order sum at every length and offset", T, float,
                   double, std::int32_t, std::uint8_t) {
  // The CPU hub sums 16-byte vectors with a scalar tail; each device reduces its own slice of the
  // elements, so lengths around the vector width exercise every split between the two paths.
  auto value = [](int r, std::size_t k) {
    if constexpr (std::is_floating_point_v<T>) return static_cast<T>(T(1000) / static_cast<T>(r * 13 + static_cast<int>(k) + 1));
    else return static_cast<T>(r * 37 + static_cast<int>(k) * 11 + 5);  // u8 wraps, as the sum does
  };
  for (int n : {2, 3}) {
    auto mesh = cpu_mesh(n);
    for (std::size_t len : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{66},
                            std::size_t{1003}}) {
      CAPTURE(n);
      CAPTURE(len);
      std::vector<T> expect(len);
      for (std::size_t k = 0; k < len; ++k) {
        T acc = value(0, k);
        for (int r = 1; r < n; ++r) acc = static_cast<T>(acc + value(r, k));
        expect[k] = acc;
      }
      auto sums = pmap::pmap([&](int) {
        const int r = pmap::axis_index("i");
        std::vector<T> v(len);
        for (std::size_t k = 0; k < len; ++k) v[k] = value(r, k);
        const auto shape = std::vector<std::int64_t>{static_cast<std::int64_t>(len)};
        pmap::Array x = pmap::Array::from_host(v, shape);
        pmap::Array y = pmap::psum(x, "i");
        pmap::psum_inplace(x, "i");
        return std::make_pair(y.template to_vector<T>(), x.template to_vector<T>());
      }, mesh)(0);
      for (int d = 0; d < n; ++d) {
        CHECK(sums[static_cast<std::size_t>(d)].first == expect);
        CHECK(sums[static_cast<std::size_t>(d)].second == expect);
      }
      const std::size_t rows = len * static_cast<std::size_t>(n);  // psum_scatter: each device keeps len elements
      auto scattered = pmap::pmap([&](int) {
        const int r = pmap::axis_index("i");
        std::vector<T> v(rows);
        for (std::size_t k = 0; k < rows; ++k) v[k] = value(r, k);
        const auto shape = std::vector<std::int64_t>{static_cast<std::int64_t>(rows)};
        return pmap::psum_scatter(pmap::Array::from_host(v, shape), "i", true).template to_vector<T>();
      }, mesh)(0);
      for (int d = 0; d < n; ++d) {
        std::vector<T> want(len);
        for (std::size_t k = 0; k < len; ++k) {
          const std::size_t e = static_cast<std::size_t>(d) * len + k;
          T acc = value(0, e);
          for (int r = 1; r < n; ++r) acc = static_cast<T>(acc + value(r, e));
          want[k] = acc;
        }
        CHECK(scattered[static_cast<std::size_t>(d)] == want);
      }
    }
  }
}

TEST_CASE("collectives over trees") {
  auto mesh = cpu_mesh(3);
  pmap::pmap([](int) {
    const float r = static_cast<float>(pmap::axis_index("i") + 1);
    std::vector<pmap::Array> inner;
    inner.push_back(filled(3, 2 * r));
    std::tuple<pmap::Array, std::vector<pmap::Array>, double> t(filled(2, r), std::move(inner), static_cast<double>(r));
    auto s = pmap::psum(t, "i");
    CHECK(std::get<0>(s).to_vector<float>() == std::vector<float>(2, 6.0f));
    CHECK(std::get<1>(s)[0].to_vector<float>() == std::vector<float>(3, 12.0f));
    CHECK(std::get<2>(s) == 6.0);
    pmap::pmean_inplace(t, "i");
    CHECK(std::get<0>(t).to_vector<float>() == std::vector<float>(2, 2.0f));
    CHECK(std::get<2>(t) == 2.0);
  }, mesh)(0);
}

TEST_CASE("a tree's in-place collectives pack its CPU leaves: one collective per dtype, the leaf-by-leaf bits") {
  // Values whose sums round (thirds, and 1e7 on odd devices), so another order of additions would show.
  // On cpu:0 (Array::from_host's default, whichever device makes it) or on the calling device.
  auto leaf = [](std::int64_t n, int device, float scale, const pmap::Device& on = {}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::size_t k = 0; k < v.size(); ++k)
      v[k] = scale * (static_cast<float>(k) + 1.0f) / (3.0f + static_cast<float>(device)) +
             1e7f * static_cast<float>(device % 2);
    return pmap::Array::from_host(v, {n}, on);
  };
  using Floats = std::map<std::string, pmap::Array>;
  auto floats = [&](int d) {
    Floats f;
    f.emplace("a", leaf(5, d, 1.0f, pmap::current_device()));
    f.emplace("b", leaf(1, d, 7.0f).reshape({1, 1}));
    f.emplace("c", leaf(0, d, 1.0f));  // empty
    f.emplace("d", leaf(33, d, -3.5f));
    return f;
  };
  auto values = [](const Floats& f) {
    std::vector<std::vector<float>> out;
    for (const auto& [name, a] : f) out.push_back(a.to_vector<float>());
    return out;
  };
  for (const int n : {1, 2, 3}) {
    CAPTURE(n);
    const auto out = pmap::pmap([&](int) {
      const int d = pmap::axis_index("i");
      // psum: the f32 leaves, an i32 leaf (a group of its own) and a scalar leaf.
      auto counts = [&] { return pmap::Array::from_host(std::vector<std::int32_t>{d, 10 * d}, {2}); };
      std::tuple<Floats, pmap::Array, double> packed(floats(d), counts(), 0.1 * (d + 1));
      Floats alone = floats(d);
      pmap::Array alone_counts = counts();
      const auto before = pmap::collectives_entered();
      pmap::psum_inplace(packed, "i");
      const auto entered = pmap::collectives_entered() - before;
      for (auto& [name, a] : alone) pmap::psum_inplace(a, "i");
      pmap::psum_inplace(alone_counts, "i");
      bool same = values(std::get<0>(packed)) == values(alone) &&
                  std::get<1>(packed).to_vector<std::int32_t>() == alone_counts.to_vector<std::int32_t>() &&
                  std::get<0>(packed).at("b").shape() == pmap::Shape{1, 1};
      // pmean: the f32 leaves alone.
      Floats mean_packed = floats(d), mean_alone = floats(d);
      const auto before_mean = pmap::collectives_entered();
      pmap::pmean_inplace(mean_packed, "i");
      const auto entered_mean = pmap::collectives_entered() - before_mean;
      for (auto& [name, a] : mean_alone) pmap::pmean_inplace(a, "i");
      same = same && values(mean_packed) == values(mean_alone);
      return std::tuple(same, entered, entered_mean, std::get<2>(packed), values(mean_packed));
    }, cpu_mesh(n))(0);
    for (const auto& [same, entered, entered_mean, scalar, means] : out.values()) {
      CHECK(same);  // bitwise: packed, each element is the same sum in the same device order
      CHECK(entered == 3u);       // the f32 leaves, the i32 leaf, the scalar
      CHECK(entered_mean == 1u);  // every leaf in one, on cpu:0 or not
      CHECK(scalar == doctest::Approx(0.05 * n * (n + 1)));
      CHECK(means == std::get<4>(out[0]));  // the same on every device
    }
  }
}

TEST_CASE("a packed tree collective: devices whose leaves split the same total differently are a mismatch") {
  auto mesh = cpu_mesh(2);
  CHECK_THROWS_AS(pmap::pmap([](int) {
    const std::int64_t first = pmap::axis_index("i") == 0 ? 2 : 3;  // (2, 3) against (3, 2)
    std::vector<pmap::Array> t;
    t.push_back(pmap::Array::from_host(std::vector<float>(static_cast<std::size_t>(first), 1.0f), {first}));
    t.push_back(pmap::Array::from_host(std::vector<float>(static_cast<std::size_t>(5 - first), 1.0f), {5 - first}));
    pmap::psum_inplace(t, "i");
  }, mesh)(0), pmap::CollectiveMismatch);
}

TEST_CASE("a tree's in-place collectives refuse a leaf before reducing any") {
  pmap::pmap([](int) {
    std::map<std::string, pmap::Array> t;
    t.emplace("a", pmap::Array::from_host(std::vector<float>{1, 2}, {2}));
    t.emplace("b", pmap::Array::from_host(std::vector<std::int32_t>{3}, {1}));
    CHECK_THROWS_WITH_AS(pmap::pmean_inplace(t, "i"), doctest::Contains("pmean"), pmap::ValueError);
    CHECK(t.at("a").to_vector<float>() == std::vector<float>{1, 2});  // untouched
    CHECK(pmap::collectives_entered() == 0u);
  }, cpu_mesh(2))(0);
}

TEST_CASE("shard, unshard, replicate, unreplicate") {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"data", 2}, {"model", 2}});
  std::vector<float> v(8);
  for (int k = 0; k < 8; ++k) v[static_cast<std::size_t>(k)] = static_cast<float>(k);
  std::vector<pmap::Array> tree;
  tree.push_back(pmap::Array::from_host(v, {8}));
  tree.push_back(pmap::Array::from_host(v, {8, 1}));
  auto all = pmap::shard(tree, mesh);  // 4 blocks of 2
  auto by_data = pmap::shard(tree, mesh, "data");  // 2 blocks of 4, same along "model"
  auto rep = pmap::replicate(tree, mesh);
  auto sums = pmap::pmap([](const std::vector<pmap::Array>& a, const std::vector<pmap::Array>& b,
                            const std::vector<pmap::Array>& c) {
    auto sum = [](const pmap::Array& x) {
      float s = 0;
      for (float f : x.to_vector<float>()) s += f;
      return s;
    };
    return std::vector<float>{sum(a[0]), sum(b[1]), sum(c[0])};
  }, mesh)(all, by_data, rep);
  CHECK(sums[0] == std::vector<float>{1, 6, 28});   // rows 0,1 | 0..3 | all
  CHECK(sums[1] == std::vector<float>{5, 6, 28});   // rows 2,3 | 0..3
  CHECK(sums[2] == std::vector<float>{9, 22, 28});  // rows 4,5 | 4..7
  CHECK(sums[3] == std::vector<float>{13, 22, 28});
  auto back = pmap::unshard(all, mesh);
  CHECK(back[1].shape() == pmap::Shape{8, 1});
  CHECK(back[0].to_vector<float>() == v);
  CHECK(pmap::unshard(by_data, mesh, "data")[0].to_vector<float>() == v);
  CHECK(pmap::unreplicate(rep)[1].to_vector<float>() == v);

  std::vector<pmap::Array> odd;
  odd.push_back(pmap::Array({6}, pmap::DType::f32));
  CHECK_THROWS_WITH_AS(pmap::shard(odd, mesh), doctest::Contains("leading size 6 of '0' is not divisible by 4"),
                       pmap::ShapeError);
  odd.push_back(pmap::Array({8}, pmap::DType::f32));
  CHECK_THROWS_WITH_AS(pmap::shard(odd, mesh), doctest::Contains("'0' has 6; '1' has 8"), pmap::ShapeError);
  CHECK_THROWS_AS(pmap::shard(3.0f, mesh), pmap::ShapeError);
}

TEST_CASE("unknown axis names raise AxisError listing the axes in scope") {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"data", 2}, {"model", 2}});
  CHECK_THROWS_WITH_AS(pmap::pmap([] { pmap::psum(1, "batch"); }, mesh)(),
                       doctest::Contains("unknown axis name 'batch'; axes in scope: 'data', 'model'"), pmap::AxisError);
  CHECK_THROWS_AS(pmap::pmap([] {}, mesh, "nope"), pmap::AxisError);
  CHECK_THROWS_AS(pmap::pmap([] {}, mesh, "data"), pmap::AxisError);  // pmap must name every axis or none
  CHECK_THROWS_AS(mesh.axis_size("x"), pmap::AxisError);
  CHECK_THROWS_AS(pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 3), {{"a", 2}}), pmap::ShapeError);
  CHECK_THROWS_AS(pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"a", 2}, {"a", 2}}), pmap::AxisError);
}

TEST_CASE("mapped arguments with different sizes raise ShapeError naming each argument") {
  auto mesh = cpu_mesh(4);
  pmap::Sharded<int> good(std::vector<int>(4, 1)), bad(std::vector<int>(3, 1));
  CHECK_THROWS_WITH_AS(pmap::pmap([](int, int, int) {}, mesh)(good, 5, bad),
                       doctest::Contains("argument 0 has 4; argument 2 has 3"), pmap::ShapeError);
}

TEST_CASE("collectives outside pmap and nested pmap are errors") {
  auto mesh = cpu_mesh(2);
  CHECK_THROWS_AS(pmap::psum(1, "i"), pmap::Error);
  CHECK_THROWS_WITH(pmap::pmap([&] { pmap::pmap([] {}, mesh)(); }, mesh)(), doctest::Contains("nested pmap"));
}

}  // namespace PMAPCC_TEST_FILE
