// pmap::ops::eager (kernels/eager/array_ops.h): every function against a loop written here, on the CPU backend and
// on the CUDA kernels run on the host (pmap::ops::detail::ScopedBackend), the two bitwise equal where the header
// says so; inside pmap on CPU devices (a data-parallel gradient equal to the one-device one); every error path;
// and, when a GPU is usable, the same functions on CUDA devices inside pmap against the CPU.
#include "cuda_testing.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::random_floats;
using cuda_testing::random_labels;
using cuda_testing::relative_error;
using pmap::Array;
using pmap::Shape;
namespace ops = pmap::ops::eager;

Array host(const std::vector<float>& v, Shape shape, const pmap::Device& d = {}) {
  return Array::from_host(v, std::move(shape), d);
}

std::vector<float> values(const Array& a) { return a.to_vector<float>(); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// (n, k) @ (k, o) in double, the operands given with their row strides and transposition.
std::vector<float> naive_matmul(const std::vector<float>& a, bool ta, const std::vector<float>& b, bool tb, int n,
                                int k, int o) {
  std::vector<float> c(static_cast<std::size_t>(n) * o);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < o; ++j) {
      double acc = 0.0;
      for (int p = 0; p < k; ++p) {
        const float x = ta ? a[static_cast<std::size_t>(p) * n + i] : a[static_cast<std::size_t>(i) * k + p];
        const float y = tb ? b[static_cast<std::size_t>(j) * k + p] : b[static_cast<std::size_t>(p) * o + j];
        acc += static_cast<double>(x) * y;
      }
      c[static_cast<std::size_t>(i) * o + j] = static_cast<float>(acc);
    }
  }
  return c;
}

// The backends a host array can be computed by: the active CPU variant, and the CUDA kernels on the host.
struct HostBackend {
  const char* name;
  const pmap::kernels::Backend* backend;
};
std::vector<HostBackend> host_backends() {
  return {{"cpu", &pmap::kernels::backend_for(pmap::DeviceKind::cpu)},
          {"cuda-on-host", &pmap::kernels::cuda_backend_on_host()}};
}

}  // namespace

TEST_CASE("ops::matmul and ops::linear equal a double-precision loop, in all three forms") {
  const int n = 37, k = 19, o = 11;
  const auto a = random_floats(static_cast<std::size_t>(n) * k, 1);
  const auto b = random_floats(static_cast<std::size_t>(k) * o, 2);
  const auto bt = random_floats(static_cast<std::size_t>(o) * k, 3);  // (o, k), used transposed
  const auto dy = random_floats(static_cast<std::size_t>(n) * o, 4);
  const auto bias = random_floats(static_cast<std::size_t>(o), 5);
  for (const auto& hb : host_backends()) {
    CAPTURE(hb.name);
    pmap::ops::detail::ScopedBackend scope(*hb.backend);
    Array y = ops::matmul(host(a, {n, k}), host(b, {k, o}));
    CHECK(y.shape() == Shape{n, o});
    CHECK(relative_error(values(y), naive_matmul(a, false, b, false, n, k, o)) < 1e-6);
    // a (n, k) @ bt^T (k, o)
    Array yt = ops::matmul(host(a, {n, k}), host(bt, {o, k}), false, true);
    CHECK(yt.shape() == Shape{n, o});
    CHECK(relative_error(values(yt), naive_matmul(a, false, bt, true, n, k, o)) < 1e-6);
    // a^T (k, n) @ dy (n, o)
    Array g = ops::matmul(host(a, {n, k}), host(dy, {n, o}), true, false);
    CHECK(g.shape() == Shape{k, o});
    CHECK(relative_error(values(g), naive_matmul(a, true, dy, false, k, n, o)) < 1e-6);
    // leading axes are rows: (3, n/..)-shaped a gives the same numbers
    Array y3 = ops::matmul(host(std::vector<float>(a.begin(), a.begin() + 36 * k), {3, 12, k}), host(b, {k, o}));
    CHECK(y3.shape() == Shape{3, 12, o});
    const auto full = values(y);
    CHECK(relative_error(values(y3), std::vector<float>(full.begin(), full.begin() + 36 * o)) < 1e-6);
    // linear = matmul + bias, then relu
    auto expect = naive_matmul(a, false, b, false, n, k, o);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < o; ++j) expect[static_cast<std::size_t>(i) * o + j] += bias[static_cast<std::size_t>(j)];
    }
    CHECK(relative_error(values(ops::linear(host(a, {n, k}), host(b, {k, o}), host(bias, {o}))), expect) < 1e-6);
    for (float& v : expect) v = std::max(v, 0.0f);
    CHECK(relative_error(values(ops::linear(host(a, {n, k}), host(b, {k, o}), host(bias, {o}), true)), expect) <
          1e-6);
    // an empty inner axis: zeros; empty rows: an empty result
    CHECK(values(ops::matmul(Array({4, 0}, pmap::DType::f32), Array({0, 3}, pmap::DType::f32))) ==
          std::vector<float>(12, 0.0f));
    CHECK(ops::matmul(Array({0, 5}, pmap::DType::f32), Array({5, 2}, pmap::DType::f32)).shape() == Shape{0, 2});
  }
}

TEST_CASE("ops element-wise functions equal the formula, broadcast as numpy does, and agree bitwise across backends") {
  const auto x = random_floats(60, 11, -3.0f, 3.0f);
  const auto pos = random_floats(60, 12, 0.1f, 4.0f);
  const auto row = random_floats(6, 13, 0.5f, 2.0f);
  std::vector<std::vector<float>> runs;
  for (const auto& hb : host_backends()) {
    CAPTURE(hb.name);
    pmap::ops::detail::ScopedBackend scope(*hb.backend);
    Array a = host(x, {10, 6}), p = host(pos, {10, 6}), r = host(row, {6});
    std::vector<float> all;
    const auto each = [&](const Array& got, auto f, const std::vector<float>& in) {
      const auto v = values(got);
      REQUIRE(v.size() == in.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        const float want = f(in[i], i);
        if (std::isnan(want)) CHECK(std::isnan(v[i]));
        else CHECK(v[i] == want);  // the same expression in float: the same bits
      }
      all.insert(all.end(), v.begin(), v.end());
    };
    each(ops::negative(a), [](float v, std::size_t) { return -v; }, x);
    each(ops::abs(a), [](float v, std::size_t) { return std::fabs(v); }, x);
    each(ops::square(a), [](float v, std::size_t) { return v * v; }, x);
    each(ops::sqrt(p), [](float v, std::size_t) { return std::sqrt(v); }, pos);
    each(ops::exp(a), [](float v, std::size_t) { return std::exp(v); }, x);
    each(ops::log(p), [](float v, std::size_t) { return std::log(v); }, pos);
    each(ops::relu(a), [](float v, std::size_t) { return v < 0.0f ? 0.0f : v; }, x);
    each(ops::sigmoid(a), [](float v, std::size_t) { return 1.0f / (1.0f + std::exp(-v)); }, x);
    each(ops::tanh(a), [](float v, std::size_t) { return std::tanh(v); }, x);
    each(ops::scale(a, 2.5f, -1.0f), [](float v, std::size_t) { return v * 2.5f + -1.0f; }, x);
    // same shape, a row broadcast over rows, a scalar
    each(ops::add(a, p), [&](float v, std::size_t i) { return v + pos[i]; }, x);
    each(ops::subtract(a, r), [&](float v, std::size_t i) { return v - row[i % 6]; }, x);
    each(ops::multiply(a, Array::scalar(3.0f)), [](float v, std::size_t) { return v * 3.0f; }, x);
    each(ops::divide(a, r), [&](float v, std::size_t i) { return v / row[i % 6]; }, x);
    each(ops::maximum(a, p), [&](float v, std::size_t i) { return std::max(v, pos[i]); }, x);
    each(ops::minimum(a, r), [&](float v, std::size_t i) { return std::min(v, row[i % 6]); }, x);
    // the activations' gradients from their outputs
    const auto dy = random_floats(60, 14);
    Array g = host(dy, {10, 6});
    const auto ry = values(ops::relu(a)), sy = values(ops::sigmoid(a)), ty = values(ops::tanh(a));
    each(ops::relu_grad(ops::relu(a), g), [&](float, std::size_t i) { return ry[i] > 0.0f ? dy[i] : 0.0f; }, x);
    each(ops::sigmoid_grad(ops::sigmoid(a), g), [&](float, std::size_t i) { return dy[i] * (sy[i] * (1.0f - sy[i])); },
         x);
    each(ops::tanh_grad(ops::tanh(a), g), [&](float, std::size_t i) { return dy[i] * (1.0f - ty[i] * ty[i]); }, x);
    runs.push_back(all);
  }
  CHECK(same_bits(runs[0], runs[1]));
}

TEST_CASE("ops::maximum and ops::minimum propagate NaN from either side, relu keeps NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Array a = host({nan, 1.0f, 2.0f, nan}, {4}), b = host({0.0f, nan, 3.0f, nan}, {4});
  for (const auto& hb : host_backends()) {
    CAPTURE(hb.name);
    pmap::ops::detail::ScopedBackend scope(*hb.backend);
    for (const auto& v : {values(ops::maximum(a, b)), values(ops::minimum(a, b))}) {
      CHECK(std::isnan(v[0]));
      CHECK(std::isnan(v[1]));
      CHECK(std::isnan(v[3]));
    }
    CHECK(values(ops::maximum(a, b))[2] == 3.0f);
    CHECK(values(ops::minimum(a, b))[2] == 2.0f);
    CHECK(std::isnan(values(ops::relu(a))[0]));
  }
}

TEST_CASE("ops reductions: sum and mean in double, rounded once, sum_rows and mean_rows in row order") {
  const auto x = random_floats(5 * 7 * 3, 21, -2.0f, 2.0f);
  double total = 0.0;
  for (float v : x) total += v;
  std::vector<float> rows(21, 0.0f);
  for (int r = 0; r < 5; ++r) {
    for (int j = 0; j < 21; ++j) rows[static_cast<std::size_t>(j)] += x[static_cast<std::size_t>(r) * 21 + j];
  }
  for (const auto& hb : host_backends()) {
    CAPTURE(hb.name);
    pmap::ops::detail::ScopedBackend scope(*hb.backend);
    Array a = host(x, {5, 7, 3});
    Array s = ops::sum(a);
    CHECK(s.shape() == Shape{});
    CHECK(s.item<float>() == static_cast<float>(total));
    CHECK(ops::mean(a).item<float>() == static_cast<float>(total / 105.0));
    Array sr = ops::sum_rows(a);
    CHECK(sr.shape() == Shape{7, 3});
    CHECK(values(sr) == rows);
    const auto mr = values(ops::mean_rows(a));
    for (std::size_t j = 0; j < 21; ++j) CHECK(mr[j] == rows[j] / 5.0f);
    CHECK(ops::sum(Array({0}, pmap::DType::f32)).item<float>() == 0.0f);
  }
}

TEST_CASE("ops::softmax and ops::softmax_cross_entropy equal a stable double-precision computation") {
  const int n = 23, kc = 10;
  auto logits = random_floats(static_cast<std::size_t>(n) * kc, 31, -4.0f, 4.0f);
  logits[5] = 80.0f;  // a large logit: stable softmax needed
  const auto labels = random_labels(static_cast<std::size_t>(n), kc, 32);
  std::vector<float> probs(logits.size()), grad(logits.size());
  double loss = 0.0;
  int correct = 0;
  for (int i = 0; i < n; ++i) {
    const float* l = logits.data() + static_cast<std::size_t>(i) * kc;
    double mx = l[0], z = 0.0;
    int arg = 0;
    for (int j = 1; j < kc; ++j) {
      if (l[j] > mx) {
        mx = l[j];
        arg = j;
      }
    }
    for (int j = 0; j < kc; ++j) z += std::exp(l[j] - mx);
    const int y = labels[static_cast<std::size_t>(i)];
    loss += -(l[y] - mx - std::log(z));
    correct += arg == y;
    for (int j = 0; j < kc; ++j) {
      const double pj = std::exp(l[j] - mx) / z;
      probs[static_cast<std::size_t>(i) * kc + j] = static_cast<float>(pj);
      grad[static_cast<std::size_t>(i) * kc + j] = static_cast<float>((pj - (j == y ? 1.0 : 0.0)) / n);
    }
  }
  loss /= n;
  for (const auto& hb : host_backends()) {
    CAPTURE(hb.name);
    pmap::ops::detail::ScopedBackend scope(*hb.backend);
    Array lg = host(logits, {n, kc});
    CHECK(relative_error(values(ops::softmax(lg)), probs) < 1e-6);
    const auto out = ops::softmax_cross_entropy(lg, Array::from_host(labels, {n}));
    CHECK(out.loss.item<float>() == doctest::Approx(loss).epsilon(1e-6));
    CHECK(relative_error(values(out.grad), grad) < 1e-6);
    CHECK(out.correct.item<std::int32_t>() == correct);
    CHECK(out.bad_labels.item<std::int32_t>() == 0);
  }
}

TEST_CASE("ops raise clear errors for bad operands") {
  Array a = host(std::vector<float>(6, 1.0f), {2, 3});
  Array i32 = Array::from_host(std::vector<std::int32_t>(6, 1), {2, 3});
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const pmap::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK_THROWS_AS(ops::add(a, i32), pmap::ValueError);
  CHECK(message([&] { ops::add(a, i32); }).find("ops::add: b is i32(2, 3)") != std::string::npos);
  CHECK_THROWS_AS(ops::add(a, host({1.0f, 2.0f}, {2})), pmap::ShapeError);  // (2) is not a's trailing (3)
  CHECK(message([&] { ops::add(a, host({1.0f, 2.0f}, {2})); }).find("does not broadcast") != std::string::npos);
  CHECK_THROWS_AS(ops::matmul(a, a), pmap::ShapeError);
  CHECK(message([&] { ops::matmul(a, a); }).find("a's last axis (3) is not b's first (2)") != std::string::npos);
  CHECK_THROWS_AS(ops::matmul(a, a, true, true), pmap::ValueError);
  CHECK_THROWS_AS(ops::matmul(a, host({1, 2, 3, 4}, {4}), true), pmap::ShapeError);
  CHECK_THROWS_AS(ops::linear(a, host(std::vector<float>(12, 0.0f), {3, 4}), host({0, 0, 0}, {3})), pmap::ShapeError);
  CHECK_THROWS_AS(ops::mean(Array({0}, pmap::DType::f32)), pmap::ValueError);
  CHECK_THROWS_AS(ops::mean_rows(Array({0, 2}, pmap::DType::f32)), pmap::ValueError);
  CHECK_THROWS_AS(ops::sum_rows(Array::scalar(1.0f)), pmap::ShapeError);
  CHECK_THROWS_AS(ops::relu(Array()), pmap::ValueError);
  CHECK_THROWS_AS(ops::relu_grad(a, host({1.0f}, {1})), pmap::ShapeError);
  // two CPU devices: one device per call
  const pmap::Device cpu1{pmap::DeviceKind::cpu, 1, 1};
  CHECK(message([&] { ops::add(a, host(std::vector<float>(6, 1.0f), {2, 3}, cpu1)); }).find("on one device") !=
        std::string::npos);
  // labels: i32 (N) in [0, K)
  Array logits = host(std::vector<float>(6, 0.0f), {2, 3});
  CHECK_THROWS_AS(ops::softmax_cross_entropy(logits, a), pmap::ValueError);
  CHECK_THROWS_AS(ops::softmax_cross_entropy(logits, Array::from_host(std::vector<std::int32_t>{0}, {1})),
                  pmap::ShapeError);
  CHECK_THROWS_AS(ops::softmax_cross_entropy(logits, Array::from_host(std::vector<std::int32_t>{0, 3}, {2})),
                  pmap::ValueError);
  // the host run of the CUDA kernels skips and counts a bad label, as a GPU does
  {
    pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
    const auto out = ops::softmax_cross_entropy(logits, Array::from_host(std::vector<std::int32_t>{0, 3}, {2}));
    CHECK(out.bad_labels.item<std::int32_t>() == 1);
    CHECK(values(out.grad)[3] == 0.0f);
  }
}

TEST_CASE("cuda_stream: a CUDA device's stream inside pmap, an error on a CPU device and outside pmap") {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "i");
  CHECK_THROWS_AS(pmap::pmap([] { (void)pmap::cuda_stream(); }, mesh)(), pmap::ValueError);
  CHECK_THROWS_AS(pmap::cuda_stream(), pmap::Error);
  if (!cuda_testing::gpu_usable()) return;
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, 2), "i");  // virtual devices on one GPU or two GPUs
  auto streams = pmap::pmap([] { return pmap::cuda_stream(); }, gpus)();
  CHECK(streams[0] != nullptr);
  CHECK(streams[0] != streams[1]);  // each logical device its own stream
}

TEST_CASE("ops inside pmap: a data-parallel gradient over 4 CPU devices equals the one-device gradient") {
  // Linear regression: loss = mean((x w - y)^2), grad = 2/N x^T (x w - y). 4 devices, 8 rows each.
  const int n = 32, d = 5;
  const auto x = random_floats(static_cast<std::size_t>(n) * d, 41);
  const auto y = random_floats(static_cast<std::size_t>(n), 42);
  const auto w = random_floats(static_cast<std::size_t>(d), 43);
  const auto grad_of = [](const Array& xs, const Array& ys, const Array& ws, float rows) {
    Array err = ops::subtract(ops::matmul(xs, ws), ys);
    return ops::scale(ops::matmul(xs, err, true), 2.0f / rows);
  };
  const auto one = values(grad_of(host(x, {n, d}), host(y, {n, 1}), host(w, {d, 1}), n));
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), "data");
  pmap::Sharded<Array> xs = pmap::shard(host(x, {n, d}), mesh);
  pmap::Sharded<Array> ys = pmap::shard(host(y, {n, 1}), mesh);
  Array wr = host(w, {d, 1});
  auto grads = pmap::pmap(
      [&](const Array& xd, const Array& yd, const Array& wd) {
        Array local = wd.to(pmap::current_device());
        return pmap::pmean(grad_of(xd, yd, local, static_cast<float>(xd.dim(0))), "data");
      },
      mesh, "data")(xs, ys, wr);
  for (int dev = 0; dev < 4; ++dev) CHECK(relative_error(values(grads[static_cast<std::size_t>(dev)]), one) < 1e-6);
  CHECK(same_bits(values(grads[0]), values(grads[3])));  // pmean gives every device the same bits
}

TEST_CASE("ops on cuda devices inside pmap match the CPU, and refuse a call from elsewhere") {
  if (!cuda_testing::gpu_usable()) return;
  const auto x = random_floats(64 * 16, 51);
  const auto w = random_floats(16 * 8, 52);
  const auto b = random_floats(8, 53);
  const auto labels = random_labels(64, 8, 54);
  const auto cpu_logits = values(ops::linear(host(x, {64, 16}), host(w, {16, 8}), host(b, {8}), true));
  const auto cpu_loss = ops::softmax_cross_entropy(host(cpu_logits, {64, 8}), Array::from_host(labels, {64}));
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, 2), "i");
  auto out = pmap::pmap(
      [&] {
        const pmap::Device dev = pmap::current_device();
        Array logits = ops::linear(host(x, {64, 16}, dev), host(w, {16, 8}, dev), host(b, {8}, dev), true);
        auto xent = ops::softmax_cross_entropy(logits, Array::from_host(labels, {64}, dev));
        return std::vector<float>{relative_error(values(logits), cpu_logits) < 1e-5 ? 1.0f : 0.0f,
                                  xent.loss.item<float>(), ops::sum(ops::tanh(logits)).item<float>()};
      },
      gpus)();
  for (const auto& v : out) {
    CHECK(v[0] == 1.0f);
    CHECK(v[1] == doctest::Approx(cpu_loss.loss.item<float>()).epsilon(1e-5));
  }
  Array outside = Array::from_host(x, {64, 16}, pmap::local_devices(pmap::DeviceKind::cuda, 1)[0]);
  CHECK_THROWS_AS(ops::relu(outside), pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
