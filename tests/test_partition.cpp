// pmap::P and shard / unshard by specs (include/pmap/partition.h, transfer.h): blocks along any dimension,
// tuples of axes, replication along the axes a spec does not name, and the errors that name the leaf.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include <pmap/pmap.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using pmap::Array;
using pmap::AxisNames;
using pmap::P;
using Tree = std::map<std::string, Array>;

// x[i0, i1, ...] = its row-major offset (as f32 or i32).
template <class T> Array iota(const pmap::Shape& shape) {
  std::vector<T> v(static_cast<std::size_t>(pmap::num_elements(shape)));
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<T>(k);
  return Array::from_host(v, shape);
}

// The elements of x (row-major offsets of `whole`) in block [lo, lo + n) along each dimension.
std::vector<float> expected_block(const pmap::Shape& whole, const std::vector<std::int64_t>& lo,
                                  const std::vector<std::int64_t>& n) {
  std::vector<float> out;
  std::vector<std::int64_t> at(whole.size(), 0);
  const std::int64_t count = pmap::num_elements(pmap::Shape(n.begin(), n.end()));
  for (std::int64_t k = 0; k < count; ++k) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < whole.size(); ++d) off = off * whole[d] + lo[d] + at[d];
    out.push_back(static_cast<float>(off));
    for (std::size_t d = whole.size(); d-- > 0;) {
      if (++at[d] < n[d]) break;
      at[d] = 0;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("P: entries, replication and JAX's printed form") {
  CHECK(P().str() == "P()");
  CHECK(P().replicated());
  CHECK(P(pmap::none, pmap::none).replicated());
  CHECK(P("data", pmap::none).str() == "P('data', None)");
  CHECK(P(AxisNames{"data", "model"}, pmap::none, std::string("model")).str() == "P(('data', 'model'), None, 'model')");
  CHECK(P(pmap::none, "model").axes_of(1).names() == std::vector<std::string>{"model"});
  CHECK(P(pmap::none, "model").axes_of(5).empty());
  CHECK(P("data") == P::from_dims({AxisNames("data")}));
  CHECK(P::from_dims({AxisNames{"data", "model"}, AxisNames()}) == P(AxisNames{"data", "model"}, pmap::none));
  const P copied = P("data");
  P again = copied;  // a copy, not a spec of a spec
  CHECK(again == copied);
}

TEST_CASE("shard by specs: any dimension, tuples of axes, replicated along the axes not named, unshard inverts") {
  // 6 devices, (data, model) = (2, 3), row-major: device 3 * i + j is at (i, j).
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 6), {{"data", 2}, {"model", 3}});
  Tree tree;
  tree.emplace("Dense_0/kernel", iota<float>({4, 6, 5}));
  tree.emplace("Dense_0/bias", iota<float>({2, 6}));
  tree.emplace("rows", iota<float>({12}));
  tree.emplace("whole", iota<float>({3, 2}));
  tree.emplace("labels", iota<std::int32_t>({6, 3}));
  const pmap::Specs specs{{"Dense_0/kernel", P("data", "model")},
                          {"Dense_0/bias", P(pmap::none, "model")},
                          {"rows", P(AxisNames{"model", "data"})},  // "model" major
                          {"labels", P("model")}};
  auto sharded = pmap::shard(tree, mesh, specs);
  REQUIRE(sharded.size() == 6);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      CAPTURE(i);
      CAPTURE(j);
      const Tree& t = sharded[static_cast<std::size_t>(3 * i + j)];
      CHECK(t.at("Dense_0/kernel").device() == mesh.devices()[static_cast<std::size_t>(3 * i + j)]);
      CHECK(t.at("Dense_0/kernel").shape() == pmap::Shape{2, 2, 5});
      CHECK(t.at("Dense_0/kernel").to_vector<float>() == expected_block({4, 6, 5}, {2 * i, 2 * j, 0}, {2, 2, 5}));
      CHECK(t.at("Dense_0/bias").to_vector<float>() == expected_block({2, 6}, {0, 2 * j}, {2, 2}));  // same for i
      CHECK(t.at("rows").to_vector<float>() == expected_block({12}, {2 * (2 * j + i)}, {2}));
      CHECK(t.at("whole").to_vector<float>() == tree.at("whole").to_vector<float>());  // not named: replicated
      const auto labels = t.at("labels").to_vector<std::int32_t>();
      const auto want = expected_block({6, 3}, {2 * j, 0}, {2, 3});
      CHECK(std::vector<float>(labels.begin(), labels.end()) == want);
    }
  }
  // The value knows its specs, in tree order, the leaves not named replicated.
  REQUIRE(sharded.specs().size() == 5);
  CHECK(sharded.specs()[0].path == "Dense_0/bias");
  CHECK(sharded.specs()[0].spec == P(pmap::none, "model"));
  CHECK(sharded.specs()[4].path == "whole");
  CHECK(sharded.specs()[4].spec == P());
  // Inside pmap each device sees its block.
  auto sums = pmap::pmap([](const Tree& t) {
    double s = 0;
    for (float f : t.at("Dense_0/kernel").to_vector<float>()) s += f;
    return s;
  }, mesh)(sharded);
  double total = 0;
  for (double s : sums) total += s;
  CHECK(total == 119.0 * 120.0 / 2.0);  // every block once: the sum of 0..119
  // unshard reads the specs the value carries; bit for bit, every dtype.
  const Tree back = pmap::unshard(sharded, mesh);
  for (const auto& [path, leaf] : tree) {
    CAPTURE(path);
    CHECK(back.at(path).shape() == leaf.shape());
    CHECK(back.at(path).dtype() == leaf.dtype());
    CHECK(back.at(path).device() == pmap::Device{});
  }
  CHECK(back.at("Dense_0/kernel").to_vector<float>() == tree.at("Dense_0/kernel").to_vector<float>());
  CHECK(back.at("rows").to_vector<float>() == tree.at("rows").to_vector<float>());
  CHECK(back.at("labels").to_vector<std::int32_t>() == tree.at("labels").to_vector<std::int32_t>());
  // ... or specs given again; one spec for every leaf; a lone Array (path "").
  CHECK(pmap::unshard(sharded, mesh, specs).at("Dense_0/bias").to_vector<float>() ==
        tree.at("Dense_0/bias").to_vector<float>());
  auto cols = pmap::shard(iota<float>({2, 6}), mesh, P(pmap::none, AxisNames{"data", "model"}));
  CHECK(cols[4].to_vector<float>() == expected_block({2, 6}, {0, 4}, {2, 1}));  // device (1, 1): block 1 * 3 + 1
  CHECK(pmap::unshard(cols, mesh).to_vector<float>() == iota<float>({2, 6}).to_vector<float>());
  // A braced tuple of axes is still shard's leading axis over those axes (Specs is not a std::map), and a
  // spec set leaf by leaf is the same as one given whole.
  auto leading = pmap::shard(iota<float>({12}), mesh, {"data", "model"});
  CHECK(leading[4].to_vector<float>() == expected_block({12}, {8}, {2}));  // device (1, 1): block 4
  CHECK(leading.specs().empty());
  pmap::Specs one;
  one.set("rows", P(AxisNames{"model", "data"}));
  CHECK(one.by_path().at("rows") == specs.by_path().at("rows"));
  CHECK(pmap::unshard(cols, mesh, P(pmap::none, AxisNames{"data", "model"})).to_vector<float>() ==
        iota<float>({2, 6}).to_vector<float>());
  // A 0-d leaf: every device's copy, and back.
  auto scalar = pmap::shard(Array::scalar(5.0f), mesh, P());
  CHECK(scalar[3].shape() == pmap::Shape{});
  CHECK(pmap::unshard(scalar, mesh).item<float>() == 5.0f);
  // A leaf with a dimension of 0: empty blocks, and back.
  auto empty = pmap::shard(Array(pmap::Shape{0, 3}, pmap::DType::f32), mesh, P("data"));
  CHECK(empty[5].shape() == pmap::Shape{0, 3});
  CHECK(pmap::unshard(empty, mesh).shape() == pmap::Shape{0, 3});
}

TEST_CASE("shard by specs: bad specs raise naming the leaf, the dimension and the axis") {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"data", 2}, {"model", 2}});
  Tree tree;
  tree.emplace("w", iota<float>({4, 6}));
  auto shard_w = [&](P spec) { return pmap::shard(tree, mesh, pmap::Specs{{"w", std::move(spec)}}); };
  CHECK_THROWS_WITH_AS(shard_w(P(pmap::none, "expert")),
                       doctest::Contains("shard: 'w' f32(4, 6): dimension 1 of spec P(None, 'expert') names axis "
                                         "'expert', which Mesh(data=2, model=2"),
                       pmap::AxisError);
  CHECK_THROWS_WITH_AS(shard_w(P("data", "data")),
                       doctest::Contains("'w' f32(4, 6): spec P('data', 'data') names axis 'data' twice (again at "
                                         "dimension 1)"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(shard_w(P(AxisNames{"model", "model"})), doctest::Contains("names axis 'model' twice"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(shard_w(P("data", pmap::none, "model")),
                       doctest::Contains("'w' f32(4, 6) has 2 dimension(s), but its spec P('data', None, 'model') "
                                         "gives 3 (dimension 2: 'model')"),
                       pmap::ShapeError);
  CHECK_THROWS_WITH_AS(pmap::shard(Array::scalar(1.0f), mesh, P("data")),
                       doctest::Contains("shard: the array f32() has 0 dimension(s), but its spec P('data') gives 1 "
                                         "(dimension 0: 'data')"),
                       pmap::ShapeError);
  tree.at("w") = iota<float>({4, 5});
  CHECK_THROWS_WITH_AS(shard_w(P(pmap::none, "model")),
                       doctest::Contains("'w' f32(4, 5): dimension 1 (size 5) does not split evenly over 'model' (2 devices)"),
                       pmap::ShapeError);
  CHECK_THROWS_WITH_AS(pmap::shard(tree, mesh, pmap::Specs{{"v", P("data")}}),
                       doctest::Contains("shard: the specs name 'v' (P('data')), which is not an array leaf of the "
                                         "tree (its array leaves: 'w')"),
                       pmap::ValueError);
  // unshard: specs that do not fit the blocks, and blocks of different shapes.
  auto rows = pmap::shard(tree, mesh, P("data"));
  CHECK_THROWS_WITH_AS(pmap::unshard(rows, mesh, pmap::Specs{{"w", P(pmap::none, "nope")}}),
                       doctest::Contains("unshard: 'w' f32(2, 5) (a block): dimension 1 of spec P(None, 'nope') "
                                         "names axis 'nope'"),
                       pmap::AxisError);
  CHECK_THROWS_WITH_AS(pmap::unshard(rows, mesh, pmap::Specs{{"w", P("data", pmap::none, "model")}}),
                       doctest::Contains("unshard: 'w' f32(2, 5) (a block) has 2 dimension(s)"), pmap::ShapeError);
  rows[2].at("w") = iota<float>({2, 4});  // device 2, (1, 0): the first holder of block 1 (device 3 is not read)
  CHECK_THROWS_WITH_AS(pmap::unshard(rows, mesh),
                       doctest::Contains("unshard: 'w': a device's block is f32(2, 4), not f32(2, 5)"), pmap::ShapeError);
  rows[1].erase("w");
  CHECK_THROWS_WITH_AS(pmap::unshard(rows, mesh),
                       doctest::Contains("unshard: local device 1's tree has 0 arrays, the first device's 1"),
                       pmap::ShapeError);
}

}  // namespace PMAPCC_TEST_FILE
