// The axis and layout ops of pmap::ops (core/layout.cpp): sum, mean and max over axes, transpose,
// broadcast_to, slice, concatenate, log_softmax and max_pool. Forward values against hand-computed ones,
// every VJP against central differences, the CUDA kernels (run on the host, and on a GPU where there is one)
// against the CPU ops bit for bit, ties, and every bad input's error naming the op and the argument.
#include "cuda_testing.h"
#include "grad_checks.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <pmap/error.h>
#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using grad_checks::Case;
using grad_checks::host;
using grad_checks::weighted;
using pmap::Array;
using pmap::Shape;
namespace ops = pmap::ops;
using V = const std::vector<Array>&;

// 0, 1, 2, ... in `shape`.
Array iota(const Shape& shape) {
  std::vector<float> v(static_cast<std::size_t>(pmap::num_elements(shape)));
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(k);
  return host(v, shape);
}

std::vector<float> values(const Array& a) { return a.to_vector<float>(); }

ops::MaxPoolOptions pool(int window, int stride, bool same = false) {
  return {.window_h = window, .window_w = window, .stride_h = stride, .stride_w = stride, .same = same};
}

std::vector<Case> cases() {
  std::vector<Case> out{
      {"sum (axis 1)", {{2, 3, 4}}, [](V x) { return weighted(ops::sum(ops::square(x[0]), {1})); }},
      {"sum (axes 0, 2, keepdims)", {{2, 3, 4}},
       [](V x) { return weighted(ops::sum(ops::square(x[0]), {0, 2}, true)); }},
      {"sum (axis -1)", {{3, 5}}, [](V x) { return weighted(ops::sum(ops::square(x[0]), {-1})); }},
      {"mean (axis 0)", {{3, 4}}, [](V x) { return weighted(ops::mean(ops::square(x[0]), {0})); }},
      {"mean (axes 1, 2, keepdims)", {{2, 3, 4}},
       [](V x) { return weighted(ops::mean(ops::exp(x[0]), {1, 2}, true)); }},
      {"max (axis 1)", {{3, 5}}, [](V x) { return weighted(ops::max(x[0], {1})); }, -1, 1, false, true},
      {"max (axes 0, 2, keepdims)", {{2, 3, 4}}, [](V x) { return weighted(ops::max(x[0], {0, -1}, true)); }, -1, 1,
       false, true},
      {"transpose (1, 0)", {{3, 4}}, [](V x) { return weighted(ops::transpose(ops::square(x[0]), {1, 0})); }},
      {"transpose (2, 0, 1)", {{2, 3, 4}}, [](V x) { return weighted(ops::transpose(x[0], {2, 0, 1})); }},
      {"transpose (-1, 0, 1)", {{2, 3, 2}},
       [](V x) { return weighted(ops::square(ops::transpose(x[0], {-1, 0, 1}))); }},
      {"broadcast_to ((3, 1) to (2, 3, 4))", {{3, 1}},
       [](V x) { return weighted(ops::broadcast_to(ops::square(x[0]), {2, 3, 4})); }},
      {"broadcast_to ((4) to (3, 4))", {{4}}, [](V x) { return weighted(ops::broadcast_to(x[0], {3, 4})); }},
      {"broadcast_to (() to (2, 2))", {{}},
       [](V x) { return weighted(ops::broadcast_to(ops::square(x[0]), {2, 2})); }},
      {"slice (2-d)", {{4, 5}}, [](V x) { return weighted(ops::slice(ops::square(x[0]), {1, 0}, {3, 4})); }},
      {"slice (3-d)", {{2, 3, 4}}, [](V x) { return weighted(ops::slice(x[0], {0, 1, 1}, {2, 2, 4})); }},
      {"concatenate (axis 0)", {{2, 3}, {1, 3}},
       [](V x) { return weighted(ops::square(ops::concatenate({&x[0], &x[1]}, 0))); }},
      {"concatenate (axis -1, three)", {{2, 2}, {2, 3}, {2, 1}},
       [](V x) { return weighted(ops::square(ops::concatenate({&x[0], &x[1], &x[2]}, -1))); }},
      {"log_softmax", {{3, 5}}, [](V x) { return weighted(ops::log_softmax(x[0])); }, -2, 2},
      {"log_softmax (3-d)", {{2, 2, 4}}, [](V x) { return weighted(ops::log_softmax(ops::square(x[0]))); }, -2, 2},
      {"max_pool (2x2, stride 2)", {{2, 5, 5, 2}}, [](V x) { return weighted(ops::max_pool(x[0])); }, -1, 1, false,
       true},
      {"max_pool (3x3, stride 1: overlapping)", {{1, 5, 4, 2}},
       [](V x) { return weighted(ops::max_pool(x[0], pool(3, 1))); }, -1, 1, false, true},
      {"max_pool (3x3, stride 2, same)", {{1, 5, 4, 1}},
       [](V x) { return weighted(ops::max_pool(x[0], pool(3, 2, true))); }, -1, 1, false, true},
      {"max_pool (2x2, stride 2, same, odd)", {{1, 5, 5, 2}},
       [](V x) { return weighted(ops::max_pool(x[0], pool(2, 2, true))); }, -1, 1, false, true},
  };
  return out;
}

TEST_CASE("grad layout: every new primitive's VJP against central differences") {
  for (const Case& c : cases()) grad_checks::check_against_differences(c);
}

TEST_CASE("grad layout: forward values against hand-computed ones") {
  const Array x = iota({2, 3, 4});  // x[i][j][k] = 12 i + 4 j + k
  // sum_j = 36 i + 12 + 3 k; mean over (i, k) = 7.5 + 4 j; max over k = 12 i + 4 j + 3
  CHECK(values(ops::sum(x, {1})) == std::vector<float>{12, 15, 18, 21, 48, 51, 54, 57});
  CHECK(ops::sum(x, {1}).shape() == Shape{2, 4});
  const Array m = ops::mean(x, {0, 2}, true);
  CHECK(m.shape() == Shape{1, 3, 1});
  CHECK(values(m) == std::vector<float>{7.5f, 11.5f, 15.5f});
  CHECK(values(ops::max(x, {-1})) == std::vector<float>{3, 7, 11, 15, 19, 23});
  CHECK(values(ops::sum(x, {0, 1, 2})) == std::vector<float>{276});
  CHECK(values(ops::sum(x, {})) == values(x));
  // transpose (2, 0, 1): y[k][i][j] = x[i][j][k]
  const Array t = ops::transpose(x, {2, 0, 1});
  REQUIRE(t.shape() == Shape{4, 2, 3});
  const auto tv = values(t);
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) CHECK(tv[static_cast<std::size_t>(k * 6 + i * 3 + j)] == 12.0f * i + 4.0f * j + k);
  // broadcast_to: (3, 1) to (2, 3, 2) repeats each row's value along the last axis, and the whole twice
  const Array b = ops::broadcast_to(host({1, 2, 3}, {3, 1}), {2, 3, 2});
  CHECK(values(b) == std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  // slice [1:2, 1:3, 2:4]: 12 + 4 + 2 = 18, 19, then 12 + 8 + 2 = 22, 23
  const Array s = ops::slice(x, {1, 1, 2}, {2, 3, 4});
  CHECK(s.shape() == Shape{1, 2, 2});
  CHECK(values(s) == std::vector<float>{18, 19, 22, 23});
  CHECK(ops::slice(x, {0, 1, 0}, {2, 1, 4}).shape() == Shape{2, 0, 4});  // empty slices are fine
  // concatenate along the last axis
  const Array a2 = iota({2, 2}), b2 = host({9, 8}, {2, 1});
  CHECK(values(ops::concatenate({&a2, &b2}, 1)) == std::vector<float>{0, 1, 9, 2, 3, 8});
  CHECK(values(ops::concatenate({&a2, &a2}, 0)) == std::vector<float>{0, 1, 2, 3, 0, 1, 2, 3});
}

TEST_CASE("grad layout: log_softmax is stable and equals log(softmax)") {
  const auto ls = values(ops::log_softmax(host({1, 2, 3}, {1, 3})));
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  for (int k = 0; k < 3; ++k) CHECK(ls[static_cast<std::size_t>(k)] == doctest::Approx(k + 1 - lse).epsilon(1e-6));
  // no overflow for large logits, no -inf for a small one
  const auto big = values(ops::log_softmax(host({1000, 1000, -1000, 0}, {2, 2})));
  CHECK(big[0] == doctest::Approx(-std::log(2.0)).epsilon(1e-6));
  CHECK(big[1] == doctest::Approx(-std::log(2.0)).epsilon(1e-6));
  CHECK(big[2] == doctest::Approx(-1000.0));
  CHECK(big[3] == doctest::Approx(0.0));
  const Array z = host(cuda_testing::random_floats(12, 5, -3, 3), {3, 4});
  const auto via_softmax = values(ops::log(ops::softmax(z)));
  const auto direct = values(ops::log_softmax(z));
  for (std::size_t k = 0; k < direct.size(); ++k) CHECK(direct[k] == doctest::Approx(via_softmax[k]).epsilon(1e-5));
}

TEST_CASE("grad layout: max_pool's values, Keras's 'same' split, ties and NaN") {
  // x[r][c] = 4 r + c; 2x2 windows of stride 2: each window's bottom-right element
  CHECK(values(ops::max_pool(iota({1, 4, 4, 1}))) == std::vector<float>{5, 7, 13, 15});
  // 'same', 5x5, 3x3 windows of stride 2: out 3x3, one padding row and column before (2 in all, split 1 + 1);
  // x[r][c] = 5 r + c: rows {1, 3, 4} and columns {1, 3, 4} are each window's last
  const Array same = ops::max_pool(iota({1, 5, 5, 1}), pool(3, 2, true));
  CHECK(same.shape() == Shape{1, 3, 3, 1});
  CHECK(values(same) == std::vector<float>{6, 8, 9, 16, 18, 19, 21, 23, 24});
  // 'same' 4 wide, 3 window, stride 2: 1 padding column, after (Keras): windows [0, 3) and [2, 5)
  const Array wide = ops::max_pool(host({5, 9, 1, 2}, {1, 1, 4, 1}), {.window_h = 1, .window_w = 3, .stride_h = 1,
                                                                   .stride_w = 2, .same = true});
  CHECK(values(wide) == std::vector<float>{9, 2});
  // VALID 3x3 stride 2 on 5 wide: two windows per axis
  CHECK(ops::max_pool(iota({2, 5, 5, 3}), pool(3, 2)).shape() == Shape{2, 2, 2, 3});
  // ties: the first in window order takes the whole gradient
  const Array tied = host({3, 1, 3, 3}, {1, 2, 2, 1});
  CHECK(values(pmap::grad([](const Array& v) { return ops::sum(ops::max_pool(v)); })(tied)) ==
        std::vector<float>{1, 0, 0, 0});
  // overlapping windows choosing one element add their cotangents
  const Array peak = host({0, 0, 0, 0, 9, 0, 0, 0, 0}, {1, 3, 3, 1});
  CHECK(values(pmap::grad([](const Array& v) { return ops::sum(ops::max_pool(v, pool(2, 1))); })(peak)) ==
        std::vector<float>{0, 0, 0, 0, 4, 0, 0, 0, 0});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(ops::max_pool(host({1, nan, 5, 2}, {1, 2, 2, 1})).item<float>()));
}

TEST_CASE("grad layout: max over axes splits the gradient evenly among tied maxima, NaN and empty axes") {
  const Array x = host({1, 3, 3, 2, 4, 0}, {2, 3});
  CHECK(values(ops::max(x, {1})) == std::vector<float>{3, 4});
  CHECK(values(pmap::grad([](const Array& v) { return ops::sum(ops::max(v, {1})); })(x)) ==
        std::vector<float>{0, 0.5f, 0.5f, 0, 1, 0});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(values(ops::max(host({1, nan, 5}, {3}), {0}))[0]));
  // empty reduced axes: sum 0; mean and max have no value
  const Array empty(Shape{2, 0}, pmap::DType::f32);
  CHECK(values(ops::sum(empty, {1})) == std::vector<float>{0, 0});
  CHECK_THROWS_AS(ops::mean(empty, {1}), pmap::ValueError);
  CHECK_THROWS_AS(ops::max(empty, {1}), pmap::ValueError);
  CHECK(ops::sum(empty, {0}).shape() == Shape{0});  // an empty result needs no elements
}

TEST_CASE("grad layout: the CUDA kernels run on the host give the CPU ops' values and gradients, bit for bit") {
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const auto in = grad_checks::inputs_of(c, 11);
    auto f = [&](const std::vector<Array>& xs) { return c.f(xs); };
    auto [v, g] = pmap::value_and_grad(f)(grad_checks::arrays(c, in));
    pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
    auto [hv, h] = pmap::value_and_grad(f)(grad_checks::arrays(c, in));
    CHECK(hv.item<float>() == v.item<float>());
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(values(h[i]) == values(g[i]));
  }
}

// Each op on a GPU (inside pmap) against the CPU: the copies, sums, maxima and pools bit for bit; log_softmax
// within CUDA's exp and log (2 ulp).
TEST_CASE("ops on cuda devices: the layout ops and their gradients equal the CPU's") {
  PMAPCC_REQUIRE_GPU();
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cuda, 1), "i");
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const auto in = grad_checks::inputs_of(c, 13);
    auto f = [&](const std::vector<Array>& xs) { return c.f(xs); };
    auto cpu = pmap::grad(f)(grad_checks::arrays(c, in));
    auto gpu = pmap::pmap([&](int) {
      std::vector<Array> xs;
      for (std::size_t i = 0; i < in.size(); ++i) {
        xs.push_back(Array::from_host(in[i], c.shapes[i], pmap::current_device()));
      }
      return pmap::grad(f)(xs);
    }, mesh)(0);
    const bool exact = c.name.find("log_softmax") == std::string::npos;
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      if (exact) CHECK(values(gpu[0][i]) == values(cpu[i]));
      else CHECK(cuda_testing::relative_error(values(gpu[0][i]), values(cpu[i])) <= 1e-6);
    }
  }
}

TEST_CASE("grad layout: LayoutOps refuse bad parameters and null pointers on the CPU and the CUDA code") {
  namespace k = pmap::kernels;
  for (const k::Backend* be : {&k::backend_for(pmap::DeviceKind::cpu), &k::cuda_backend_on_host()}) {
    CAPTURE(be->name());
    float a = 1.0f, b = 0.0f;
    k::StridedCopyParams c;
    c.ndim = k::kMaxLayoutAxes + 1;
    CHECK_THROWS_AS(be->layout().strided_copy(c, &a, &b), pmap::ValueError);
    c.ndim = 1;
    c.dims[0] = -1;
    CHECK_THROWS_AS(be->layout().strided_copy(c, &a, &b), pmap::ValueError);
    c.dims[0] = 1;
    CHECK_THROWS_AS(be->layout().strided_copy(c, nullptr, &b), pmap::ValueError);
    be->layout().strided_copy(c, &a, &b);
    CHECK(b == 1.0f);
    k::StridedReduceParams r;
    r.inner_ndim = 1;  // inner_dims[0] == 0: nothing to reduce
    CHECK_THROWS_AS(be->layout().strided_reduce(k::ReduceOp::max, r, &a, &b), pmap::ValueError);
    r.inner_dims[0] = 1;
    CHECK_THROWS_AS(be->layout().strided_reduce(k::ReduceOp::sum, r, &a, nullptr), pmap::ValueError);
    k::MaxPoolParams m{.batch = 1, .height = 1, .width = 1, .channels = 1, .window_h = 1, .window_w = 1,
                       .stride_h = 1, .stride_w = 1};
    CHECK_THROWS_AS(be->layout().max_pool_backward(m, &a, nullptr, &b), pmap::ValueError);
    m.channels = 0;
    CHECK_THROWS_AS(be->layout().max_pool_forward(m, &a, &b), pmap::ValueError);
  }
}

// The message of the pmap::Error f raises, checked to be of type E ("no error" / "wrong type: ..." otherwise).
template <class E, class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong type: ") + e.what();
  }
  return "no error";
}

bool names(const std::string& message, const std::string& op, const std::string& arg) {
  const bool ok = message.find("ops::" + op) != std::string::npos && message.find(arg) != std::string::npos;
  if (!ok) MESSAGE(message);
  return ok;
}

TEST_CASE("grad layout: bad input raises ShapeError / ValueError naming the op and the argument") {
  const Array x = iota({2, 3});
  using pmap::ShapeError;
  using pmap::ValueError;
  // reductions: axes out of range, given twice
  CHECK(names(error_of<ValueError>([&] { ops::sum(x, {2}); }), "sum", "axes (2,): axis 2 is out of range"));
  CHECK(names(error_of<ValueError>([&] { ops::mean(x, {-3}); }), "mean", "axis -3 is out of range"));
  CHECK(names(error_of<ValueError>([&] { ops::max(x, {0, -2}); }), "max", "axis 0 is given twice"));
  // transpose: a wrong count, a repeated or out-of-range axis, a dtype that is not f32
  CHECK(names(error_of<ValueError>([&] { ops::transpose(x, {0}); }), "transpose", "permutation (0,) has 1 entries"));
  CHECK(names(error_of<ValueError>([&] { ops::transpose(x, {1, 1}); }), "transpose", "permutation (1, 1)"));
  CHECK(names(error_of<ValueError>([&] { ops::transpose(x, {0, 2}); }), "transpose", "axis 2 is out of range"));
  const Array labels = Array::from_host(std::vector<std::int32_t>{1, 2}, {2});
  CHECK(names(error_of<ValueError>([&] { ops::transpose(labels, {0}); }), "transpose", "must be f32"));
  // broadcast_to: an axis neither equal nor 1, more axes than the target, a negative dimension
  CHECK(names(error_of<ShapeError>([&] { ops::broadcast_to(x, {2, 4}); }), "broadcast_to",
              "x's axis 1 is 3 against 4"));
  CHECK(names(error_of<ShapeError>([&] { ops::broadcast_to(x, {3}); }), "broadcast_to", "more axes"));
  CHECK(names(error_of<ShapeError>([&] { ops::broadcast_to(x, {-1, 3}); }), "broadcast_to", "negative"));
  // slice: out of range (stop past the end, start past stop, a negative start), a wrong count
  CHECK(names(error_of<ShapeError>([&] { ops::slice(x, {0, 0}, {2, 4}); }), "slice", "axis 1: start 0, stop 4"));
  CHECK(names(error_of<ShapeError>([&] { ops::slice(x, {2, 0}, {1, 3}); }), "slice", "axis 0: start 2, stop 1"));
  CHECK(names(error_of<ShapeError>([&] { ops::slice(x, {-1, 0}, {1, 3}); }), "slice", "start -1"));
  CHECK(names(error_of<ShapeError>([&] { ops::slice(x, {0}, {1}); }), "slice", "one entry per axis"));
  CHECK(names(error_of<ShapeError>([&] { ops::eager::slice_backward(x, {2, 2}, {0, 0}); }), "slice_backward",
              "dy"));
  // concatenate: mismatched shapes, ranks, an axis out of range, nothing to join, a null pointer
  const Array y = iota({3, 3}), z = iota({2, 3, 1});
  CHECK(names(error_of<ShapeError>([&] { ops::concatenate({&x, &y}, 1); }), "concatenate", "xs[1] f32(3, 3)"));
  CHECK(names(error_of<ShapeError>([&] { ops::concatenate({&x, &z}, 0); }), "concatenate", "xs[1] f32(2, 3, 1)"));
  CHECK(names(error_of<ValueError>([&] { ops::concatenate({&x, &x}, 2); }), "concatenate",
              "axis 2 is out of range"));
  CHECK(names(error_of<ValueError>([&] { ops::concatenate(std::vector<const Array*>{}, 0); }), "concatenate",
              "xs is empty"));
  CHECK(names(error_of<ValueError>([&] { ops::concatenate({&x, nullptr}, 0); }), "concatenate", "xs[1] is null"));
  // log_softmax of a scalar; more axes than the layout ops take
  CHECK(names(error_of<ShapeError>([&] { ops::log_softmax(Array::scalar(1.0f)); }), "log_softmax", "class axis"));
  const Array nine(Shape{1, 1, 1, 1, 1, 1, 1, 1, 2}, pmap::DType::f32);
  CHECK(names(error_of<ValueError>([&] { ops::sum(nine, {0}); }), "sum", "at most 8"));
  // max_pool: not (N, H, W, C), a bad window or stride, a VALID window larger than the input, a wrong dy
  CHECK(names(error_of<ShapeError>([&] { ops::max_pool(x); }), "max_pool", "must be (N, H, W, C)"));
  const Array img = iota({1, 3, 3, 1});
  CHECK(names(error_of<ValueError>([&] { ops::max_pool(img, pool(0, 1)); }), "max_pool", "window_h must be > 0"));
  CHECK(names(error_of<ValueError>([&] { ops::max_pool(img, pool(2, 0)); }), "max_pool", "stride_h must be > 0"));
  CHECK(names(error_of<ValueError>([&] { ops::max_pool(img, pool(4, 1)); }), "max_pool", "window 4x4 is larger"));
  CHECK(ops::max_pool(img, pool(4, 1, true)).shape() == Shape{1, 3, 3, 1});  // 'same' pads instead
  CHECK(names(error_of<ShapeError>([&] { ops::eager::max_pool_backward(img, img); }), "max_pool_backward",
              "dy"));
}

}  // namespace

}  // namespace PMAPCC_TEST_FILE
