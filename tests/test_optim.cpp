// pmap::optim (pmapcc/optim): each optimizer against a host reference over several steps, bit for bit against
// its formulas in float (the per-step scalars from kernels::OptimizerOps), chain's order, the schedules against
// kernels::schedule_factor, the step counter on the device, the CUDA kernels run on the host and on a GPU, a
// data-parallel step inside pmap, the state as a tree (replicate, gather, paths), and every check's error.
#include "cuda_testing.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <pmap/detail/allocation.h>
#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/eager/array_ops_optim.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/optim/optim.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::random_floats;
using cuda_testing::relative_error;
using pmap::Array;
using pmap::Device;
using pmap::Shape;
namespace optim = pmap::optim;
namespace kernels = pmap::kernels;
namespace ops = pmap::ops;
using Host = std::vector<std::vector<float>>;  // a tree's f32 leaves on the host, in tree order

// A small model: two parameter tensors and a scalar leaf, which the optimizers leave alone.
struct Net {
  Array w, b;
  float temperature = 1.0f;
};
PMAPCC_TREE(Net, w, b, temperature)

const Shape kW{3, 4}, kB{4};

struct One {  // a tree of one f32 leaf
  Array w;
};
PMAPCC_TREE(One, w)

Net net_of(const Host& h, const Device& d = {}) {
  return Net{Array::from_host(h[0], kW, d), Array::from_host(h[1], kB, d), 1.0f};
}
template <class T> Host host_of(const T& tree) {
  Host h;
  for (const Array* a : optim::detail::leaves(tree)) h.push_back(a->to_vector<float>());
  return h;
}
Host initial_params() { return {random_floats(12, 1), random_floats(4, 2)}; }
// Step t's gradient, scale x U(-1, 1): its global norm is about 2.3 * scale.
Host grads_at(int t, float scale = 1.0f) {
  Host g{random_floats(12, 100 + 7 * static_cast<std::uint32_t>(t)), random_floats(4, 101 + 7 * static_cast<std::uint32_t>(t))};
  for (auto& leaf : g)
    for (float& x : leaf) x *= scale;
  return g;
}

bool same_bits(const Host& a, const Host& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) return false;
  }
  return true;
}
double max_relative_error(const Host& a, const Host& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, relative_error(a[i], b[i]));
  return e;
}

// `steps` updates of tx from initial_params() with grads_at(t, scale), on `device`: the params after each.
template <class Tx> std::vector<Host> run(const Tx& tx, int steps, float scale = 1.0f, const Device& device = {}) {
  Net params = net_of(initial_params(), device);
  auto state = tx.init(params);
  std::vector<Host> out;
  for (int t = 0; t < steps; ++t) {
    auto [updates, next] = tx.update(net_of(grads_at(t, scale), device), std::move(state), params);
    CHECK(updates.temperature == 1.0f);
    params = optim::apply_updates(params, updates);
    state = std::move(next);
    out.push_back(host_of(params));
  }
  return out;
}

// ---- the optimizers' formulas in float on host buffers, one member ---------------------------------------------
// The per-step scalars come from the CPU optimizer ops (schedule_lr, sum_squares and clip_factor, adam_step_size,
// increment); each element's arithmetic is written out here in float, in Keras's order: the gradient scaled by the
// clipping factor, then the decoupled decay p -= p * wd * lr, then the update.
struct HostFormulas {
  const kernels::OptimizerOps& ops = kernels::backend_for(pmap::DeviceKind::cpu).optimizer();
  optim::Schedule lr;
  float clip_norm = 0.0f;      // > 0: clip_by_global_norm first
  float weight_decay = -1.0f;  // >= 0: decoupled decay
  Host p = initial_params(), m = {std::vector<float>(12), std::vector<float>(4)}, v = m;
  std::int64_t step = 0;

  // The step's learning rate; g scaled by the clipping factor of its global norm when clipping.
  float prepare(Host& g) const {
    float lr_t = 0;
    ops.schedule_lr(lr.factor, 1, &step, &lr.base, &lr_t);
    if (clip_norm > 0) {
      double sumsq = 0;
      for (auto& leaf : g) ops.sum_squares(1, leaf.size(), leaf.data(), &sumsq, true);
      float scale = 1;
      ops.clip_factor(1, &sumsq, clip_norm, &scale);
      for (auto& leaf : g)
        for (float& x : leaf) x *= scale;
    }
    return lr_t;
  }
  void decay(float& x, float lr_t) const {
    if (weight_decay >= 0) x -= x * weight_decay * lr_t;
  }
  void adam(const kernels::AdamParams& a, Host g) {
    const float lr_t = prepare(g);
    float alpha = 0;
    ops.adam_step_size(a, 1, &step, &lr_t, &alpha);
    // 1 - beta computed in double, rounded to float once
    const float one_minus_beta_1 = static_cast<float>(1.0 - a.beta_1);
    const float one_minus_beta_2 = static_cast<float>(1.0 - a.beta_2);
    for (std::size_t i = 0; i < g.size(); ++i) {
      for (std::size_t e = 0; e < g[i].size(); ++e) {
        const float ge = g[i][e];
        float &pe = p[i][e], &me = m[i][e], &ve = v[i][e];
        decay(pe, lr_t);
        me += (ge - me) * one_minus_beta_1;
        ve += (ge * ge - ve) * one_minus_beta_2;
        pe -= (me * alpha) / (std::sqrt(ve) + a.epsilon);
      }
    }
    ops.increment(&step);
  }
  void sgd(const kernels::SgdParams& k, Host g) {
    const float lr_t = prepare(g);
    for (std::size_t i = 0; i < g.size(); ++i) {
      for (std::size_t e = 0; e < g[i].size(); ++e) {
        const float ge = g[i][e];
        float &pe = p[i][e], &me = m[i][e];
        decay(pe, lr_t);
        me = k.momentum * me + ge;
        pe -= k.nesterov ? lr_t * (ge + k.momentum * me) : lr_t * me;
      }
    }
    ops.increment(&step);
  }
};

optim::Schedule warmup_cosine() { return optim::cosine_decay_schedule(0.05f, {.decay_steps = 4, .alpha = 0.1, .warmup_steps = 2}); }

// AdamW against its formulas, step by step from the same params (the moments do not depend on them). The
// formulas' p2 = (p - p wd lr) - step cannot always be reached as p + u with one float u: where p2 - p is
// not exact in float (p changes sign, say) the sums p + u can miss p2. There (and only there) params +
// updates may differ from p2, by at most one ulp of p2 - p; everywhere else it is p2's bits.
template <class Tx> void check_adamw_bits(const Tx& tx, float clip, const optim::Schedule& lr, int steps) {
  const kernels::AdamParams a{0.9, 0.999, 1e-7f};
  HostFormulas k{.lr = lr, .clip_norm = clip, .weight_decay = 0.04f};
  Net params = net_of(initial_params());
  auto state = tx.init(params);
  std::size_t exact = 0, total = 0;
  for (int t = 0; t < steps; ++t) {
    k.p = host_of(params);
    const Host before = k.p;
    k.adam(a, grads_at(t));
    auto [updates, next] = tx.update(net_of(grads_at(t)), std::move(state), params);
    params = optim::apply_updates(params, updates);
    state = std::move(next);
    const Host got = host_of(params);
    for (std::size_t i = 0; i < got.size(); ++i) {
      for (std::size_t e = 0; e < got[i].size(); ++e) {
        const float want = k.p[i][e], have = got[i][e];
        ++total;
        if (std::memcmp(&want, &have, sizeof(float)) == 0) {
          ++exact;
          continue;
        }
        const double diff = static_cast<double>(want) - before[i][e];
        CAPTURE(t);
        CHECK(static_cast<double>(static_cast<float>(diff)) != diff);  // p2 - p not exact: unreachable
        const float u = std::abs(static_cast<float>(diff));
        CHECK(std::abs(static_cast<double>(have) - want) <= static_cast<double>(std::nextafter(u, INFINITY) - u));
      }
    }
  }
  CHECK(exact >= total * 9 / 10);
}

TEST_CASE("optim bits: Sgd, Adam, AdamW and clip-then-Adam equal their formulas in float bit for bit") {
  const int steps = 6;
  for (const optim::Schedule& lr : {optim::Schedule(0.05f), warmup_cosine(),
                                    optim::exponential_decay_schedule(0.05f, {.transition_steps = 2, .decay_rate = 0.5})}) {
    const int kind = static_cast<int>(lr.factor.kind);
    CAPTURE(kind);
    for (bool nesterov : {false, true}) {
      CAPTURE(nesterov);
      const auto ours = run(optim::Sgd{.learning_rate = lr, .momentum = 0.9f, .nesterov = nesterov}, steps);
      HostFormulas k{.lr = lr};
      for (int t = 0; t < steps; ++t) {
        k.sgd({.momentum = 0.9f, .nesterov = nesterov}, grads_at(t));
        CHECK(same_bits(ours[static_cast<std::size_t>(t)], k.p));
      }
    }
    const kernels::AdamParams a{0.9, 0.999, 1e-7f};
    for (float clip : {0.0f, 1.0f, 100.0f}) {  // none, active (norm ~2.3), inactive
      CAPTURE(clip);
      const optim::Adam adam{.learning_rate = lr};
      const auto ours = clip > 0 ? run(optim::chain(optim::clip_by_global_norm(clip), adam), steps) : run(adam, steps);
      HostFormulas k{.lr = lr, .clip_norm = clip};
      for (int t = 0; t < steps; ++t) {
        k.adam(a, grads_at(t));
        CHECK(same_bits(ours[static_cast<std::size_t>(t)], k.p));
      }
      const optim::AdamW adamw{.learning_rate = lr, .weight_decay = 0.04f};
      if (clip > 0) {
        check_adamw_bits(optim::chain(optim::clip_by_global_norm(clip), adamw), clip, lr, steps);
      } else {
        check_adamw_bits(adamw, clip, lr, steps);
      }
    }
  }
}

// ---- host references -------------------------------------------------------------------------------------
TEST_CASE("optim sgd: momentum and Nesterov follow optax.sgd in float over 4 steps") {
  for (float momentum : {0.0f, 0.9f}) {
    for (bool nesterov : {false, true}) {
      CAPTURE(momentum);
      CAPTURE(nesterov);
      const auto ours = run(optim::Sgd{.learning_rate = 0.1f, .momentum = momentum, .nesterov = nesterov}, 4);
      Host p = initial_params(), m = {std::vector<float>(12), std::vector<float>(4)};
      for (int t = 0; t < 4; ++t) {
        const Host g = grads_at(t);
        for (std::size_t i = 0; i < p.size(); ++i) {
          for (std::size_t k = 0; k < p[i].size(); ++k) {
            m[i][k] = momentum * m[i][k] + g[i][k];
            p[i][k] -= 0.1f * (nesterov ? g[i][k] + momentum * m[i][k] : m[i][k]);
          }
        }
        CHECK(same_bits(ours[static_cast<std::size_t>(t)], p));
      }
    }
  }
}

TEST_CASE("optim sgd and adam with weight_decay: Keras's decoupled decay, and who takes the per-member decay") {
  // SGD: p <- p - (p * wd) * lr, then the step from it, in float in place (params + updates rounds once more,
  // optim/adam.h: within an ulp of it).
  const auto ours = run(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f, .weight_decay = 0.3f}, 4);
  Host p = initial_params(), m = {std::vector<float>(12), std::vector<float>(4)};
  for (int t = 0; t < 4; ++t) {
    const Host g = grads_at(t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      for (std::size_t k = 0; k < p[i].size(); ++k) {
        p[i][k] -= p[i][k] * 0.3f * 0.1f;
        m[i][k] = 0.9f * m[i][k] + g[i][k];
        p[i][k] -= 0.1f * m[i][k];
      }
    }
    CHECK(max_relative_error(ours[static_cast<std::size_t>(t)], p) <= 1e-6);
  }
  const auto plain = run(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}, 4);
  CHECK(max_relative_error(ours.back(), plain.back()) > 1e-3);  // the decay did something
  // The per-member form (here one value for the one member) gives the one-value form's bits.
  optim::Sgd injected{.learning_rate = 0.1f, .momentum = 0.9f, .weight_decay = 1.0f};
  REQUIRE(optim::inject(injected, "weight_decay",
                        std::make_shared<const Array>(Array::from_host(std::vector<float>{0.3f}, Shape{1}))));
  CHECK(same_bits(run(injected, 4).back(), ours.back()));
  // Adam with a decay is AdamW with it; without one, Adam.
  const optim::Schedule lr = warmup_cosine();
  CHECK(same_bits(run(optim::Adam{.learning_rate = lr, .weight_decay = 0.5f}, 5).back(),
                  run(optim::AdamW{.learning_rate = lr, .weight_decay = 0.5f}, 5).back()));
  CHECK(same_bits(run(optim::Adam{.learning_rate = lr}, 5).back(),
                  run(optim::AdamW{.learning_rate = lr, .weight_decay = 0.0f}, 5).back()));
  // A decaying Sgd or Adam takes the per-member "weight_decay"; without a decay it leaves it to another
  // transformation of a chain (add_decayed_weights), so that the chain is not ambiguous.
  optim::Sgd decaying{.weight_decay = 0.1f}, plain_sgd{};
  CHECK(optim::inject(decaying, "weight_decay", nullptr));
  CHECK_FALSE(optim::inject(plain_sgd, "weight_decay", nullptr));
  optim::Adam decaying_adam{.weight_decay = 0.1f}, plain_adam{};
  CHECK(optim::inject(decaying_adam, "weight_decay", nullptr));
  CHECK_FALSE(optim::inject(plain_adam, "weight_decay", nullptr));
  auto both = optim::chain(optim::add_decayed_weights(0.1f), optim::Sgd{.weight_decay = 0.1f});
  CHECK_THROWS_WITH_AS(optim::inject(both, "weight_decay", nullptr),
                       doctest::Contains("2 of its transformations take the per-member hyper-parameter 'weight_decay'"),
                       pmap::ValueError);
  auto one = optim::chain(optim::add_decayed_weights(0.1f), optim::Sgd{});
  CHECK(optim::inject(one, "weight_decay", nullptr));
}

TEST_CASE("optim sgd: one pass outside grad (ops::eager::sgd_trace), the ops inside it, so grad follows the update") {
  // Outside any transformation the update is one kernel; the bits are the ops' (the case above) and the
  // formula's in float ("optim bits"). Inside grad: f(p) = sum(p + sgd's update with g = p and a zero trace)
  // = (1 - lr) sum(p).
  const optim::Sgd tx{.learning_rate = 0.1f, .momentum = 0.9f};
  const Net p0 = net_of(initial_params());
  const auto state = tx.init(p0);
  Net g = pmap::grad([&](const Net& p) {
    auto [updates, next] = tx.update(p, state, p);
    const Net q = optim::apply_updates(p, updates);
    return ops::add(ops::sum(q.w), ops::sum(q.b));
  }, "sgd inside grad")(p0);
  for (const Host::value_type& leaf : host_of(g))
    for (float x : leaf) CHECK(x == doctest::Approx(0.9).epsilon(1e-6));
  // Outside grad the update is the one pass: each leaf costs two arrays (its trace and its update), where the
  // ops would make four.
  {
    const One one{Array::from_host(std::vector<float>(4, 1.0f), Shape{4})};
    const auto one_state = tx.init(one);
    std::uint64_t c = pmap::detail::allocation_count();
    auto r1 = tx.update(one, one_state, one);
    const std::uint64_t for_one = pmap::detail::allocation_count() - c;
    c = pmap::detail::allocation_count();
    auto r2 = tx.update(p0, state, p0);
    CHECK(pmap::detail::allocation_count() - c == for_one + 2);
  }
  // The ops (inside vmap, where the gradient is traced) and the one pass give the same bits, signed zeros
  // included: with momentum 0, a negative trace and a -0 gradient make a -0 trace.
  for (float momentum : {0.0f, 0.9f}) {
    for (bool nesterov : {false, true}) {
      CAPTURE(momentum);
      CAPTURE(nesterov);
      const optim::Sgd sgd{.learning_rate = 0.1f, .momentum = momentum, .nesterov = nesterov};
      const One params{Array::from_host(std::vector<float>{-0.0f, 1.0f, -0.0f, 2.0f}, Shape{4})};
      const One g0{Array::from_host(std::vector<float>{-1.0f, 0.5f, -1.0f, -0.0f}, Shape{4})};
      auto [u0, s0] = sgd.update(g0, sgd.init(params), params);  // the trace: momentum 0 or 0.9 times g0
      const std::vector<float> g1{-0.0f, 0.0f, -0.0f, -0.0f};
      auto [u1, s1] = sgd.update(One{Array::from_host(g1, Shape{4})}, s0, params);
      auto [vu, vtrace] = pmap::vmap([&](const One& gm) {
        auto [u, next] = sgd.update(gm, s0, params);
        return std::make_pair(std::move(u), std::move(next.trace));
      }, {0}, "sgd in vmap")(One{Array::from_host(g1, Shape{1, 4})});
      const std::vector<float> fu = u1.w.to_vector<float>(), ft = s1.trace[0].to_vector<float>(),
                               ou = vu.w.to_vector<float>(), ot = vtrace.at(0).to_vector<float>();
      CHECK(std::memcmp(fu.data(), ou.data(), 4 * sizeof(float)) == 0);
      CHECK(std::memcmp(ft.data(), ot.data(), 4 * sizeof(float)) == 0);
      if (momentum == 0.0f) CHECK(std::signbit(ft[0]));  // the -0 trace was made
    }
  }
  // The one-pass op's own checks.
  const Array a = Array::from_host(std::vector<float>(6, 1.0f), Shape{2, 3}),
              b = Array::from_host(std::vector<float>(3, 1.0f), Shape{3}),
              lr = Array::from_host(std::vector<float>{0.1f}, Shape{1}),
              lr2 = Array::from_host(std::vector<float>{0.1f, 0.2f}, Shape{2});
  const kernels::SgdParams sp{0.9f, false};
  CHECK_THROWS_WITH_AS(ops::eager::sgd_trace(sp, a, b, lr), doctest::Contains("trace is"), pmap::ShapeError);
  const Array lr3 = Array::from_host(std::vector<float>{0.1f, 0.2f, 0.3f}, Shape{3});
  CHECK_THROWS_WITH_AS(ops::eager::sgd_trace(sp, a, a, lr3), doctest::Contains("lr is"), pmap::ShapeError);
  CHECK_THROWS_WITH_AS(ops::eager::sgd_trace(sp, b, b, lr2), doctest::Contains("one per row"), pmap::ShapeError);
  {  // One rate per row of the leading (member) axis: each row as the one-rate form with its rate.
    auto [next2, u2] = ops::eager::sgd_trace(sp, a, a, lr2);
    const auto [n1, u1] = ops::eager::sgd_trace(sp, b, b, Array::from_host(std::vector<float>{0.2f}, Shape{1}));
    const auto got = u2.to_vector<float>(), row1 = u1.to_vector<float>();
    CHECK(std::vector<float>(got.begin(), got.begin() + 3) == std::vector<float>(3, -(0.1f * (0.9f * 1.0f + 1.0f))));
    CHECK(std::vector<float>(got.begin() + 3, got.end()) == row1);
    CHECK(next2.to_vector<float>() == std::vector<float>(6, 0.9f * 1.0f + 1.0f));
  }
  {  // The per-member rates and Adam step sizes: each the one-value form's bits for its value.
    const Array step = Array::from_host(std::vector<std::int64_t>{4}, Shape{1});
    const auto sched = optim::cosine_decay_schedule(1.0f, {.decay_steps = 10, .warmup_steps = 2});
    const Array rates = ops::eager::schedule_lr(sched.factor, lr3, step);
    CHECK(rates.shape() == Shape{3});
    const kernels::AdamParams ap{0.9, 0.999, 1e-7f};
    const Array alphas = ops::eager::adam_step_size(ap, step, rates);
    for (int m = 0; m < 3; ++m) {
      const float base = lr3.to_vector<float>()[static_cast<std::size_t>(m)];
      const Array one = ops::eager::schedule_lr(sched.factor, base, step);
      CHECK(rates.to_vector<float>()[static_cast<std::size_t>(m)] == one.to_vector<float>()[0]);
      CHECK(alphas.to_vector<float>()[static_cast<std::size_t>(m)] ==
            ops::eager::adam_step_size(ap, step, one).to_vector<float>()[0]);
    }
    CHECK_THROWS_WITH_AS(ops::eager::schedule_lr(sched.factor, Array(Shape{0}, pmap::DType::f32), step),
                         doctest::Contains("learning_rates is"), pmap::ShapeError);
  }
  CHECK_THROWS_WITH_AS(ops::eager::sgd_trace(sp, a, a, Array::from_host(std::vector<std::int32_t>{1}, Shape{1})), doctest::Contains("lr"),
                       pmap::Error);
  CHECK_THROWS_WITH_AS(ops::eager::sgd_trace({.momentum = -1.0f}, a, a, lr), doctest::Contains("momentum"),
                       pmap::ValueError);
  auto [next, u] = ops::eager::sgd_trace(sp, a, a, lr);  // next = 0.9 + 1, u = -(0.1 * next)
  CHECK(next.to_vector<float>() == std::vector<float>(6, 0.9f * 1.0f + 1.0f));
  CHECK(u.to_vector<float>() == std::vector<float>(6, -(0.1f * (0.9f * 1.0f + 1.0f))));
}

// Adam in double with the bias correction as the paper's epsilon-hat form, at each step's scheduled rate.
Host adam_reference(const optim::Schedule& lr, double b1, double b2, double eps, double wd, int steps) {
  Host p = initial_params();
  std::vector<std::vector<double>> pd(2), m(2), v(2);
  for (std::size_t i = 0; i < 2; ++i) {
    pd[i].assign(p[i].begin(), p[i].end());
    m[i].assign(p[i].size(), 0.0);
    v[i].assign(p[i].size(), 0.0);
  }
  for (int t = 0; t < steps; ++t) {
    const Host g = grads_at(t);
    const double rate = lr.at(t), n = t + 1.0;
    const double alpha = rate * std::sqrt(1 - std::pow(b2, n)) / (1 - std::pow(b1, n));
    for (std::size_t i = 0; i < 2; ++i) {
      for (std::size_t k = 0; k < pd[i].size(); ++k) {
        pd[i][k] -= pd[i][k] * wd * rate;
        m[i][k] = b1 * m[i][k] + (1 - b1) * g[i][k];
        v[i][k] = b2 * v[i][k] + (1 - b2) * g[i][k] * g[i][k];
        pd[i][k] -= alpha * m[i][k] / (std::sqrt(v[i][k]) + eps);
      }
    }
  }
  for (std::size_t i = 0; i < 2; ++i) p[i].assign(pd[i].begin(), pd[i].end());
  return p;
}

TEST_CASE("optim adam and adamw: Keras's Adam in double over 5 steps, with a schedule and decoupled decay") {
  for (const optim::Schedule& lr : {optim::Schedule(0.01f), warmup_cosine()}) {
    const int kind = static_cast<int>(lr.factor.kind);
    CAPTURE(kind);
    const auto adam = run(optim::Adam{.learning_rate = lr, .beta_1 = 0.8, .beta_2 = 0.99, .epsilon = 1e-6f}, 5);
    CHECK(max_relative_error(adam.back(), adam_reference(lr, 0.8, 0.99, 1e-6, 0.0, 5)) <= 1e-5);
    const auto adamw = run(optim::AdamW{.learning_rate = lr, .weight_decay = 0.5f}, 5);
    CHECK(max_relative_error(adamw.back(), adam_reference(lr, 0.9, 0.999, 1e-7, 0.5, 5)) <= 1e-5);
    CHECK(max_relative_error(adamw.back(), adam.back()) > 1e-4);  // the decay did something
  }
}

TEST_CASE("optim rmsprop: Keras's RMSprop in float (and close to double) over 4 steps, with and without momentum") {
  for (float momentum : {0.0f, 0.5f}) {
    CAPTURE(momentum);
    const optim::Schedule lr = optim::piecewise_schedule(0.01f, {.boundaries = {1, 3}, .factors = {0.5, 0.25}});
    const auto ours = run(optim::RmsProp{.learning_rate = lr, .rho = 0.9, .momentum = momentum}, 4);
    Host p = initial_params(), nu = {std::vector<float>(12), std::vector<float>(4)}, trace = nu;
    std::vector<std::vector<double>> pd(2), nud(2, std::vector<double>(16)), trd(2, std::vector<double>(16));
    for (std::size_t i = 0; i < 2; ++i) pd[i].assign(p[i].begin(), p[i].end());
    for (int t = 0; t < 4; ++t) {
      const Host g = grads_at(t);
      const float rate = lr.at(t);
      for (std::size_t i = 0; i < 2; ++i) {
        for (std::size_t k = 0; k < p[i].size(); ++k) {
          nu[i][k] = 0.9f * nu[i][k] + 0.1f * (g[i][k] * g[i][k]);
          const float inc = (rate * g[i][k]) / std::sqrt(nu[i][k] + 1e-7f);
          trace[i][k] = momentum * trace[i][k] + inc;
          p[i][k] -= momentum > 0 ? trace[i][k] : inc;
          nud[i][k] = 0.9 * nud[i][k] + 0.1 * g[i][k] * g[i][k];
          const double incd = rate * static_cast<double>(g[i][k]) / std::sqrt(nud[i][k] + 1e-7);
          trd[i][k] = momentum * trd[i][k] + incd;
          pd[i][k] -= momentum > 0 ? trd[i][k] : incd;
        }
      }
      CHECK(same_bits(ours[static_cast<std::size_t>(t)], p));
    }
    Host from_double(2);
    for (std::size_t i = 0; i < 2; ++i) from_double[i].assign(pd[i].begin(), pd[i].end());
    CHECK(max_relative_error(ours.back(), from_double) <= 1e-5);
  }
}

// ---- composition ------------------------------------------------------------------------------------------
TEST_CASE("optim chain: members run in order, each one's updates the next one's gradients") {
  const optim::Adam adam{.learning_rate = 0.01f};
  const Net params = net_of(initial_params());
  const Host g0 = grads_at(0);
  // clip then adam equals clipping by hand (g * max_norm / ||g||, ||g|| in double) then adam.
  auto tx = optim::chain(optim::clip_by_global_norm(0.5f), adam);
  auto [updates, state] = tx.update(net_of(g0), tx.init(params), params);
  double sumsq = 0;
  for (const auto& leaf : g0)
    for (float x : leaf) sumsq += static_cast<double>(x) * x;
  const float factor = static_cast<float>(0.5 / std::sqrt(sumsq));
  Host clipped = g0;
  for (auto& leaf : clipped)
    for (float& x : leaf) x *= factor;
  auto [manual, adam_state] = adam.update(net_of(clipped), adam.init(params), params);
  CHECK(same_bits(host_of(updates), host_of(manual)));
  CHECK(std::get<1>(state).count.to_vector<std::int64_t>() == std::vector<std::int64_t>{1});
  CHECK(same_bits({std::get<1>(state).mu[0].to_vector<float>()}, {adam_state.mu[0].to_vector<float>()}));
  // adam then add_decayed_weights(wd) then (nothing): Adam's updates + wd * p.
  auto tx2 = optim::chain(adam, optim::add_decayed_weights(0.25f));
  auto [u2, s2] = tx2.update(net_of(g0), tx2.init(params), params);
  auto [ua, sa] = adam.update(net_of(g0), adam.init(params), params);
  const Host a = host_of(ua), p = initial_params();
  Host expected = a;
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t k = 0; k < a[i].size(); ++k) expected[i][k] = a[i][k] + p[i][k] * 0.25f;
  CHECK(same_bits(host_of(u2), expected));
  // The order matters: decay before Adam is L2 regularization, a different update.
  auto tx3 = optim::chain(optim::add_decayed_weights(0.25f), adam);
  auto [u3, s3] = tx3.update(net_of(g0), tx3.init(params), params);
  CHECK_FALSE(same_bits(host_of(u3), host_of(u2)));
}

TEST_CASE("optim state: the count is (1) i64 on the parameters' device, and the state is a tree pmap moves") {
  const optim::Sgd sgd{.learning_rate = 0.1f, .momentum = 0.9f};
  const Net params = net_of(initial_params());
  auto s = sgd.init(params);
  CHECK(s.count.dtype() == pmap::DType::i64);
  CHECK(s.count.shape() == Shape{1});
  CHECK(s.count.device() == params.w.device());
  for (int t = 0; t < 3; ++t) s = sgd.update(net_of(grads_at(t)), std::move(s), params).second;
  CHECK(s.count.item<std::int64_t>() == 3);

  auto tx = optim::chain(optim::clip_by_global_norm(1.0f), optim::Adam{}, optim::add_decayed_weights(0.1f));
  auto state = tx.init(params);
  std::set<std::string> paths;
  pmap::tree_for_each_with_path(state, [&](const std::string& path, const auto&) { paths.insert(path); });
  CHECK(paths == std::set<std::string>{"1/mu/0", "1/mu/1", "1/nu/0", "1/nu/1", "1/count"});
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "data");
  auto replicated = pmap::replicate(state, mesh);
  CHECK(std::get<1>(replicated[1]).count.device() == mesh.devices()[1]);
  auto back = pmap::unreplicate(replicated);
  CHECK(std::get<1>(back).count.item<std::int64_t>() == 0);
  CHECK(pmap::tree_num_leaves(back) == 5);
}

// ---- schedules ----------------------------------------------------------------------------------------------
TEST_CASE("optim schedules: the kernels' factors, on the device from the step counter and on the host") {
  struct Named {
    const char* name;
    optim::Schedule s;
  };
  const std::vector<Named> schedules{
      {"constant", optim::constant_schedule(0.3f)},
      {"constant with warmup", optim::constant_schedule(0.3f, 5)},
      {"piecewise", optim::piecewise_schedule(0.3f, {.boundaries = {2, 6, 9}, .factors = {0.5, 0.1, 0.01}, .warmup_steps = 3})},
      {"exponential", optim::exponential_decay_schedule(0.3f, {.transition_steps = 4, .decay_rate = 0.7, .warmup_steps = 2})},
      {"exponential staircase", optim::exponential_decay_schedule(0.3f, {.transition_steps = 4, .decay_rate = 0.7, .staircase = true})},
      {"cosine", optim::cosine_decay_schedule(0.3f, {.decay_steps = 10, .alpha = 0.2, .warmup_steps = 4})},
  };
  const auto& cpu = kernels::backend_for(pmap::DeviceKind::cpu).optimizer();
  for (const Named& n : schedules) {
    CAPTURE(n.name);
    for (std::int64_t t = 0; t < 25; ++t) {
      CAPTURE(t);
      const double f = kernels::schedule_factor(n.s.factor, t);
      const float expected = f == 1.0 ? n.s.base : static_cast<float>(static_cast<double>(n.s.base) * f);
      float from_kernel = 0;
      cpu.schedule_lr(n.s.factor, 1, &t, &n.s.base, &from_kernel);
      CHECK(n.s.at(t) == expected);
      CHECK(from_kernel == expected);
      const Array count = Array::from_host(std::vector<std::int64_t>{t}, Shape{1});
      CHECK(optim::detail::learning_rate_at(n.s, count).item<float>() == expected);
    }
  }
  // Hand-computed points of the formulas.
  CHECK(schedules[1].s.at(0) == 0.0f);
  CHECK(schedules[1].s.at(5) == 0.3f);
  CHECK(schedules[2].s.at(3 + 6) == static_cast<float>(double{0.3f} * 0.1));
  CHECK(schedules[4].s.at(7) == static_cast<float>(double{0.3f} * 0.7));
  CHECK(schedules[5].s.at(4 + 10) == static_cast<float>(double{0.3f} * 0.2));
  CHECK(schedules[5].s.at(4 + 5) == static_cast<float>(double{0.3f} * (0.2 + 0.8 * 0.5)));
}

// ---- the CUDA code --------------------------------------------------------------------------------------
TEST_CASE("optim on the CUDA kernels run on the host: the CPU ops' bits, every optimizer and transform") {
  auto all = [] {
    std::vector<std::vector<Host>> r;
    r.push_back(run(optim::Sgd{.learning_rate = warmup_cosine(), .momentum = 0.9f, .nesterov = true}, 4));
    r.push_back(run(optim::chain(optim::clip_by_global_norm(1.0f), optim::Adam{.learning_rate = warmup_cosine()}), 4));
    r.push_back(run(optim::AdamW{.learning_rate = 0.01f}, 4));
    r.push_back(run(optim::chain(optim::add_decayed_weights(0.1f), optim::RmsProp{.momentum = 0.5f}), 4));
    return r;
  };
  const auto cpu = all();
  pmap::ops::detail::ScopedBackend scope(kernels::cuda_backend_on_host());
  const auto cuda = all();
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(i);
    for (std::size_t t = 0; t < cpu[i].size(); ++t) CHECK(same_bits(cuda[i][t], cpu[i][t]));
  }
}

TEST_CASE("optim on a GPU: Adam with clipping and a schedule inside pmap gives the CPU's params") {
  PMAPCC_REQUIRE_GPU();
  const auto tx = optim::chain(optim::clip_by_global_norm(1.0f), optim::Adam{.learning_rate = warmup_cosine()});
  const auto cpu = run(tx, 4);
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cuda, 1), "i");
  std::vector<Host> gpu;  // one device: written by its worker alone
  pmap::pmap([&](int) {
    gpu = run(tx, 4, 1.0f, pmap::current_device());
    return 0;
  }, mesh)(0);
  REQUIRE(gpu.size() == cpu.size());
  for (std::size_t t = 0; t < cpu.size(); ++t) CHECK(max_relative_error(gpu[t], cpu[t]) <= 1e-6);
}

// ---- data parallelism -----------------------------------------------------------------------------------
struct Lin {
  Array w, b;
};
PMAPCC_TREE(Lin, w, b)
Lin lin_of(const Host& h) { return Lin{Array::from_host(h[0], kW), Array::from_host(h[1], kB)}; }

Array dp_loss(const Lin& p, const Array& x, const Array& y) {
  return ops::mean(ops::square(ops::subtract(ops::add(ops::matmul(x, p.w), p.b), y)));
}

TEST_CASE("optim inside pmap: Adam on pmean'ed gradients keeps the params identical on 2 CPU devices") {
  const std::int64_t batch = 8;
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "data");
  const optim::Adam tx{.learning_rate = warmup_cosine()};
  const Lin host_params = lin_of(initial_params());
  auto params = pmap::replicate(host_params, mesh);
  auto state = pmap::replicate(tx.init(host_params), mesh);
  const auto x = pmap::shard(Array::from_host(random_floats(batch * 3, 40), {batch, 3}), mesh);
  const auto y = pmap::shard(Array::from_host(random_floats(batch * 4, 41), {batch, 4}), mesh);
  auto step = pmap::pmap([&](const Lin& p, const optim::AdamState& s, const Array& xd, const Array& yd) {
    Lin g = pmap::pmean(pmap::grad(dp_loss, "dp_loss")(p, xd, yd), "data");
    auto [updates, next] = tx.update(g, pmap::tree_copy(s), p);
    return std::make_tuple(optim::apply_updates(p, updates), std::move(next), std::move(g));
  }, mesh);
  Lin ref = lin_of(initial_params());
  auto ref_state = tx.init(ref);
  for (int t = 0; t < 3; ++t) {
    auto out = step(params, state, x, y);
    const Host p0 = host_of(std::get<0>(out[0])), p1 = host_of(std::get<0>(out[1]));
    CHECK(same_bits(p0, p1));
    CHECK(std::get<1>(out[1]).count.item<std::int64_t>() == t + 1);
    // The same update from the same (device 0's) gradient on the host.
    auto [u, next] = tx.update(lin_of(host_of(std::get<2>(out[0]))), std::move(ref_state), ref);
    ref = optim::apply_updates(ref, u);
    ref_state = std::move(next);
    CHECK(same_bits(p0, host_of(ref)));
    for (std::size_t d = 0; d < 2; ++d) {
      params[d] = std::move(std::get<0>(out[d]));
      state[d] = std::move(std::get<1>(out[d]));
    }
  }
}

// ---- errors ------------------------------------------------------------------------------------------------
template <class F> std::string value_error(F&& f) {
  try {
    f();
  } catch (const pmap::ValueError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a ValueError: ") + e.what();
  }
  return "no error";
}
#define CHECK_VALUE_ERROR(expr, ...)                                                        \
  do {                                                                                      \
    const std::string what = value_error([&] { (void)(expr); });                            \
    CAPTURE(what);                                                                          \
    for (const char* part : {__VA_ARGS__}) CHECK(what.find(part) != std::string::npos);     \
  } while (0)

TEST_CASE("optim errors: every bad field is a ValueError naming the optimizer and the field") {
  const Net params = net_of(initial_params());
  CHECK_VALUE_ERROR((optim::Sgd{.learning_rate = -0.1f}.init(params)), "optim::Sgd", "learning_rate", ">= 0");
  CHECK_VALUE_ERROR((optim::Sgd{.learning_rate = NAN}.init(params)), "optim::Sgd", "learning_rate");
  CHECK_VALUE_ERROR((optim::Sgd{.momentum = -1.0f}.init(params)), "optim::Sgd", "momentum");
  CHECK_VALUE_ERROR((optim::Sgd{.weight_decay = -0.1f}.init(params)), "optim::Sgd", "weight_decay");
  CHECK_VALUE_ERROR((optim::Adam{.weight_decay = NAN}.init(params)), "optim::Adam", "weight_decay");
  CHECK_VALUE_ERROR((optim::Adam{.learning_rate = -1.0f}.init(params)), "optim::Adam", "learning_rate");
  CHECK_VALUE_ERROR((optim::Adam{.beta_1 = 1.0}.init(params)), "optim::Adam", "beta_1", "[0, 1)");
  CHECK_VALUE_ERROR((optim::Adam{.beta_1 = -0.1}.init(params)), "optim::Adam", "beta_1");
  CHECK_VALUE_ERROR((optim::Adam{.beta_2 = 1.5}.init(params)), "optim::Adam", "beta_2");
  CHECK_VALUE_ERROR((optim::Adam{.epsilon = 0.0f}.init(params)), "optim::Adam", "epsilon");
  CHECK_VALUE_ERROR((optim::AdamW{.beta_2 = 1.0}.init(params)), "optim::AdamW", "beta_2");
  CHECK_VALUE_ERROR((optim::AdamW{.weight_decay = -0.1f}.init(params)), "optim::AdamW", "weight_decay");
  CHECK_VALUE_ERROR((optim::RmsProp{.learning_rate = -1.0f}.init(params)), "optim::RmsProp", "learning_rate");
  CHECK_VALUE_ERROR((optim::RmsProp{.rho = 1.0}.init(params)), "optim::RmsProp", "rho");
  CHECK_VALUE_ERROR((optim::RmsProp{.momentum = -0.5f}.init(params)), "optim::RmsProp", "momentum");
  CHECK_VALUE_ERROR((optim::RmsProp{.epsilon = -1.0f}.init(params)), "optim::RmsProp", "epsilon");
  CHECK_VALUE_ERROR(optim::clip_by_global_norm(0.0f), "optim::clip_by_global_norm", "max_norm");
  CHECK_VALUE_ERROR(optim::clip_by_global_norm(-1.0f), "optim::clip_by_global_norm", "max_norm");
  CHECK_VALUE_ERROR((optim::ClipByGlobalNorm{.max_norm = 0.0f}.init(params)), "optim::clip_by_global_norm", "max_norm");
  CHECK_VALUE_ERROR(optim::add_decayed_weights(-1.0f), "optim::add_decayed_weights", "weight_decay");
  CHECK_VALUE_ERROR(optim::add_decayed_weights(INFINITY), "optim::add_decayed_weights", "weight_decay");
  // A field made bad after init is caught by update too.
  optim::Adam adam;
  auto state = adam.init(params);
  adam.beta_1 = 2.0;
  CHECK_VALUE_ERROR(adam.update(params, std::move(state), params), "optim::Adam", "beta_1");
  // Schedules: at construction, and inside an optimizer whose schedule was edited.
  CHECK_VALUE_ERROR(optim::constant_schedule(-1.0f), "optim::constant_schedule", "value");
  CHECK_VALUE_ERROR(optim::constant_schedule(1.0f, -1), "optim::constant_schedule", "warmup_steps");
  CHECK_VALUE_ERROR(optim::cosine_decay_schedule(1.0f, {.decay_steps = 0}), "optim::cosine_decay_schedule", "decay_steps");
  CHECK_VALUE_ERROR(optim::cosine_decay_schedule(1.0f, {.alpha = 1.5}), "optim::cosine_decay_schedule", "alpha");
  CHECK_VALUE_ERROR(optim::exponential_decay_schedule(1.0f, {.transition_steps = 0}), "optim::exponential_decay_schedule",
                    "transition_steps");
  CHECK_VALUE_ERROR(optim::exponential_decay_schedule(1.0f, {.decay_rate = 0.0}), "optim::exponential_decay_schedule",
                    "decay_rate");
  CHECK_VALUE_ERROR(optim::piecewise_schedule(1.0f, {.boundaries = {1, 2}, .factors = {0.5}}), "optim::piecewise_schedule",
                    "factors");
  CHECK_VALUE_ERROR(optim::piecewise_schedule(1.0f, {.boundaries = {3, 2}, .factors = {0.5, 0.1}}),
                    "optim::piecewise_schedule", "boundaries");
  CHECK_VALUE_ERROR(optim::piecewise_schedule(1.0f, {.boundaries = {1}, .factors = {-0.5}}), "optim::piecewise_schedule",
                    "factors");
  CHECK_VALUE_ERROR(optim::piecewise_schedule(1.0f, {.boundaries = std::vector<std::int64_t>(9, 1),
                                                     .factors = std::vector<double>(9, 1.0)}),
                    "optim::piecewise_schedule", "boundaries");
  optim::Schedule edited = warmup_cosine();
  edited.factor.decay_steps = 0;
  CHECK_VALUE_ERROR((optim::Sgd{.learning_rate = edited}.init(params)), "optim::Sgd", "learning_rate's decay_steps");
  // No parameters, parameters on two devices, a state that is not from init.
  CHECK_VALUE_ERROR(optim::Adam{}.init(std::vector<Array>{}), "optim::Adam::init", "no Array leaves");
  const auto devices = pmap::local_devices(pmap::DeviceKind::cpu, 2);
  std::vector<Array> split;
  split.push_back(Array(Shape{2}, pmap::DType::f32, devices[0]));
  split.push_back(Array(Shape{2}, pmap::DType::f32, devices[1]));
  CHECK_VALUE_ERROR(optim::Sgd{}.init(split), "optim::Sgd::init", "one device");
  CHECK_VALUE_ERROR(optim::Sgd{}.update(params, optim::SgdState{}, params), "optim::Sgd::update", "count");
  std::vector<Array> ints;
  ints.push_back(Array(Shape{2}, pmap::DType::i32));
  CHECK_VALUE_ERROR(optim::Adam{}.init(ints), "optim::Adam::init", "f32");
}

TEST_CASE("optim errors: trees of different structure or shapes are ShapeErrors naming the function") {
  const Net params = net_of(initial_params());
  const optim::Adam adam;
  std::vector<Array> three;
  for (int i = 0; i < 3; ++i) three.push_back(Array(Shape{2}, pmap::DType::f32));
  auto other = adam.init(three);
  std::vector<Array> two;
  for (int i = 0; i < 2; ++i) two.push_back(Array(Shape{2}, pmap::DType::f32));
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const pmap::ShapeError& e) {
      return std::string(e.what());
    }
    return std::string("no ShapeError");
  };
  // The state of a 3-leaf tree used for a 2-leaf one.
  std::string m = message([&] { (void)adam.update(two, std::move(other), two); });
  CHECK(m.find("optim::Adam::update") != std::string::npos);
  CHECK(m.find("different structure") != std::string::npos);
  // grads and params of different shapes.
  Net wrong = net_of(initial_params());
  wrong.b = Array(Shape{5}, pmap::DType::f32);
  m = message([&] { (void)adam.update(wrong, adam.init(params), params); });
  CHECK(m.find("leaf 1") != std::string::npos);
  m = message([&] { (void)optim::apply_updates(params, wrong); });
  CHECK(m.find("optim::apply_updates") != std::string::npos);
  auto tx = optim::chain(optim::clip_by_global_norm(1.0f), optim::Sgd{});
  auto s = tx.init(two);
  m = message([&] { (void)tx.update(three, std::move(s), three); });
  CHECK(m.find("optim::Sgd::update") != std::string::npos);
  m = message([&] { (void)optim::RmsProp{.momentum = 0.9f}.update(two, optim::RmsProp{}.init(two), two); });
  CHECK(m.find("momentum trace") != std::string::npos);
}

}  // namespace

}  // namespace PMAPCC_TEST_FILE
