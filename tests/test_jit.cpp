// jit (pmapcc/core/jit.h): replays give the eager function's bits with no Array allocated inside them (nor at
// all when the state is donated), new shapes trace again, a replay that leaves its plan stays right and
// retraces, values that escape are refused, and per-device plans inside pmap.
#include "cuda_testing.h"
#include "grad_checks.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pmap/detail/allocation.h>
#include <pmap/error.h>
#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/jit.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/optim/sgd.h>

#include "src/host_cache.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using grad_checks::host;
using pmap::Array;
namespace ops = pmap::ops;

std::vector<float> bits(const Array& a) { return a.to_vector<float>(); }

struct Mlp {
  Array w1, b1, w2, b2;
};
PMAPCC_TREE(Mlp, w1, b1, w2, b2)

Mlp make_mlp(std::uint32_t seed) {
  return {host(cuda_testing::random_floats(4 * 8, seed), {4, 8}), host(cuda_testing::random_floats(8, seed + 1), {8}),
          host(cuda_testing::random_floats(8 * 3, seed + 2), {8, 3}),
          host(cuda_testing::random_floats(3, seed + 3), {3})};
}

Array loss_of(const Mlp& p, const Array& x, const Array& y) {
  return ops::softmax_cross_entropy(ops::linear(ops::linear(x, p.w1, p.b1, true), p.w2, p.b2), y);
}

// One SGD step of the MLP: (new params, loss).
std::pair<Mlp, Array> sgd_step(const Mlp& p, const Array& x, const Array& y) {
  auto [loss, g] = pmap::value_and_grad(loss_of, "loss_of")(p, x, y);
  auto update = [](const Array& w, const Array& gw) { return ops::subtract(w, ops::scale(gw, 0.1f)); };
  return {Mlp{update(p.w1, g.w1), update(p.b1, g.b1), update(p.w2, g.w2), update(p.b2, g.b2)}, std::move(loss)};
}

Array labels(std::int64_t n, std::uint32_t seed) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>((seed + 7 * i) % 3);
  return Array::from_host(v, {n});
}

void check_same(const Mlp& a, const Mlp& b) {
  CHECK(bits(a.w1) == bits(b.w1));
  CHECK(bits(a.b1) == bits(b.b1));
  CHECK(bits(a.w2) == bits(b.w2));
  CHECK(bits(a.b2) == bits(b.b2));
}

}  // namespace

TEST_CASE("jit: a training step replays with the eager bits, allocating only its results") {
  const Array x = host(cuda_testing::random_floats(16 * 4, 3), {16, 4});
  const Array y = labels(16, 1);
  auto step = pmap::jit(sgd_step, "sgd_step");
  Mlp eager = make_mlp(10), jitted = make_mlp(10);
  for (int s = 0; s < 5; ++s) {
    auto [next, loss] = sgd_step(eager, x, y);
    eager = std::move(next);
    const std::uint64_t before = pmap::detail::allocation_count();
    auto [jit_next, jit_loss] = step(jitted, x, y);
    const std::uint64_t during = pmap::detail::allocation_count() - before;
    jitted = std::move(jit_next);
    CHECK(bits(jit_loss) == bits(loss));
    check_same(jitted, eager);
    const auto st = step.stats();
    CHECK(st.last_result_allocations == 5);  // four parameters and the loss
    if (s == 0) {
      CHECK(st.last_allocations > 20);  // the trace: every value of the step from the heap
    } else {
      CHECK(st.last_allocations == 0);  // a replay: nothing but the results
      CHECK(during == 5);
    }
  }
  const auto st = step.stats();
  CHECK(st.traces == 1);
  CHECK(st.replays == 4);
  CHECK(st.diverged == 0);
  CHECK(st.retraces == 0);
  CHECK(st.signatures == 1);
  CHECK(st.arena_bytes > 0);
}

TEST_CASE("jit: a plan's arena takes back the pages of the trace's freed blocks, and replays stay right") {
  namespace d = pmap::detail;
  const std::int64_t n = std::int64_t{3} << 20;  // 12 MiB of floats: each intermediate is a huge block
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) / 97.0f;
  const Array x = Array::from_host(v, {n});
  auto f = [](const Array& a) { return ops::sum(ops::multiply(ops::exp(ops::scale(a, 0.5f)), a)); };
  const float eager = f(x).item<float>();
  d::host_cache_clear();
  const auto before = d::host_cache_stats();
  auto jf = pmap::jit(f, "f");
  // The trace frees its intermediates into the host cache; the plan made at its end gives them back to the
  // system before it allocates its arena.
  CHECK(jf(x).item<float>() == eager);
  const auto planned = d::host_cache_stats();
  CHECK(planned.allocated > before.allocated);
  CHECK(planned.released > before.released);
  CHECK(planned.cached_bytes < static_cast<std::size_t>(n) * 4);
  CHECK(jf.stats().arena_bytes >= static_cast<std::size_t>(n) * 4);
  CHECK(jf(x).item<float>() == eager);
  CHECK(d::host_cache_stats().released == planned.released);  // a replay releases nothing
  d::host_cache_clear();
}

TEST_CASE("jit: a result that is a view of an argument, or an argument's copy, is the caller's own") {
  auto f = pmap::jit([](const Array& x) {
    return std::make_pair(Array::borrow(const_cast<void*>(x.raw_data()), x.shape(), x.dtype()), x.copy());
  }, "f");
  Array x = host({1, 2, 3}, {3});
  for (int i = 0; i < 3; ++i) {
    auto [view, copy] = f(x);
    CHECK(view.owns_data());
    CHECK(view.raw_data() != x.raw_data());
    CHECK(bits(view) == bits(x));
    CHECK(bits(copy) == bits(x));
  }
  CHECK(f.stats().last_allocations == 0);
  CHECK(f.stats().last_result_allocations == 2);
}

TEST_CASE("jit: a new shape traces again and each shape keeps its plan") {
  auto f = pmap::jit([](const Array& a, const Array& b) { return ops::sum(ops::exp(ops::multiply(a, b))); }, "f");
  const Array a4 = host(cuda_testing::random_floats(4, 1), {4}), b4 = host(cuda_testing::random_floats(4, 2), {4});
  const Array a6 = host(cuda_testing::random_floats(6, 3), {6}), b6 = host(cuda_testing::random_floats(6, 4), {6});
  const auto e4 = bits(ops::sum(ops::exp(ops::multiply(a4, b4))));
  const auto e6 = bits(ops::sum(ops::exp(ops::multiply(a6, b6))));
  CHECK(bits(f(a4, b4)) == e4);
  CHECK(bits(f(a6, b6)) == e6);
  CHECK(bits(f(a4, b4)) == e4);
  CHECK(bits(f(a6, b6)) == e6);
  auto st = f.stats();
  CHECK(st.traces == 2);
  CHECK(st.signatures == 2);
  CHECK(st.replays == 2);
  CHECK(st.diverged == 0);
  // A leaf of another dtype is another signature too.
  const Array i4 = Array::from_host(std::vector<std::int32_t>{1, 2, 3, 4}, {4});
  auto g = pmap::jit([](const Array& a) { return ops::reshape(a, {2, 2}); }, "g");
  CHECK(g(a4).dtype() == pmap::DType::f32);
  CHECK(g(i4).dtype() == pmap::DType::i32);
  CHECK(g.stats().signatures == 2);
}

TEST_CASE("jit: a replay that leaves its plan is still right, and the next call traces again") {
  // How many times x is added depends on n, a scalar argument (not part of the signature).
  auto f = [](const Array& x, int n) {
    Array acc = ops::exp(x);
    for (int i = 0; i < n; ++i) acc = ops::add(acc, ops::scale(x, static_cast<float>(i + 1)));
    return acc;
  };
  auto jf = pmap::jit(f, "f");
  const Array x = host(cuda_testing::random_floats(300, 5), {300});
  CHECK(bits(jf(x, 1)) == bits(f(x, 1)));  // trace
  CHECK(bits(jf(x, 1)) == bits(f(x, 1)));  // replay
  CHECK(jf.stats().diverged == 0);
  CHECK(bits(jf(x, 3)) == bits(f(x, 3)));  // replay: more allocations than planned, from the heap
  CHECK(jf.stats().diverged == 1);
  CHECK(bits(jf(x, 3)) == bits(f(x, 3)));  // traced again
  CHECK(bits(jf(x, 3)) == bits(f(x, 3)));  // replay of the new plan
  const auto st = jf.stats();
  CHECK(st.traces == 2);
  CHECK(st.retraces == 1);
  CHECK(st.replays == 3);
  CHECK(st.diverged == 1);
  CHECK(st.last_allocations == 0);
}

TEST_CASE("jit: a buffer alive where the plan reuses its place is left alone") {
  // Traced with keep false, `a` dies before `b` is made, so the plan gives b a's place; replayed with keep
  // true, a is still alive there: b must come from elsewhere and a keep its values.
  auto f = [](const Array& x, bool keep) {
    Array held;
    Array first;
    {
      Array a = ops::exp(x);
      first = ops::sum(a);
      if (keep) held = std::move(a);
    }
    Array b = ops::scale(x, 3.0f);
    return ops::add(first, ops::sum(held.valid() ? ops::multiply(held, b) : ops::negative(b)));
  };
  auto jf = pmap::jit(f, "f");
  const Array x = host(cuda_testing::random_floats(1000, 9), {1000});
  CHECK(bits(jf(x, false)) == bits(f(x, false)));
  CHECK(bits(jf(x, true)) == bits(f(x, true)));
  CHECK(jf.stats().diverged == 1);
  CHECK(bits(jf(x, true)) == bits(f(x, true)));
  CHECK(bits(jf(x, true)) == bits(f(x, true)));
  CHECK(jf.stats().retraces == 1);
  CHECK(jf.stats().diverged == 1);
}

TEST_CASE("jit: a value computed inside that outlives the call raises, and keeps its values") {
  std::vector<Array> leaked;
  auto f = [&](const Array& x, bool leak) {
    Array e = ops::exp(x);
    Array out = ops::sum(e);
    if (leak) leaked.push_back(std::move(e));
    return out;
  };
  auto jf = pmap::jit(f, "leaky");
  const Array x = host(cuda_testing::random_floats(500, 2), {500});
  const Array x2 = host(cuda_testing::random_floats(500, 3), {500});
  // On the trace.
  auto leaky_trace = pmap::jit(f, "leaky");
  CHECK_THROWS_WITH_AS(leaky_trace(x, true), doctest::Contains("jit of 'leaky': 1 array(s) computed inside"),
                       pmap::ValueError);
  leaked.clear();
  // On a replay: the escaped array's place is not handed out again.
  CHECK(bits(jf(x, false)) == bits(f(x, false)));
  CHECK(bits(jf(x, false)) == bits(f(x, false)));
  leaked.clear();
  CHECK_THROWS_WITH_AS(jf(x, true), doctest::Contains("outlived the call"), pmap::ValueError);
  REQUIRE(leaked.size() == 1);
  const auto kept = bits(leaked[0]);
  CHECK(kept == bits(ops::exp(x)));
  CHECK(bits(jf(x2, false)) == bits(f(x2, false)));  // traces again, elsewhere
  CHECK(bits(jf(x2, false)) == bits(f(x2, false)));
  CHECK(bits(leaked[0]) == kept);
}

TEST_CASE("jit: a function that throws passes the error on and traces again") {
  auto f = [](const Array& x, bool fail) {
    Array e = ops::exp(x);
    if (fail) throw pmap::ValueError("asked to fail");
    return ops::sum(e);
  };
  auto jf = pmap::jit(f, "f");
  const Array x = host(cuda_testing::random_floats(64, 2), {64});
  CHECK_THROWS_WITH_AS(jf(x, true), "asked to fail", pmap::ValueError);
  CHECK(bits(jf(x, false)) == bits(f(x, false)));
  CHECK(bits(jf(x, false)) == bits(f(x, false)));
  CHECK_THROWS_WITH_AS(jf(x, true), "asked to fail", pmap::ValueError);  // during a replay
  CHECK(bits(jf(x, false)) == bits(f(x, false)));
  const auto st = jf.stats();
  CHECK(st.traces == 3);    // the first call (it threw), the second, and the last (after a replay threw)
  CHECK(st.retraces == 1);
  CHECK(st.replays == 2);  // the replay that threw and the one before it
}

TEST_CASE("jit: vmap inside a jitted step, and jit inside grad or vmap runs the function as it is") {
  const Array x = host(cuda_testing::random_floats(16 * 4, 3), {16, 4});
  const Array y = labels(16, 2);
  auto members_step = [](const Mlp& p, const Array& xs, const Array& ys) {
    return pmap::vmap(sgd_step, {0, pmap::none, pmap::none}, "member")(p, xs, ys);
  };
  auto step = pmap::jit(members_step, "members_step");
  std::vector<Mlp> members;
  members.push_back(make_mlp(1));
  members.push_back(make_mlp(5));
  Mlp eager = pmap::stack_trees(members);
  Mlp jitted = pmap::stack_trees(members);
  for (int s = 0; s < 3; ++s) {
    auto [e, el] = members_step(eager, x, y);
    auto [j, jl] = step(jitted, x, y);
    eager = std::move(e);
    jitted = std::move(j);
    CHECK(bits(jl) == bits(el));
    check_same(jitted, eager);
    if (s == 0) {
      CHECK(step.stats().last_allocations > 0);  // the trace
    } else {
      CHECK(step.stats().last_allocations == 0);
    }
  }
  CHECK(step.stats().replays == 2);
  CHECK(step.stats().last_allocations == 0);

  auto jloss = pmap::jit(loss_of, "loss_of");
  const Mlp p = make_mlp(3);
  auto g_jit = pmap::grad([&](const Mlp& q) { return jloss(q, x, y); })(p);
  auto g = pmap::grad(loss_of)(p, x, y);
  check_same(g_jit, g);
  CHECK(jloss.stats().unplanned == 1);
  CHECK(jloss.stats().traces == 0);
}

TEST_CASE("jit inside jit: each keeps its own plan, an outer replay allocates only the inner's result") {
  auto inner = pmap::jit(loss_of, "loss_of");
  auto outer_f = [&](const Mlp& p, const Array& x, const Array& y) {
    return ops::add(inner(p, x, y), ops::scale(ops::sum(ops::square(p.w1)), 0.01f));
  };
  auto outer = pmap::jit(outer_f, "outer");
  const Array x = host(cuda_testing::random_floats(16 * 4, 3), {16, 4});
  const Array y = labels(16, 2);
  const Mlp p = make_mlp(6);
  const auto want = bits(ops::add(loss_of(p, x, y), ops::scale(ops::sum(ops::square(p.w1)), 0.01f)));
  for (int i = 0; i < 4; ++i) {
    CHECK(bits(outer(p, x, y)) == want);
    if (i > 0) CHECK(outer.stats().last_allocations == 1);  // the inner jit's result, from the heap
  }
  CHECK(outer.stats().traces == 1);
  CHECK(outer.stats().diverged == 0);
  CHECK(inner.stats().traces == 1);
  CHECK(inner.stats().replays == 3);
}

TEST_CASE("jit and optim: an optimizer's update inside vmap and inside a jitted step, as eager") {
  const pmap::optim::Sgd tx{.learning_rate = 0.1f, .momentum = 0.9f};
  std::vector<Mlp> members;
  members.push_back(make_mlp(1));
  members.push_back(make_mlp(5));
  const Mlp params = pmap::stack_trees(members);
  std::vector<Mlp> grads_each;
  grads_each.push_back(make_mlp(21));
  grads_each.push_back(make_mlp(25));
  const Mlp grads = pmap::stack_trees(grads_each);
  auto state = tx.init(params);
  // Each member's update under vmap is the update of the stacked tree (SGD is element by element).
  auto member_update = [&](const Mlp& g, const Mlp& p) {
    auto one = tx.init(p);
    return tx.update(g, one, p).first;
  };
  const Mlp by_vmap = pmap::vmap(member_update, {}, "member_update")(grads, params);
  const Mlp stacked = tx.update(grads, tx.init(params), params).first;
  check_same(by_vmap, stacked);
  // Jitted: the state is only read, and the step's results match the eager ones.
  auto step = pmap::jit([&](const Mlp& g, const pmap::optim::SgdState& s, const Mlp& p) {
    auto [u, next] = tx.update(g, s, p);
    return std::make_pair(pmap::optim::apply_updates(p, u), std::move(next));
  }, "sgd");
  for (int i = 0; i < 3; ++i) {
    auto [p_jit, s_jit] = step(grads, state, params);
    auto [u, s_eager] = tx.update(grads, state, params);
    check_same(p_jit, pmap::optim::apply_updates(params, u));
    CHECK(bits(s_jit.trace[0]) == bits(s_eager.trace[0]));
    state = std::move(s_jit);
  }
  CHECK(step.stats().replays == 2);
  CHECK(step.stats().last_allocations == 0);
}

TEST_CASE("jit inside pmap: one plan per device, the data-parallel step as eager, nothing allocated on replays") {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "data");
  auto dp_step = [](const Mlp& p, const Array& x, const Array& y) {
    auto [loss, g] = pmap::value_and_grad(loss_of, "loss_of")(p, x, y);
    g = pmap::pmean(g, "data");
    auto update = [](const Array& w, const Array& gw) { return ops::subtract(w, ops::scale(gw, 0.1f)); };
    return std::make_pair(Mlp{update(p.w1, g.w1), update(p.b1, g.b1), update(p.w2, g.w2), update(p.b2, g.b2)},
                          pmap::pmean(loss, "data"));
  };
  auto step = pmap::jit(dp_step, "dp_step");
  const Array x = host(cuda_testing::random_floats(16 * 4, 3), {16, 4});
  const Array y = labels(16, 2);
  auto run = [&](bool jitted) {
    return pmap::pmap([&](const Mlp& p0, const Array& xs, const Array& ys) {
      Mlp p = pmap::tree_copy(p0);
      Array loss;
      std::uint64_t replay_allocations = 0;
      for (int s = 0; s < 4; ++s) {
        const std::uint64_t before = pmap::detail::allocation_count();
        auto [next, l] = jitted ? step(p, xs, ys) : dp_step(p, xs, ys);
        if (s > 0) replay_allocations += pmap::detail::allocation_count() - before;
        p = std::move(next);
        loss = std::move(l);
      }
      return std::make_tuple(std::move(p), std::move(loss), static_cast<std::int64_t>(replay_allocations));
    }, mesh, "data")(pmap::replicate(make_mlp(4), mesh), pmap::shard(x, mesh), pmap::shard(y, mesh));
  };
  auto eager = run(false);
  auto jitted = run(true);
  for (int d = 0; d < 2; ++d) {
    check_same(std::get<0>(jitted[d]), std::get<0>(eager[d]));
    CHECK(bits(std::get<1>(jitted[d])) == bits(std::get<1>(eager[d])));
    CHECK(std::get<2>(jitted[d]) == 3 * 5);  // per replay only the results: four parameters and the loss
  }
  const auto st = step.stats();
  CHECK(st.signatures == 2);
  CHECK(st.traces == 2);
  CHECK(st.replays == 6);
  CHECK(st.diverged == 0);
}

TEST_CASE("ops on cuda devices: jit inside pmap plans device memory and replays with the eager bits") {
  if (!cuda_testing::gpu_usable()) return;
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, -1), "data");
  auto step = pmap::jit(sgd_step, "sgd_step");
  const auto xv = cuda_testing::random_floats(16 * 4, 3);
  auto out = pmap::pmap([&] {
    const pmap::Device dev = pmap::current_device();
    auto on = [&](const Array& a) { return a.to(dev); };
    const Mlp p0 = make_mlp(4);
    Mlp eager{on(p0.w1), on(p0.b1), on(p0.w2), on(p0.b2)}, jitted{on(p0.w1), on(p0.b1), on(p0.w2), on(p0.b2)};
    const Array x = Array::from_host(xv, {16, 4}, dev), y = on(labels(16, 1));
    bool same = true;
    std::int64_t replay_allocations = 0;
    for (int s = 0; s < 3; ++s) {
      auto [e, el] = sgd_step(eager, x, y);
      const std::uint64_t before = pmap::detail::allocation_count();
      auto [j, jl] = step(jitted, x, y);
      // (this thread's count: the stats' latest call may be another device's)
      if (s > 0) replay_allocations += static_cast<std::int64_t>(pmap::detail::allocation_count() - before) - 5;
      same = same && bits(el) == bits(jl) && bits(e.w1) == bits(j.w1) && bits(e.b2) == bits(j.b2);
      eager = std::move(e);
      jitted = std::move(j);
    }
    return std::make_pair(static_cast<std::int64_t>(same ? 1 : 0), replay_allocations);
  }, gpus, "data")();
  for (const auto& [same, allocations] : out) {
    CHECK(same == 1);
    CHECK(allocations == 0);  // per replay, only the results: four parameters and the loss
  }
  CHECK(step.stats().signatures == static_cast<std::size_t>(gpus.size()));
  CHECK(step.stats().diverged == 0);
}

}  // namespace PMAPCC_TEST_FILE
