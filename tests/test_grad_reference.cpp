// pmapcc's gradients against PyTorch's autograd on the same functions and inputs (tests/reference/
// torch_grad_reference.py writes them; the file committed beside it, or the one PMAPCC_GRAD_REFERENCE names
// when the reference_torch_grad CTest test has just regenerated it).
#include "cuda_testing.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::relative_error;
using pmap::Array;
using pmap::Shape;
namespace ops = pmap::ops;
using V = const std::vector<Array>&;

Array constant(float v) { return Array::scalar(v); }

// Input i of case c: float32(sin(1.3 k + 0.7 i + c)) at element k (as the Python file).
std::vector<Array> inputs(int c, const std::vector<Shape>& shapes) {
  std::vector<Array> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    std::vector<float> v(static_cast<std::size_t>(pmap::num_elements(shapes[i])));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(std::sin(1.3 * k + 0.7 * i + c));
    out.push_back(Array::from_host(v, shapes[i]));
  }
  return out;
}

Array mlp(V x) {
  std::vector<std::int32_t> labels(5);
  for (std::size_t k = 0; k < 5; ++k) labels[k] = static_cast<std::int32_t>(k * 7 % 3);
  Array logits = ops::matmul(ops::linear(x[0], x[1], x[2], true), x[3]);
  return ops::softmax_cross_entropy(logits, Array::from_host(labels, {5}));
}

Array elementwise(V x) {
  const Array &a = x[0], &b = x[1];
  Array y = ops::add(ops::add(ops::gelu(ops::multiply(a, b)), ops::multiply(ops::sigmoid(a), ops::tanh(b))),
                     ops::divide(ops::exp(a), ops::scale(ops::square(b), 1.0f, 1.0f)));
  y = ops::subtract(ops::add(y, ops::log(ops::scale(ops::square(a), 1.0f, 1.0f))),
                    ops::sqrt(ops::scale(ops::square(b), 1.0f, 1.0f)));
  y = ops::subtract(ops::add(y, ops::abs(ops::subtract(a, constant(0.05f)))), ops::scale(ops::maximum(a, b), 0.5f));
  y = ops::subtract(ops::add(y, ops::minimum(a, ops::scale(b, 0.3f))), ops::divide(a, ops::scale(b, 1.0f, 2.0f)));
  return ops::mean(y);
}

Array softmax_weighted(V x) { return ops::sum(ops::multiply(ops::softmax(x[0]), x[1])); }

Array matmuls(V x) {
  const Array &a = x[0], &b = x[1], &c = x[2];
  Array t = ops::matmul(a, b, true);
  Array u = ops::matmul(t, c, false, true);
  Array v = ops::sum_rows(ops::matmul(a, t));
  Array w = ops::sum(ops::multiply(ops::sum_rows(a), ops::sum(ops::mean_rows(b))));
  return ops::add(ops::add(ops::scale(ops::sum(ops::multiply(u, u)), 0.1f), ops::sum(v)), w);
}

Array residual(V x) {
  Array h = ops::add(ops::linear(x[0], x[1], x[2], true), x[0]);
  return ops::mean(ops::square(ops::reshape(h, {20})));
}

Array cnn(V x) {
  Array h = ops::avg_pool(ops::conv2d(x[0], x[1], x[2], {.relu = true}), 2, 2, 2, 2);
  h = ops::global_avg_pool(ops::conv2d(h, x[3], Array(), {.same = false}));
  return ops::softmax_cross_entropy(h, Array::from_host(std::vector<std::int32_t>{0, 7 % 3}, {2}));
}

Array batchnorm(V x) {
  auto r = ops::batch_norm(x[0], x[1], x[2], Array(Shape{3}, pmap::DType::f32),
                           Array::from_host(std::vector<float>{1, 1, 1}, {3}));
  return ops::mean(ops::square(ops::add(ops::relu(r.y), ops::scale(r.y, 0.3f))));
}

// transpose, max_pool (VALID and Keras's "same"), slice, concatenate, axis reductions, broadcast_to, log_softmax.
Array layout(V x) {
  Array h = ops::transpose(x[0], {0, 2, 1, 3});                                   // (2, 5, 4, 3)
  Array p = ops::max_pool(h, {.window_h = 2, .window_w = 2, .stride_h = 1, .stride_w = 1});  // (2, 4, 3, 3)
  Array q = ops::max_pool(h, {.window_h = 3, .window_w = 3, .stride_h = 2, .stride_w = 2, .same = true});
  Array ps = ops::slice(p, {0, 1, 0, 0}, {2, 3, 2, 3}), qs = ops::slice(q, {0, 0, 0, 0}, {2, 2, 2, 3});
  Array z = ops::linear(ops::sum(ops::concatenate({&ps, &qs}, 1), {2}), x[1], x[2]);  // (2, 4, 4)
  z = ops::subtract(z, ops::scale(ops::broadcast_to(ops::max(z, {0}, true), {2, 4, 4}), 0.5f));
  return ops::negative(ops::sum(ops::mean(ops::log_softmax(z), {0, 1})));
}

Array reductions(V x) {
  Array a = ops::max(x[0], {1, 2});
  Array c = ops::square(ops::subtract(x[0], ops::broadcast_to(ops::mean(x[0], {-1}, true), {3, 4, 5})));
  Array d = ops::multiply(ops::broadcast_to(x[1], {3, 4, 5}), c);
  Array e = ops::slice(ops::transpose(x[0], {2, 0, 1}), {1, 0, 2}, {4, 3, 4});
  return ops::add(ops::add(ops::scale(ops::sum(ops::sum(d, {0, 2})), 0.1f), ops::sum(ops::square(a))), ops::sum(e));
}

struct Case {
  const char* name;
  std::function<Array(V)> f;
  std::vector<Shape> shapes;
};

TEST_CASE("grad: PyTorch's autograd gives the same values and gradients") {
  const char* env = std::getenv("PMAPCC_GRAD_REFERENCE");
  const std::string path = env != nullptr ? env : PMAPCC_SOURCE_DIR "/tests/reference/grad_reference.json";
  std::ifstream file(path);
  REQUIRE_MESSAGE(file.good(), "cannot read " << path);
  const auto ref = nlohmann::json::parse(file);
  const std::vector<Case> cases{{"mlp", mlp, {{5, 4}, {4, 6}, {6}, {6, 3}}},
                                {"elementwise", elementwise, {{3, 4}, {4}}},
                                {"softmax_weighted", softmax_weighted, {{3, 5}, {3, 5}}},
                                {"matmuls", matmuls, {{6, 4}, {6, 3}, {2, 3}}},
                                {"residual", residual, {{4, 5}, {5, 5}, {5}}},
                                {"batchnorm", batchnorm, {{4, 2, 3}, {3}, {3}}},
                                {"cnn", cnn, {{2, 6, 6, 1}, {3, 3, 1, 4}, {4}, {2, 2, 4, 3}}},
                                {"layout", layout, {{2, 4, 5, 3}, {3, 4}, {4}}},
                                {"reductions", reductions, {{3, 4, 5}, {4, 1}}}};
  REQUIRE(ref.size() == cases.size());
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(cases[c].name);
    const auto& want = ref.at(cases[c].name);
    auto [value, grads] = pmap::value_and_grad(cases[c].f, cases[c].name)(inputs(static_cast<int>(c), cases[c].shapes));
    CHECK(value.item<float>() == doctest::Approx(want.at("value").get<double>()).epsilon(1e-5));
    REQUIRE(grads.size() == want.at("grads").size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      CAPTURE(i);
      CHECK(relative_error(grads[i].to_vector<float>(), want.at("grads")[i].get<std::vector<float>>()) <= 2e-5);
    }
  }
}

}  // namespace

}  // namespace PMAPCC_TEST_FILE
