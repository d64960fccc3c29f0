// vmap (pmapcc/core/vmap.h): every primitive's batching rule against a loop over the members, forward and
// through grad in both orders (vmap of value_and_grad: each member's own gradient; grad of vmap: the
// gradient of the members' sum), for each way of mapping the operands; vmap inside pmap with the
// collectives; and every misuse's error.
#include "cuda_testing.h"
#include "grad_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <pmap/detail/allocation.h>
#include <pmap/error.h>
#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/trace.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cpu_backend.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using grad_checks::host;
using pmap::Array;
using pmap::Shape;
namespace ops = pmap::ops;
using V = const std::vector<Array>&;

constexpr std::int64_t kMembers = 3;

// A function of some arrays (one member's shapes) and the ways of mapping them to check.
struct VCase {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Array(V)> f;
  std::vector<std::vector<bool>> patterns;  // which inputs are mapped; none given: all
  std::vector<int> classes = {};            // per input: 0 for f32, K > 0 for i32 labels in [0, K)
  bool differentiable = true;
  float lo = -1.0f, hi = 1.0f;
};

bool is_labels(const VCase& c, std::size_t i) { return i < c.classes.size() && c.classes[i] > 0; }

// Member m's values of input i (the same for every m when the input is not mapped).
Array input(const VCase& c, std::size_t i, std::int64_t m, bool mapped) {
  const auto n = static_cast<std::size_t>(pmap::num_elements(c.shapes[i]));
  const auto seed = static_cast<std::uint32_t>(7 + 31 * i + (mapped ? 101 * m : 0));
  if (is_labels(c, i)) {
    std::vector<std::int32_t> v(n);
    for (std::size_t k = 0; k < n; ++k) v[k] = static_cast<std::int32_t>((seed + 5 * k) % static_cast<unsigned>(c.classes[i]));
    return Array::from_host(v, c.shapes[i]);
  }
  return host(cuda_testing::random_floats(n, seed, c.lo, c.hi), c.shapes[i]);
}

Array stacked(const VCase& c, std::size_t i) {
  std::vector<Array> parts;
  for (std::int64_t m = 0; m < kMembers; ++m) parts.push_back(input(c, i, m, true));
  std::vector<const Array*> ptrs;
  for (const Array& p : parts) ptrs.push_back(&p);
  return pmap::concatenate(ptrs, pmap::Device{}, /*stacked=*/true);
}

std::vector<float> floats(const Array& a) {
  if (a.dtype() == pmap::DType::i32) {
    auto v = a.to_vector<std::int32_t>();
    return std::vector<float>(v.begin(), v.end());
  }
  return a.to_vector<float>();
}

// Each member's values, concatenated (what the stacked result must hold).
std::vector<float> concat(const std::vector<std::vector<float>>& parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// The gradients' bound: the avx512 variant computes a row the same way wherever it lies (masked tails); the
// avx2 and generic variants run a vector loop then a scalar tail, so the stacked members' elements and one
// member's alone may take different paths (exp, the sums' grouping) and round apart a little more.
float grad_tolerance() { return pmap::kernels::cpu::isa() == "avx512" ? 2e-5f : 5e-5f; }

void check_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what, float tol) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double err = std::abs(double(got[k]) - double(want[k])) / (1e-3 + std::abs(double(want[k])));
    if (!(err <= worst)) worst = err;  // NaN counts as the worst
  }
  INFO("largest relative difference " << worst);
  CHECK(worst <= tol);
}

std::string pattern_str(const std::vector<bool>& mapped) {
  std::string s = "(";
  for (std::size_t i = 0; i < mapped.size(); ++i) s += std::string(i ? ", " : "") + (mapped[i] ? "0" : "none");
  return s + ")";
}

// The case's inputs split as vmap takes them: the mapped ones (stacked) and the others.
struct Split {
  std::vector<Array> mapped, shared;
};
Split split_inputs(const VCase& c, const std::vector<bool>& mapped) {
  Split s;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) {
    if (mapped[i]) {
      s.mapped.push_back(stacked(c, i));
    } else {
      s.shared.push_back(input(c, i, 0, false));
    }
  }
  return s;
}
// The inputs in the case's order, from the two lists.
std::vector<Array> merged(const std::vector<bool>& mapped, V a, V b) {
  std::vector<Array> all;
  std::size_t ia = 0, ib = 0;
  for (bool m : mapped) all.push_back((m ? a[ia++] : b[ib++]).copy());
  return all;
}

void check_forward(const VCase& c, const std::vector<bool>& mapped) {
  std::vector<std::vector<float>> loop;
  for (std::int64_t m = 0; m < kMembers; ++m) {
    std::vector<Array> in;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) in.push_back(input(c, i, m, mapped[i]));
    loop.push_back(floats(c.f(in)));
  }
  Split s = split_inputs(c, mapped);
  auto f = pmap::vmap([&](V a, V b) { return c.f(merged(mapped, a, b)); }, {0, pmap::none}, c.name);
  Array y = s.mapped.empty() ? Array() : f(s.mapped, s.shared);
  REQUIRE(y.dim(0) == kMembers);
  check_close(floats(y), concat(loop), c.name + " " + pattern_str(mapped) + ": vmap against the loop", 2e-6f);
}

// vmap(value_and_grad(f)) against value_and_grad(f) member by member (every f32 input differentiated: each
// member its own gradient, of the inputs it shares too), and grad(vmap(f)) against the members' sum.
void check_gradients(const VCase& c, const std::vector<bool>& mapped) {
  const std::size_t n = c.shapes.size();
  auto loss = [&](V in) { return grad_checks::weighted(c.f(in)); };
  // The f32 inputs as the differentiated argument, the labels fixed.
  auto with_labels = [&](V floats_in, V labels) {
    std::vector<Array> all;
    std::size_t jf = 0, jl = 0;
    for (std::size_t i = 0; i < n; ++i) all.push_back((is_labels(c, i) ? labels[jl++] : floats_in[jf++]).copy());
    return all;
  };
  std::vector<std::vector<float>> loop_values, loop_grads(n);
  std::vector<std::vector<float>> summed(n);  // the gradient of the members' sum, for the shared inputs
  for (std::int64_t m = 0; m < kMembers; ++m) {
    std::vector<Array> fl, lb;
    for (std::size_t i = 0; i < n; ++i) (is_labels(c, i) ? lb : fl).push_back(input(c, i, m, mapped[i]));
    auto [value, grads] = pmap::value_and_grad([&](V x) { return loss(with_labels(x, lb)); })(fl);
    loop_values.push_back(floats(value));
    std::size_t j = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (is_labels(c, i)) continue;
      auto g = floats(grads[j++]);
      loop_grads[i].insert(loop_grads[i].end(), g.begin(), g.end());
      if (summed[i].empty()) summed[i].assign(g.size(), 0.0f);
      for (std::size_t k = 0; k < g.size(); ++k) summed[i][k] += g[k];
    }
  }
  Split s = split_inputs(c, mapped);
  const std::string what = c.name + " " + pattern_str(mapped);
  // vmap of value_and_grad: the f32 inputs (mapped or not) differentiated, per member.
  auto per_member = pmap::vmap([&](V a, V b) {
    std::vector<Array> all = merged(mapped, a, b), fl, lb;
    for (std::size_t i = 0; i < n; ++i) (is_labels(c, i) ? lb : fl).push_back(std::move(all[i]));
    return pmap::value_and_grad([&](V x) { return loss(with_labels(x, lb)); })(fl);
  }, {0, pmap::none}, c.name);
  auto [values, grads] = per_member(s.mapped, s.shared);
  check_close(floats(values), concat(loop_values), what + ": vmap(value_and_grad) values", 2e-6f);
  std::size_t j = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (is_labels(c, i)) continue;
    check_close(floats(grads[j++]), loop_grads[i], what + ": vmap(value_and_grad), input " + std::to_string(i),
                grad_tolerance());
  }
  // grad of vmap: d/d(inputs) of the members' summed losses; a shared input's gradient is the members' sum.
  std::vector<Array> mf, ml, sf, sl;
  std::size_t im = 0, is = 0;
  for (std::size_t i = 0; i < n; ++i) {
    Array& a = mapped[i] ? s.mapped[im++] : s.shared[is++];
    (mapped[i] ? (is_labels(c, i) ? ml : mf) : (is_labels(c, i) ? sl : sf)).push_back(a.copy());
  }
  auto total = [&](V mapped_f, V shared_f) {
    auto losses = pmap::vmap([&](V a, V b, V la, V lb) {
      // reassemble one member's inputs in the case's order
      std::vector<Array> all;
      std::size_t ja = 0, jb = 0, jla = 0, jlb = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const Array& x = mapped[i] ? (is_labels(c, i) ? la[jla++] : a[ja++]) : (is_labels(c, i) ? lb[jlb++] : b[jb++]);
        all.push_back(x.copy());
      }
      return loss(all);
    }, {0, pmap::none, 0, pmap::none}, c.name)(mapped_f, shared_f, ml, sl);
    return ops::sum(losses);
  };
  auto [g_mapped, g_shared] = pmap::grad<0, 1>(total)(mf, sf);
  std::size_t jm = 0, js = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (is_labels(c, i)) continue;
    const std::string input_name = what + ": grad(vmap), input " + std::to_string(i);
    if (mapped[i]) {
      check_close(floats(g_mapped[jm++]), loop_grads[i], input_name, grad_tolerance());
    } else {
      // (the members' products summed in one product, or one after another: reassociation)
      check_close(floats(g_shared[js++]), summed[i], input_name, 1e-4f);
    }
  }
}

void check(const VCase& c) {
  std::vector<std::vector<bool>> patterns = c.patterns;
  if (patterns.empty()) patterns.push_back(std::vector<bool>(c.shapes.size(), true));
  for (const auto& mapped : patterns) {
    check_forward(c, mapped);
    if (c.differentiable) check_gradients(c, mapped);
  }
}

const std::vector<std::vector<bool>> kTwo = {{true, true}, {true, false}, {false, true}};
const std::vector<std::vector<bool>> kThree = {{true, true, true}, {true, false, false}, {false, true, true},
                                               {false, true, false}};

std::vector<VCase> cases() {
  std::vector<VCase> c;
  c.push_back({"relu", {{2, 3}}, [](V a) { return ops::relu(a[0]); }, {}});
  c.push_back({"abs", {{2, 3}}, [](V a) { return ops::abs(a[0]); }, {}});
  c.push_back({"tanh of exp", {{4}}, [](V a) { return ops::tanh(ops::exp(a[0])); }, {}});
  c.push_back({"sigmoid of scale", {{2, 2}}, [](V a) { return ops::sigmoid(ops::scale(a[0], 3.0f, 0.5f)); }, {}});
  c.push_back({"log of sqrt", {{5}}, [](V a) { return ops::log(ops::sqrt(a[0])); }, {}, {}, true, 0.5f, 2.0f});
  c.push_back({"gelu", {{3, 2}}, [](V a) { return ops::gelu(a[0]); }, {}});
  c.push_back({"add", {{2, 3}, {2, 3}}, [](V a) { return ops::add(a[0], a[1]); }, kTwo});
  c.push_back({"subtract a trailing axis", {{2, 3}, {3}}, [](V a) { return ops::subtract(a[0], a[1]); }, kTwo});
  c.push_back({"multiply by one element", {{2, 3}, {}}, [](V a) { return ops::multiply(a[0], a[1]); }, kTwo});
  c.push_back({"divide", {{4}, {4}}, [](V a) { return ops::divide(a[0], a[1]); }, kTwo, {}, true, 0.5f, 2.0f});
  c.push_back({"maximum", {{3, 2}, {2}}, [](V a) { return ops::maximum(a[0], a[1]); }, kTwo});
  c.push_back({"minimum", {{3, 2}, {3, 2}}, [](V a) { return ops::minimum(a[0], a[1]); }, kTwo});
  c.push_back({"matmul", {{4, 3}, {3, 5}}, [](V a) { return ops::matmul(a[0], a[1]); }, kTwo});
  c.push_back({"matmul b^T", {{2, 4, 3}, {5, 3}}, [](V a) { return ops::matmul(a[0], a[1], false, true); }, kTwo});
  c.push_back({"matmul a^T", {{4, 3}, {4, 2}}, [](V a) { return ops::matmul(a[0], a[1], true, false); }, kTwo});
  c.push_back({"linear", {{4, 3}, {3, 5}, {5}}, [](V a) { return ops::linear(a[0], a[1], a[2]); }, kThree});
  c.push_back({"linear relu, rows in two axes", {{2, 3, 6}, {6, 4}, {4}},
               [](V a) { return ops::linear(a[0], a[1], a[2], true); }, kThree});
  c.push_back({"linear of one row", {{3}, {3, 2}, {2}}, [](V a) { return ops::linear(a[0], a[1], a[2], true); }, kThree});
  c.push_back({"sum and mean", {{2, 3}}, [](V a) { return ops::add(ops::sum(a[0]), ops::mean(ops::square(a[0]))); }, {}});
  c.push_back({"sum_rows, mean_rows", {{3, 2}}, [](V a) { return ops::subtract(ops::sum_rows(a[0]), ops::mean_rows(a[0])); }, {}});
  c.push_back({"sum over axes", {{2, 3, 4}}, [](V a) { return ops::sum(a[0], {0, -1}); }, {}});
  c.push_back({"mean keepdims", {{2, 3}}, [](V a) { return ops::mean(a[0], {1}, true); }, {}});
  c.push_back({"max over an axis", {{3, 4}}, [](V a) { return ops::max(a[0], {-1}); }, {}});
  c.push_back({"transpose", {{2, 3, 4}}, [](V a) { return ops::transpose(a[0], {2, 0, -2}); }, {}});
  c.push_back({"broadcast_to", {{3}}, [](V a) { return ops::broadcast_to(a[0], {2, 3}); }, {}});
  c.push_back({"broadcast_to over 1s", {{2, 1}}, [](V a) { return ops::broadcast_to(a[0], {4, 2, 3}); }, {}});
  c.push_back({"slice", {{4, 5}}, [](V a) { return ops::slice(a[0], {1, 2}, {3, 5}); }, {}});
  c.push_back({"concatenate", {{2, 3}, {2, 1}}, [](V a) { return ops::concatenate({&a[0], &a[1]}, -1); }, kTwo});
  c.push_back({"reshape", {{2, 6}}, [](V a) { return ops::reshape(a[0], {3, 2, 2}); }, {}});
  c.push_back({"softmax", {{3, 4}}, [](V a) { return ops::softmax(a[0]); }, {}});
  c.push_back({"log_softmax", {{2, 5}}, [](V a) { return ops::log_softmax(a[0]); }, {}});
  c.push_back({"stop_gradient", {{2, 2}}, [](V a) { return ops::multiply(ops::stop_gradient(a[0]), a[0]); }, {}});
  c.push_back({"argmax", {{4, 3}}, [](V a) { return ops::argmax(a[0]); }, {}, {}, false});
  c.push_back({"softmax_cross_entropy", {{6, 4}, {6}},
               [](V a) { return ops::softmax_cross_entropy(a[0], a[1]); }, kTwo, {0, 4}});
  const ops::Conv2dOptions same{}, strided{.stride_h = 2, .stride_w = 2, .same = false, .relu = true};
  c.push_back({"conv2d", {{2, 5, 5, 2}, {3, 3, 2, 3}, {3}}, [=](V a) { return ops::conv2d(a[0], a[1], a[2], same); }, kThree});
  c.push_back({"conv2d strided relu", {{2, 6, 5, 2}, {3, 2, 2, 4}, {4}},
               [=](V a) { return ops::conv2d(a[0], a[1], a[2], strided); }, kThree});
  c.push_back({"conv2d without bias", {{1, 4, 4, 3}, {2, 2, 3, 2}}, [=](V a) { return ops::conv2d(a[0], a[1], Array(), same); }, kTwo});
  c.push_back({"avg_pool", {{2, 4, 6, 3}}, [](V a) { return ops::avg_pool(a[0], 2, 2, 2, 2); }, {}});
  c.push_back({"global_avg_pool", {{2, 3, 3, 2}}, [](V a) { return ops::global_avg_pool(a[0]); }, {}});
  c.push_back({"max_pool same", {{2, 5, 5, 2}}, [](V a) { return ops::max_pool(a[0], {.same = true}); }, {}});
  c.push_back({"batch_norm", {{5, 3}, {3}, {3}}, [](V a) {
                 Array mean = ops::eager::zeros_like(a[1]), var = ops::eager::ones({3}, a[1].device());
                 return ops::batch_norm(a[0], a[1], a[2], mean, var).y;
               }, kThree});
  return c;
}

}  // namespace

TEST_CASE("vmap: every primitive's batching rule against a loop over the members, forward and through grad") {
  for (const VCase& c : cases()) {
    CAPTURE(c.name);
    check(c);
  }
}

TEST_CASE("vmap: the batching rules on the CUDA kernels run on the host equal their loop there") {
  pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
  for (const VCase& c : cases()) {
    CAPTURE(c.name);
    std::vector<std::vector<bool>> patterns = c.patterns;
    if (patterns.empty()) patterns.push_back(std::vector<bool>(c.shapes.size(), true));
    check_forward(c, patterns.front());
    if (c.differentiable) check_gradients(c, patterns.front());
  }
}

TEST_CASE("ops::eager's member forms: linear_members and conv2d with stacked weights against each member, and bad shapes") {
  namespace eager = pmap::ops::eager;
  const Array x = host(cuda_testing::random_floats(2 * 5 * 3, 1), {2, 5, 3});
  const Array w = host(cuda_testing::random_floats(2 * 3 * 4, 2), {2, 3, 4});
  const Array b = host(cuda_testing::random_floats(2 * 4, 3), {2, 4});
  Array y = eager::linear_members(x, w, b, true);
  REQUIRE(y.shape() == Shape{2, 5, 4});
  auto part = [](const Array& a, std::int64_t m) { return pmap::core::member_view(a, m); };
  for (std::int64_t m = 0; m < 2; ++m) {
    CHECK(part(y, m).to_vector<float>() == eager::linear(part(x, m), part(w, m), part(b, m), true).to_vector<float>());
  }
  const Array shared = host(cuda_testing::random_floats(5 * 3, 4), {5, 3});
  auto g = eager::linear_members_backward(shared, w, eager::ones({2, 5, 4}, {}), true, true, true);
  CHECK(g.dx.shape() == Shape{5, 3});
  CHECK(g.dw.shape() == Shape{2, 3, 4});
  CHECK(g.dbias.to_vector<float>() == std::vector<float>(8, 5.0f));
  CHECK_THROWS_WITH_AS(eager::linear_members(x, host({1, 2, 3, 4, 5, 6}, {3, 2}), b), doctest::Contains("ops::linear_members: w must be (M, I, O)"),
                       pmap::ShapeError);
  CHECK_THROWS_WITH_AS(eager::linear_members(x, w, host({1, 2, 3, 4}, {4})), doctest::Contains("bias must be (M, O)"),
                       pmap::ShapeError);
  CHECK_THROWS_WITH_AS(eager::linear_members_backward(x, w, eager::ones({2, 5, 3}, {}), true, true, true),
                       doctest::Contains("dy f32(2, 5, 3) is not the output's shape"), pmap::ShapeError);
  const Array images = host(cuda_testing::random_floats(2 * 4 * 4 * 2, 5), {2, 4, 4, 2});
  const Array kernels = host(cuda_testing::random_floats(3 * 2 * 2 * 2 * 3, 6), {3, 2, 2, 2, 3});
  const Array biases = host(cuda_testing::random_floats(9, 7), {3, 3});
  Array z = eager::conv2d(images, kernels, biases);
  REQUIRE(z.shape() == Shape{3, 2, 4, 4, 3});
  for (std::int64_t m = 0; m < 3; ++m) {
    CHECK(part(z, m).to_vector<float>() == eager::conv2d(images, part(kernels, m), part(biases, m)).to_vector<float>());
  }
  CHECK_THROWS_WITH_AS(eager::conv2d(images, kernels, host({1, 2, 3}, {3})), doctest::Contains("must be (3, 3) (M, Cout)"),
                       pmap::ShapeError);
  CHECK_THROWS_WITH_AS(eager::conv2d(host(std::vector<float>(2 * 2 * 4 * 4 * 2), {2, 2, 4, 4, 2}), kernels, biases),
                       doctest::Contains("or w (M, KH, KW, Cin, Cout) with x (M, N, H, W, Cin)"), pmap::ShapeError);
}

TEST_CASE("vmap: dropout's members draw from their own keys, as a loop does") {
  const auto x = host(cuda_testing::random_floats(24, 3), {4, 6});
  std::vector<std::uint32_t> keys;
  for (std::uint32_t m = 0; m < kMembers; ++m) {
    const auto k = pmap::fold_in(pmap::key(5), m);
    keys.push_back(k.k0);
    keys.push_back(k.k1);
  }
  Array stacked_keys = Array::from_host(keys, {kMembers, 2});
  Array step = Array::from_host(std::vector<std::int64_t>{7}, {1});
  const ops::DropoutOptions o{.rate = 0.5f};
  Array y = pmap::vmap([&](const Array& key, const Array& xs) { return ops::dropout(xs, key, step, o); },
                       {0, pmap::none})(stacked_keys, x);
  std::vector<std::vector<float>> loop;
  for (std::int64_t m = 0; m < kMembers; ++m) {
    Array key = Array::from_host(std::vector<std::uint32_t>{keys[2 * m], keys[2 * m + 1]}, {2});
    loop.push_back(ops::dropout(x, key, step, o).to_vector<float>());
  }
  CHECK(y.to_vector<float>() == concat(loop));
  CHECK(loop[0] != loop[1]);
}

TEST_CASE("vmap inside pmap: the collectives combine each member with the same member of the other devices") {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "data");
  // Each device's members: rows 0..2 of its block.
  std::vector<float> xs(2 * kMembers * 4);
  for (std::size_t k = 0; k < xs.size(); ++k) xs[k] = 0.25f * static_cast<float>(k % 7) - 0.5f;
  auto sharded = pmap::shard(Array::from_host(xs, {2 * kMembers, 4}), mesh);
  auto run = pmap::pmap([](const Array& x) {
    auto per_member = pmap::vmap([](const Array& v) {
      Array s = pmap::psum(ops::square(v), "data");
      Array g = pmap::all_gather(v, "data");  // (2, 4) per member
      return std::make_pair(pmap::pmean(ops::add(s, v), "data"), ops::sum(g, {0}));
    }, {}, "per_member");
    return per_member(x);
  }, mesh, "data");
  auto out = run(sharded);
  for (int d = 0; d < 2; ++d) {
    const auto mean = out[d].first.to_vector<float>(), gathered = out[d].second.to_vector<float>();
    for (std::size_t m = 0; m < kMembers; ++m) {
      for (std::size_t j = 0; j < 4; ++j) {
        const float a = xs[m * 4 + j], b = xs[(kMembers + m) * 4 + j], mine = d == 0 ? a : b;
        (void)mine;
        const float s = a * a + b * b;
        CHECK(mean[m * 4 + j] == doctest::Approx(((s + a) + (s + b)) / 2).epsilon(1e-6));
        CHECK(gathered[m * 4 + j] == doctest::Approx(a + b).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("vmap: a data-parallel ensemble step inside pmap gives each member its single-device gradient") {
  // Two members' linear models, the batch sharded over two devices: vmap(value_and_grad) per member, then
  // pmean over "data", against one device with the whole batch.
  const std::int64_t n = 8, in = 3;
  const auto xv = cuda_testing::random_floats(n * in, 11), wv = cuda_testing::random_floats(2 * in, 12);
  const auto yv = cuda_testing::random_floats(n, 13);
  auto step = [](const Array& w, const Array& x, const Array& y) {
    auto loss = [&](const Array& p) { return ops::mean(ops::square(ops::subtract(ops::matmul(x, ops::reshape(p, {3, 1})), ops::reshape(y, {y.dim(0), 1})))); };
    return pmap::vmap([&](const Array& p) { return pmap::value_and_grad(loss)(p); }, {}, "member")(w);
  };
  auto [loss1, grad1] = step(host(wv, {2, in}), host(xv, {n, in}), host(yv, {n}));
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "data");
  auto out = pmap::pmap([&](const Array& w, const Array& x, const Array& y) {
    auto [l, g] = step(w, x, y);
    return std::make_pair(pmap::pmean(l, "data"), pmap::pmean(g, "data"));
  }, mesh, "data")(pmap::replicate(host(wv, {2, in}), mesh), pmap::shard(host(xv, {n, in}), mesh), pmap::shard(host(yv, {n}), mesh));
  for (int d = 0; d < 2; ++d) {
    check_close(out[d].first.to_vector<float>(), loss1.to_vector<float>(), "losses", 1e-6f);
    check_close(out[d].second.to_vector<float>(), grad1.to_vector<float>(), "gradients", 1e-5f);
  }
}

TEST_CASE("vmap: misuse raises an error naming the function and the argument") {
  const Array a = host({1, 2, 3, 4, 5, 6}, {3, 2}), b = host({1, 2, 3, 4}, {2, 2});
  auto add = [](const Array& x, const Array& y) { return ops::add(x, y); };
  SUBCASE("mapped axes of different sizes") {
    CHECK_THROWS_WITH_AS(pmap::vmap(add, {}, "add")(a, b),
                         doctest::Contains("vmap of 'add': argument 1 has 2 along axis 0 but argument 0 has 3"),
                         pmap::ValueError);
  }
  SUBCASE("different sizes inside a tree name the leaf") {
    std::map<std::string, Array> t;
    t.emplace("w", a.copy());
    t.emplace("z", b.copy());
    CHECK_THROWS_WITH_AS(pmap::vmap([](const std::map<std::string, Array>& m) { return ops::sum(m.at("w")); }, {}, "f")(t),
                         doctest::Contains("argument 0, leaf 'z' has 2 along axis 0 but argument 0, leaf 'w' has 3"),
                         pmap::ValueError);
  }
  SUBCASE("in_axes") {
    CHECK_THROWS_WITH_AS(pmap::vmap(add, {0}, "add")(a, a), doctest::Contains("in_axes has 1 entries for a call with 2"),
                         pmap::ValueError);
    CHECK_THROWS_WITH_AS(pmap::vmap(add, {1, 0}, "add")(a, a), doctest::Contains("only 0 (mapped over the leading axis) and none"),
                         pmap::NotAvailable);
    CHECK_THROWS_WITH_AS(pmap::vmap(add, {pmap::none, pmap::none}, "add")(a, a),
                         doctest::Contains("no mapped argument holds an Array"), pmap::ValueError);
    const Array s = Array::scalar(1.0f);
    CHECK_THROWS_WITH_AS(pmap::vmap(add, {}, "add")(a, s), doctest::Contains("argument 1 is f32(), which has no axis 0"),
                         pmap::ValueError);
  }
  SUBCASE("a member's value has no storage: host reads and eager kernels raise") {
    auto read = pmap::vmap([](const Array& x) { return Array::scalar(x.item<float>()); }, {}, "read");
    CHECK_THROWS_WITH_AS(read(host({1, 2}, {2})), doctest::Contains("is one member's value inside vmap"), pmap::ValueError);
    auto to_vec = pmap::vmap([](const Array& x) { return host(x.to_vector<float>(), {1}); }, {}, "to_vector");
    CHECK_THROWS_AS(to_vec(a), pmap::ValueError);
    auto eager = pmap::vmap([](const Array& x) { return ops::eager::relu(x); }, {}, "eager");
    CHECK_THROWS_WITH_AS(eager(a), doctest::Contains("inside vmap"), pmap::ValueError);
    auto moved = pmap::vmap([](const Array& x) { return x.to(pmap::Device{}); }, {}, "to");
    CHECK_THROWS_AS(moved(a), pmap::ValueError);
  }
  SUBCASE("a member's value kept after vmap returned") {
    Array kept;
    pmap::vmap([&](const Array& x) {
      kept = ops::relu(x);
      return ops::sum(x);
    }, {}, "f")(a);
    CHECK_THROWS_WITH_AS(ops::relu(kept), doctest::Contains("computed inside vmap after that vmap returned"), pmap::ValueError);
    CHECK_THROWS_AS(kept.to_vector<float>(), pmap::ValueError);
  }
  SUBCASE("nested vmap, and grad of a non-scalar inside vmap") {
    auto inner = pmap::vmap([](const Array& x) { return ops::relu(x); }, {}, "inner");
    CHECK_THROWS_WITH_AS(pmap::vmap([&](const Array& x) { return inner(x); }, {}, "outer")(host({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2})),
                         doctest::Contains("vmap of 'inner' inside vmap of 'outer'"), pmap::NotAvailable);
    auto g = pmap::vmap([](const Array& x) { return pmap::grad([](const Array& v) { return ops::relu(v); }, "loss")(x); }, {}, "f");
    CHECK_THROWS_WITH_AS(g(a), doctest::Contains("grad of 'loss': the function returned f32(2,)"), pmap::ValueError);
  }
  SUBCASE("the op's own error for members whose shapes do not fit") {
    CHECK_THROWS_AS(pmap::vmap([](const Array& x) { return ops::matmul(x, x); }, {}, "f")(a), pmap::ShapeError);
  }
}

TEST_CASE("vmap: results that do not depend on the mapped arguments are repeated, runs repeat bit for bit") {
  const Array a = host({1, 2, 3, 4, 5, 6}, {3, 2}), c = host({7, 8}, {2});
  auto f = pmap::vmap([](const Array& x, const Array& k) { return std::make_tuple(ops::exp(x), ops::scale(k, 2.0f), k.copy()); },
                      {0, pmap::none}, "f");
  auto [e, twice, same] = f(a, c);
  CHECK(twice.shape() == Shape{3, 2});
  CHECK(twice.to_vector<float>() == std::vector<float>{14, 16, 14, 16, 14, 16});
  CHECK(same.to_vector<float>() == std::vector<float>{7, 8, 7, 8, 7, 8});
  auto [e2, t2, s2] = f(a, c);
  CHECK(e.to_vector<float>() == e2.to_vector<float>());
}

TEST_CASE("vmap: a result that is an argument, or returned twice, is a copy of its own, the members' own results and grad's gradients are moved out") {
  std::vector<float> v{1, 2, 3, 4, 5, 6};
  Array y, z, w;
  {
    Array x = host(v, {3, 2});
    std::tie(y, z, w) = pmap::vmap([](const Array& a) {
      Array r = ops::relu(a);
      return std::make_tuple(a.copy(), r.copy(), std::move(r));
    }, {}, "f")(x);
    CHECK(y.owns_data());
    CHECK(y.raw_data() != x.raw_data());
  }  // x freed: y keeps its values
  CHECK(y.to_vector<float>() == v);
  CHECK(z.to_vector<float>() == v);
  CHECK(w.to_vector<float>() == v);
  CHECK(z.raw_data() != w.raw_data());  // the first is the members' result moved out, the second a copy of it
  CHECK(z.owns_data());
  CHECK(w.owns_data());
  // A result the members' ops made is moved out, not copied: one allocation, the batched relu's.
  {
    Array x = host(v, {3, 2});
    const std::uint64_t before = pmap::detail::allocation_count();
    Array r = pmap::vmap([](const Array& a) { return ops::relu(a); }, {}, "f")(x);
    CHECK(pmap::detail::allocation_count() - before == 1);
    CHECK(r.to_vector<float>() == v);
    // A trace's gradient is its backward pass's buffer, moved out; asked for again, a copy of it.
    Array g1, g2;
    {
      pmap::core::Trace trace("sq");
      Array in = trace.input(x, "x");
      trace.backward(ops::sum(ops::multiply(in, in)));
      const std::uint64_t count = pmap::detail::allocation_count();
      g1 = trace.gradient(in);
      CHECK(pmap::detail::allocation_count() == count);
      g2 = trace.gradient(in);
      CHECK(pmap::detail::allocation_count() == count + 1);
    }
    CHECK(g1.raw_data() != g2.raw_data());
    CHECK(g1.to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
    CHECK(g2.to_vector<float>() == g1.to_vector<float>());
    // Inside vmap, the members' gradients, each its own 2a.
    Array gm = pmap::vmap([](const Array& a) {
      return pmap::grad([](const Array& b) { return ops::sum(ops::multiply(b, b)); }, "sq")(a);
    }, {}, "f")(x);
    CHECK(gm.to_vector<float>() == g1.to_vector<float>());
  }
  // a member without an axis: softmax raises its own error instead of mixing the members
  CHECK_THROWS_AS(pmap::vmap([](const Array& a) { return ops::softmax(ops::mean(a)); }, {}, "f")(host(v, {3, 2})),
                  pmap::Error);
}

namespace {

// Each leaf's values, in tree order.
template <class T> std::vector<std::vector<float>> leaf_values(const T& tree) {
  std::vector<std::vector<float>> out;
  pmap::tree_for_each(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      out.push_back(leaf.dtype() == pmap::DType::f32 ? leaf.template to_vector<float>() : std::vector<float>{});
      if (leaf.dtype() == pmap::DType::i32) {
        for (const std::int32_t v : leaf.template to_vector<std::int32_t>()) out.back().push_back(static_cast<float>(v));
      }
    }
  });
  return out;
}

struct Linear {
  Array w, b;
};
PMAPCC_TREE(Linear, w, b)

}  // namespace

TEST_CASE("core::stack: one part it is given is moved (no copy), a view or several parts are copied") {
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  {
    Array part = host(v, {3, 2});
    const void* storage = part.raw_data();
    std::vector<Array> parts;
    parts.push_back(std::move(part));
    const std::uint64_t before = pmap::detail::allocation_count();
    Array s = pmap::core::stack(std::move(parts));  // a member-by-member rule's result for one member
    CHECK(pmap::detail::allocation_count() == before);
    CHECK(s.raw_data() == storage);
    CHECK(s.shape() == pmap::Shape{1, 3, 2});
    CHECK(s.to_vector<float>() == v);
  }
  {
    Array owner = host(v, {3, 2});
    std::vector<Array> parts;
    parts.push_back(pmap::core::plain_view(owner));  // a view of another array's storage: copied
    Array s = pmap::core::stack(std::move(parts));
    CHECK(s.owns_data());
    CHECK(s.raw_data() != owner.raw_data());
    CHECK(s.shape() == pmap::Shape{1, 3, 2});
    CHECK(s.to_vector<float>() == v);
  }
  {
    std::vector<Array> parts;
    parts.push_back(host(v, {3, 2}));
    const void* first = parts[0].raw_data();
    Array kept = pmap::core::stack(parts);  // given as a const reference: the parts stay, the result is a copy
    CHECK(kept.raw_data() != first);
    CHECK(parts[0].raw_data() == first);
    parts.push_back(host(v, {3, 2}));
    Array two = pmap::core::stack(std::move(parts));
    CHECK(two.shape() == pmap::Shape{2, 3, 2});
    std::vector<float> both = v;
    both.insert(both.end(), v.begin(), v.end());
    CHECK(two.to_vector<float>() == both);
  }
}

TEST_CASE("map: batch by batch gives vmap's results bit for bit, the unmapped and repeated values included") {
  const std::int64_t members = 5, n = 6, in = 4, classes = 3;
  const Linear params{host(cuda_testing::random_floats(members * in * classes, 21), {members, in, classes}),
                      host(cuda_testing::random_floats(members * classes, 22), {members, classes})};
  const Array x = host(cuda_testing::random_floats(n * in, 23), {n, in});
  const Array labels = Array::from_host(std::vector<std::int32_t>{0, 2, 1, 1, 0, 2}, {n});
  auto step = [&](const Linear& p, const Array& xs) {
    auto loss = [&](const Linear& q) {
      Array logits = ops::add(ops::matmul(ops::relu(xs), q.w), q.b);
      return std::make_pair(ops::softmax_cross_entropy(logits, labels), ops::softmax(logits));
    };
    auto [value, grads] = pmap::value_and_grad(loss, "loss")(p);
    Array predicted = ops::argmax(value.second);  // i32: joined as vmap stacks it
    return std::make_tuple(std::move(value.first), std::move(value.second), std::move(grads), ops::scale(xs, 2.0f),
                           std::move(predicted));
  };
  const auto expect = pmap::vmap(step, {0, pmap::none}, "step")(params, x);
  const auto want = leaf_values(expect);
  for (const std::int64_t batch : {1, 2, 3, 5, 8}) {
    CAPTURE(batch);
    const auto got = pmap::map(step, batch, {0, pmap::none}, "step")(params, x);
    CHECK(std::get<0>(got).shape() == Shape{members});
    CHECK(std::get<3>(got).shape() == Shape{members, n, in});  // computed without the members: repeated
    CHECK(std::get<2>(got).w.shape() == params.w.shape());
    CHECK(std::get<4>(got).dtype() == pmap::DType::i32);
    CHECK(std::get<4>(got).shape() == Shape{members, n});
    const auto have = leaf_values(got);
    REQUIRE(have.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) {  // bit for bit (a zero's sign included)
      REQUIRE(have[k].size() == want[k].size());
      CHECK(std::memcmp(have[k].data(), want[k].data(), want[k].size() * sizeof(float)) == 0);
    }
  }
  // The caller's arrays are read, not copied or changed.
  CHECK(params.w.to_vector<float>() == cuda_testing::random_floats(members * in * classes, 21));
}

TEST_CASE("map: grad through map differentiates each batch's part of the stacked leaves, as through vmap") {
  const std::int64_t members = 5, in = 3;
  const Array w = host(cuda_testing::random_floats(members * in, 31), {members, in});
  const Array x = host(cuda_testing::random_floats(in, 32), {in});
  const auto per_member = [&](const Array& v) { return ops::sum(ops::square(ops::multiply(v, x))); };
  const auto total = [&](auto mapper) {
    return [=](const Array& stacked) { return ops::sum(ops::exp(mapper(stacked))); };
  };
  const auto through_vmap = pmap::grad(total([&](const Array& s) { return pmap::vmap(per_member, {}, "m")(s); }), "total")(w);
  for (const std::int64_t batch : {1, 2, 5}) {
    CAPTURE(batch);
    const auto through_map =
        pmap::grad(total([&](const Array& s) { return pmap::map(per_member, batch, {}, "m")(s); }), "total")(w);
    CHECK(through_map.to_vector<float>() == through_vmap.to_vector<float>());
  }
}

TEST_CASE("map: misuse raises an error naming the function") {
  const Array a = host({1, 2, 3, 4, 5, 6}, {3, 2}), b = host({1, 2, 3, 4}, {2, 2});
  auto add = [](const Array& x, const Array& y) { return ops::add(x, y); };
  CHECK_THROWS_WITH_AS(pmap::map(add, 0, {}, "add")(a, a),
                       doctest::Contains("map of 'add': batch_size 0 must be at least 1"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::map(add, -2, {}, "add")(a, a),
                       doctest::Contains("map of 'add': batch_size -2 must be at least 1"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::map(add, 1, {}, "add")(a, b),
                       doctest::Contains("'add': argument 1 has 2 along axis 0 but argument 0 has 3"), pmap::ValueError);
  const Array cube = host({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  const auto relu = [](const Array& v) { return ops::relu(v); };
  CHECK_THROWS_WITH_AS(pmap::vmap([&](const Array& x) { return pmap::map(relu, 1, {}, "inner")(x); }, {}, "outer")(cube),
                       doctest::Contains("map of 'inner' inside vmap"), pmap::NotAvailable);
  // A batch as large as the members is one vmap: vmap's own error for a vmap inside vmap.
  CHECK_THROWS_WITH_AS(pmap::vmap([&](const Array& x) { return pmap::map(relu, 2, {}, "inner")(x); }, {}, "outer")(cube),
                       doctest::Contains("vmap of 'inner' inside vmap of 'outer'"), pmap::NotAvailable);
}

}  // namespace PMAPCC_TEST_FILE
