// Collectives on CUDA meshes, with computed expectations (device r contributes r + 1; for pmax and pmin,
// also negatives, infinities and NaN): NCCL over all GPUs (one device per GPU), and virtual devices sharing
// one GPU (the device hub), whose results are bitwise those of CPU devices. Each case skips itself without
// a GPU.
#include "cuda_testing.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using namespace cuda_testing;

pmap::Array filled_on(const pmap::Device& d, std::int64_t n, float v) {
  return pmap::Array::from_host(std::vector<float>(static_cast<std::size_t>(n), v), {n}, d);
}

// What device r of n contributes to the pmax/pmin check: values whose order NCCL's order keys must keep
// (review F2, N1): all negative (pmax -1, pmin -n), NaN on the last or the first device, +inf on the last,
// -inf on the first, and signs mixed across the devices.
template <class F> std::vector<F> max_min_values(int r, int n) {
  const F nan = std::numeric_limits<F>::quiet_NaN(), inf = std::numeric_limits<F>::infinity();
  const F fr = static_cast<F>(r), fn = static_cast<F>(n);
  return {-(fr + 1), r == n - 1 ? nan : fr, r == 0 ? nan : -fr, r == n - 1 ? inf : -(fr + 1),
          r == 0 ? -inf : fr - F(0.5), fr - fn / 2 - F(0.25)};
}

// a max b (or min), NaN propagating as the CPU devices' pmax and pmin do (src/reduce.h).
template <class F> F max_or_min(F a, F b, bool max) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
  return max ? (a < b ? b : a) : (b < a ? b : a);
}

// pmax and pmin over "i" of max_min_values<F>, on device r of n, against their fold on the host.
template <class F> void check_max_min(const pmap::Device& here, int r, int n) {
  std::vector<std::vector<F>> all;
  for (int k = 0; k < n; ++k) all.push_back(max_min_values<F>(k, n));
  const std::vector<F>& mine = all[static_cast<std::size_t>(r)];
  const auto x = pmap::Array::from_host(mine, {static_cast<std::int64_t>(mine.size())}, here);
  for (const bool max : {true, false}) {
    const std::vector<F> got = (max ? pmap::pmax(x, "i") : pmap::pmin(x, "i")).template to_vector<F>();
    REQUIRE(got.size() == mine.size());
    CHECK(got[0] == (max ? F(-1) : -static_cast<F>(n)));
    for (std::size_t i = 0; i < mine.size(); ++i) {
      F want = all[0][i];
      for (int k = 1; k < n; ++k) want = max_or_min(want, all[static_cast<std::size_t>(k)][i], max);
      const bool same = std::isnan(want) ? std::isnan(got[i]) : got[i] == want;
      CHECK_MESSAGE(same, (max ? "pmax" : "pmin") << " of element " << i << " on device " << r << " of " << n
                                                  << ": " << got[i] << ", expected " << want);
    }
  }
}

// psum, pmean, pmax, pmin (on negatives, infinities and NaN too, in f32 and f64), all_gather (stacked and
// tiled), psum_scatter, ppermute and a scalar psum on every device of `mesh` along axis "i", checked against
// exact expectations.
void check_collectives(const pmap::Mesh& mesh) {
  const int n = mesh.size();
  const float tri = static_cast<float>(n * (n + 1) / 2);
  pmap::pmap([&]() {
    const pmap::Device here = pmap::current_device();
    const int r = pmap::axis_index("i");
    pmap::Array x = filled_on(here, 1000, static_cast<float>(r + 1));
    CHECK(pmap::psum(x, "i").to_vector<float>() == std::vector<float>(1000, tri));
    CHECK(pmap::pmean(x, "i").to_vector<float>() == std::vector<float>(1000, tri / static_cast<float>(n)));
    CHECK(pmap::pmax(x, "i").to_vector<float>() == std::vector<float>(1000, static_cast<float>(n)));
    CHECK(pmap::pmin(x, "i").to_vector<float>() == std::vector<float>(1000, 1.0f));
    check_max_min<float>(here, r, n);
    check_max_min<double>(here, r, n);
    pmap::psum_inplace(x, "i");
    CHECK(x.to_vector<float>() == std::vector<float>(1000, tri));
    CHECK(pmap::psum(r + 1, "i") == n * (n + 1) / 2);  // a host scalar, staged onto the device
    auto v = pmap::Array::from_host(std::vector<std::int32_t>{r, 10 * r}, {2}, here);
    std::vector<std::int32_t> expect;
    for (int k = 0; k < n; ++k) expect.insert(expect.end(), {k, 10 * k});
    CHECK(pmap::all_gather(v, "i").to_vector<std::int32_t>() == expect);
    CHECK(pmap::all_gather(v, "i", true).to_vector<std::int32_t>() == expect);
    std::vector<float> blocks;
    for (int k = 0; k < n; ++k) blocks.insert(blocks.end(), 3, static_cast<float>((r + 1) * (k + 1)));
    auto mine = pmap::psum_scatter(pmap::Array::from_host(blocks, {n, 3}, here), "i");
    CHECK(mine.to_vector<float>() == std::vector<float>(3, tri * static_cast<float>(r + 1)));
    std::vector<std::pair<int, int>> ring;
    for (int k = 0; k < n; ++k) ring.emplace_back(k, (k + 1) % n);
    auto shifted = pmap::ppermute(filled_on(here, 4, static_cast<float>(r)), "i", ring);
    CHECK(shifted.to_vector<float>() == std::vector<float>(4, static_cast<float>((r + n - 1) % n)));
    pmap::barrier("i");
  }, mesh, "i")();
}

// Random per-device floats reduced on `mesh`: device d contributes values[d].
std::vector<std::vector<float>> psum_of(const pmap::Mesh& mesh, const std::vector<std::vector<float>>& values) {
  std::vector<std::vector<float>> out(values.size());
  pmap::pmap([&]() {
    const int r = pmap::axis_index("i");
    auto x = pmap::Array::from_host(values[static_cast<std::size_t>(r)],
                                    {static_cast<std::int64_t>(values[0].size())}, pmap::current_device());
    out[static_cast<std::size_t>(r)] = pmap::psum(x, "i").to_vector<float>();
  }, mesh, "i")();
  return out;
}

}  // namespace

TEST_CASE("collectives on CPU devices: the expectations of the CUDA collective checks hold") {
  for (int n : {1, 3}) check_collectives(pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), "i"));
}

TEST_CASE("cuda NCCL collectives over every GPU, one device per GPU") {
  PMAPCC_REQUIRE_GPU();
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cuda), "i");
  MESSAGE("GPUs: " << mesh.size() << (pmap::build_info().nccl && mesh.size() > 1 ? " (NCCL)" : " (device hub)"));
  check_collectives(mesh);
  check_collectives(mesh);  // a second pmap on the same communicators
}

TEST_CASE("cuda NCCL path on one GPU: a one-device mesh forced onto NCCL (PMAPCC_NCCL_SINGLE_GPU=1)") {
  PMAPCC_REQUIRE_GPU();
  if (!pmap::build_info().nccl) {
    MESSAGE("built without NCCL: skipped");
    return;
  }
  setenv("PMAPCC_NCCL_SINGLE_GPU", "1", 1);
  {
    pmap::Mesh mesh({kGpu}, "i");  // init, split, barrier, every collective, finalize
    check_collectives(mesh);
  }
  unsetenv("PMAPCC_NCCL_SINGLE_GPU");
}

TEST_CASE("cuda virtual devices: 4 logical devices on one GPU meet on the GPU") {
  PMAPCC_REQUIRE_GPU();
  std::vector<pmap::Device> devices;
  for (int i = 0; i < 4; ++i) devices.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  pmap::Mesh mesh(devices, "i");
  check_collectives(mesh);
}

TEST_CASE("cuda virtual devices reduce in device order: bitwise the CPU devices' psum") {
  PMAPCC_REQUIRE_GPU();
  // 4 devices on GPU 0, and 2 per GPU spread round-robin over every GPU (one GPU: the same case).
  const int gpus = pmap::cuda_device_count();
  std::vector<pmap::Device> on_one;
  for (int i = 0; i < 4; ++i) on_one.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  for (const auto& devices : {on_one, pmap::local_devices(pmap::DeviceKind::cuda, 2 * gpus)}) {
    const std::size_t n = devices.size();
    CAPTURE(n);
    std::vector<std::vector<float>> values;
    for (std::uint32_t d = 0; d < n; ++d) values.push_back(random_floats(4099, 100 + d, -1e3f, 1e3f));
    pmap::Mesh gpu_mesh(devices, "i");
    pmap::Mesh cpu_mesh(pmap::local_devices(pmap::DeviceKind::cpu, static_cast<int>(n)), "i");
    const auto on_gpu_result = psum_of(gpu_mesh, values);
    const auto on_cpu_result = psum_of(cpu_mesh, values);
    for (std::size_t d = 0; d < n; ++d) CHECK(on_gpu_result[d] == on_cpu_result[0]);
    for (std::size_t d = 0; d < n; ++d) CHECK(on_cpu_result[d] == on_cpu_result[0]);
    check_collectives(gpu_mesh);
  }
}

namespace {

// A 2x2 ("data", "model") mesh: device (d, m) holds 10 d + m + 1 (1, 2, 11, 12); psum over either axis
// and over both. Run on CPU devices too, so that the expectations themselves are checked without a GPU.
void check_2d_collectives(const std::vector<pmap::Device>& devices) {
  pmap::Mesh mesh(devices, {{"data", 2}, {"model", 2}});
  pmap::pmap([&]() {
    const int data = pmap::axis_index("data"), model = pmap::axis_index("model");
    auto x = filled_on(pmap::current_device(), 8, static_cast<float>(10 * data + model + 1));
    CHECK(pmap::psum(x, "model").to_vector<float>() == std::vector<float>(8, static_cast<float>(20 * data + 3)));
    CHECK(pmap::psum(x, "data").to_vector<float>() == std::vector<float>(8, static_cast<float>(12 + 2 * model)));
    CHECK(pmap::psum(x, {"data", "model"}).to_vector<float>() == std::vector<float>(8, 26.0f));
    // all_gather along the last axis, tiled: row i holds the 'model' devices' rows i side by side (on a GPU,
    // the stacked gather laid out by cuda_copy_blocks).
    auto row = [&](int m, int i) {
      const float v = static_cast<float>(10 * data + m + 1) * static_cast<float>(i + 1);
      return std::vector<float>{v, v + 0.5f};
    };
    std::vector<float> mine = row(model, 0), expect;
    for (float f : row(model, 1)) mine.push_back(f);
    for (int i = 0; i < 2; ++i)
      for (int m = 0; m < 2; ++m)
        for (float f : row(m, i)) expect.push_back(f);
    const auto y = pmap::Array::from_host(mine, {2, 2}, pmap::current_device());
    CHECK(pmap::all_gather(y, "model", -1, true).to_vector<float>() == expect);
  }, mesh)();
}

}  // namespace

namespace {

// all_to_all's expectation from its definition. Device d holds x_d of `shape` with x_d[f] = 1000 d + f (f the
// flat index); the result on device r, element by element: the source device j and x_j's index it came from.
// `out` gets the result's shape.
std::vector<float> all_to_all_expected(const pmap::Shape& shape, int s, int c, bool tiled, int n, int r,
                                       pmap::Shape& out) {
  const int rank = static_cast<int>(shape.size());
  if (s < 0) s += rank;
  if (c < 0) c += rank;
  out = shape;
  const std::int64_t k = shape[static_cast<std::size_t>(s)] / n;  // a chunk's size along the split axis
  if (tiled) {
    out[static_cast<std::size_t>(s)] /= n;
    out[static_cast<std::size_t>(c)] *= n;
  } else {
    out.erase(out.begin() + s);
    out.insert(out.begin() + c, n);
  }
  std::int64_t total = 1;
  for (auto e : out) total *= e;
  std::vector<float> expect;
  for (std::int64_t flat = 0; flat < total; ++flat) {
    std::vector<std::int64_t> o(out.size());  // the output's index
    for (std::int64_t rest = flat, d = static_cast<std::int64_t>(out.size()) - 1; d >= 0; --d) {
      o[static_cast<std::size_t>(d)] = rest % out[static_cast<std::size_t>(d)];
      rest /= out[static_cast<std::size_t>(d)];
    }
    std::int64_t j = 0;
    std::vector<std::int64_t> src;  // x_j's index
    if (tiled) {
      src = o;
      const auto uc = static_cast<std::size_t>(c), us = static_cast<std::size_t>(s);
      if (s == c) {
        j = o[us] / k;
        src[us] = r * k + o[us] % k;
      } else {
        j = o[uc] / shape[uc];
        src[uc] = o[uc] % shape[uc];
        src[us] = r * k + o[us];
      }
    } else {
      j = o[static_cast<std::size_t>(c)];
      src = o;
      src.erase(src.begin() + c);
      src.insert(src.begin() + s, r);
    }
    std::int64_t f = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + src[d];
    expect.push_back(static_cast<float>(1000 * j + f));
  }
  return expect;
}

// all_to_all over "i" of every kind of call (tiled or not, each pair of axes, negative axes, a zero-size
// axis), against all_to_all_expected; then the errors.
void check_all_to_all(const pmap::Mesh& mesh) {
  const int n = static_cast<int>(mesh.size());
  struct Call {
    pmap::Shape shape;
    int s, c;
    bool tiled;
  };
  std::vector<Call> calls;
  const std::int64_t ni = n;
  for (int s = 0; s < 3; ++s)
    for (int c = 0; c < 3; ++c) {
      pmap::Shape split{2, 3, 2};
      split[static_cast<std::size_t>(s)] = ni;  // not tiled: the split axis is n long
      calls.push_back({split, s, c, false});
      pmap::Shape tiles{2, 3, 2};
      tiles[static_cast<std::size_t>(s)] = 2 * ni;  // tiled: chunks of 2
      calls.push_back({tiles, s, c, true});
    }
  calls.push_back({{ni}, 0, 0, false});           // a vector: the identity's transpose across devices
  calls.push_back({{3 * ni, 2}, -2, -1, true});   // negative axes
  calls.push_back({{2, ni}, -1, -2, false});
  calls.push_back({{ni, 0}, 0, 1, true});         // nothing to move
  pmap::pmap([&] {
    const int r = pmap::axis_index("i");
    for (const Call& call : calls) {
      CAPTURE(call.s);
      CAPTURE(call.c);
      CAPTURE(call.tiled);
      CAPTURE(call.shape.size());
      std::int64_t size = 1;
      for (auto e : call.shape) size *= e;
      std::vector<float> mine(static_cast<std::size_t>(size));
      for (std::size_t f = 0; f < mine.size(); ++f) mine[f] = static_cast<float>(1000 * r + static_cast<int>(f));
      const auto x = pmap::Array::from_host(mine, call.shape, pmap::current_device());
      const auto y = pmap::all_to_all(x, "i", call.s, call.c, call.tiled);
      CHECK(y.device() == pmap::current_device());
      pmap::Shape shape;
      CHECK(y.to_vector<float>() == all_to_all_expected(call.shape, call.s, call.c, call.tiled, n, r, shape));
      CHECK(y.shape() == shape);
      // Done again with the axes swapped it is the identity (what its gradient relies on).
      const auto back = pmap::all_to_all(y, "i", call.c, call.s, call.tiled);
      CHECK(back.shape() == x.shape());
      CHECK(back.to_vector<float>() == mine);
    }
    // 2n + 1 elements: not n (not tiled), and not divisible by n for n >= 2 (tiled).
    const auto x = pmap::Array::from_host(std::vector<float>(static_cast<std::size_t>(2 * n + 1), 1.0f),
                                          {2 * ni + 1}, pmap::current_device());
    CHECK_THROWS_WITH_AS(pmap::all_to_all(x, "i", 1, 0), doctest::Contains("split_axis must be in [-1, 1)"),
                         pmap::ShapeError);
    CHECK_THROWS_WITH_AS(pmap::all_to_all(x, "i", 0, -2, true), doctest::Contains("concat_axis must be in [-1, 1)"),
                         pmap::ShapeError);
    CHECK_THROWS_WITH_AS(pmap::all_to_all(x, "i", 0, 0), doctest::Contains("which must equal the"), pmap::ShapeError);
    if (n > 1) {
      CHECK_THROWS_WITH_AS(pmap::all_to_all(x, "i", 0, 0, true), doctest::Contains("not divisible by the"),
                           pmap::ShapeError);
    }
    CHECK_THROWS_WITH_AS(pmap::all_to_all(pmap::Array::scalar(1.0f), "i", 0, 0),
                         doctest::Contains("a scalar has no axis to split"), pmap::ShapeError);
    CHECK_THROWS_AS(pmap::all_to_all(x, "j", 0, 0, true), pmap::AxisError);
  }, mesh)();
}

}  // namespace

TEST_CASE("all_to_all as JAX's, tiled or not, on 1, 2, 3 and 8 CPU devices") {
  for (int n : {1, 2, 3, 8}) {
    CAPTURE(n);
    check_all_to_all(pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), "i"));
  }
}

TEST_CASE("cuda all_to_all: over every GPU (NCCL) and on 4 virtual devices of one GPU") {
  PMAPCC_REQUIRE_GPU();
  check_all_to_all(pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cuda), "i"));
  std::vector<pmap::Device> devices;
  for (int i = 0; i < 4; ++i) devices.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  check_all_to_all(pmap::Mesh(devices, "i"));
}

TEST_CASE("cuda virtual devices on a 2-D mesh: collectives over either axis and both") {
  check_2d_collectives(pmap::local_devices(pmap::DeviceKind::cpu, 4));
  PMAPCC_REQUIRE_GPU();
  std::vector<pmap::Device> devices;
  for (int i = 0; i < 4; ++i) devices.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  check_2d_collectives(devices);
}

TEST_CASE("cuda: an exception on one device releases the others waiting in a collective") {
  PMAPCC_REQUIRE_GPU();
  std::vector<pmap::Device> devices;
  for (int i = 0; i < 3; ++i) devices.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  pmap::Mesh mesh(devices, "i");
  auto failing = pmap::pmap([&]() {
    if (pmap::axis_index("i") == 1) throw pmap::ValueError("device 1 gives up");
    auto x = filled_on(pmap::current_device(), 4, 1.0f);
    pmap::psum_inplace(x, "i");
  }, mesh, "i");
  CHECK_THROWS_AS(failing(), pmap::ValueError);
  check_collectives(mesh);  // the mesh still works afterwards
}

}  // namespace PMAPCC_TEST_FILE
