// jit's graphs (pmapcc/core/jit.h): where the backend records graphs (the host run of the CUDA kernels here,
// the fake GPUs of the stand-in, a GPU), a signature's first replay captures the function and later calls
// are one graph launch with the eager bits; a new static argument or scalar leaf, another thread, or a
// retrace captures again; what the capture refuses (a host sync, a collective, a static argument it cannot
// compare) replays without a graph, counted with its reason.
#include "cuda_testing.h"
#include "grad_checks.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(PMAPCC_CUDA_STANDIN)
#include <pmapcc_standin.h>
#endif

#include <pmap/detail/allocation.h>
#include <pmap/error.h>
#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/jit.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/kernels/array_ops.h>
#include <pmapcc/kernels/backend.h>

namespace {

using grad_checks::host;
using pmap::Array;
namespace ops = pmap::ops;

std::vector<float> bits(const Array& a) { return a.to_vector<float>(); }

struct Mlp {
  Array w1, b1, w2, b2;
};
PMAPCC_TREE(Mlp, w1, b1, w2, b2)

Mlp make_mlp(std::uint32_t seed, const pmap::Device& d = {}) {
  auto on = [&](const std::vector<float>& v, pmap::Shape s) { return Array::from_host(v, std::move(s), d); };
  return {on(cuda_testing::random_floats(4 * 8, seed), {4, 8}), on(cuda_testing::random_floats(8, seed + 1), {8}),
          on(cuda_testing::random_floats(8 * 3, seed + 2), {8, 3}), on(cuda_testing::random_floats(3, seed + 3), {3})};
}

Array loss_of(const Mlp& p, const Array& x, const Array& y) {
  return ops::softmax_cross_entropy(ops::linear(ops::linear(x, p.w1, p.b1, true), p.w2, p.b2), y);
}

// One SGD step at rate lr: (new params, loss).
std::pair<Mlp, Array> sgd_step(const Mlp& p, const Array& x, const Array& y, float lr) {
  auto [loss, g] = pmap::value_and_grad(loss_of, "loss_of")(p, x, y);
  auto update = [&](const Array& w, const Array& gw) { return ops::subtract(w, ops::scale(gw, lr)); };
  return {Mlp{update(p.w1, g.w1), update(p.b1, g.b1), update(p.w2, g.w2), update(p.b2, g.b2)}, std::move(loss)};
}

Array labels(std::int64_t n, const pmap::Device& d = {}) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>((7 * i + 1) % 3);
  return Array::from_host(v, {n}, d);
}

bool same(const Mlp& a, const Mlp& b) {
  return bits(a.w1) == bits(b.w1) && bits(a.b1) == bits(b.b1) && bits(a.w2) == bits(b.w2) && bits(a.b2) == bits(b.b2);
}

struct Config {  // a static argument jit cannot compare between calls
  int unused = 0;
};

}  // namespace

TEST_CASE("jit graphs (host run of the CUDA kernels): one capture, then launches with the eager bits") {
  pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
  const Array x = host(cuda_testing::random_floats(16 * 4, 3), {16, 4});
  const Array y = labels(16);
  std::atomic<int> runs{0};
  auto step = pmap::jit([&](const Mlp& p, const Array& xs, const Array& ys, float lr) {
    ++runs;
    return sgd_step(p, xs, ys, lr);
  }, "sgd_step");
  Mlp eager = make_mlp(10), jitted = make_mlp(10);
  for (int s = 0; s < 6; ++s) {
    auto [next, loss] = sgd_step(eager, x, y, 0.1f);
    eager = std::move(next);
    const std::uint64_t before = pmap::detail::allocation_count();
    auto [jit_next, jit_loss] = step(jitted, x, y, 0.1f);
    const std::uint64_t during = pmap::detail::allocation_count() - before;
    jitted = std::move(jit_next);
    CHECK(bits(jit_loss) == bits(loss));
    CHECK(same(jitted, eager));
    if (s >= 2) CHECK(during == 5);  // a launch allocates its results only: four parameters and the loss
  }
  INFO(step.stats().graph_refusal);
  CHECK(runs == 2);  // the trace and the capture: the launches run no C++ of the function
  auto st = step.stats();
  CHECK(st.traces == 1);
  CHECK(st.replays == 5);
  CHECK(st.graph_captures == 1);
  CHECK(st.graph_launches == 5);
  CHECK(st.graph_refusals == 0);
  CHECK(st.last_allocations == 0);
  CHECK(st.last_result_allocations == 5);

  // A scalar leaf with a new value replays once without a graph (its warm-up), then captures again; so does
  // the earlier value after it (one graph kept).
  for (const float lr : {0.05f, 0.05f, 0.05f, 0.1f, 0.1f}) {
    auto [next, loss] = sgd_step(eager, x, y, lr);
    eager = std::move(next);
    auto [jit_next, jit_loss] = step(jitted, x, y, lr);
    jitted = std::move(jit_next);
    CHECK(bits(jit_loss) == bits(loss));
    CHECK(same(jitted, eager));
  }
  st = step.stats();
  CHECK(st.graph_captures == 3);  // 0.05 (warm-up, capture, launch), 0.1 (warm-up, capture)
  CHECK(st.graph_launches == 8);
  CHECK(runs == 6);

  // Another thread replays once (making its own scratch), then captures its own graph (a graph holds its
  // thread's scratch memory), with the same bits.
  std::thread other([&] {
    pmap::ops::detail::ScopedBackend there(pmap::kernels::cuda_backend_on_host());
    for (int k = 0; k < 2; ++k) {
      auto [a, la] = step(jitted, x, y, 0.1f);
      auto [b, lb] = sgd_step(jitted, x, y, 0.1f);
      CHECK(same(a, b));
      CHECK(bits(la) == bits(lb));
    }
  });
  other.join();
  CHECK(step.stats().graph_captures == 4);
  CHECK(runs == 8);

  // Another default precision captures again: the graph's products are bf16 then, as eager ones.
  const std::vector<float> fp32_loss = bits(sgd_step(jitted, x, y, 0.1f).second);
  {
    ops::DefaultPrecision bf16(pmap::kernels::Precision::bf16);
    auto [a, la] = step(jitted, x, y, 0.1f);
    auto [b, lb] = sgd_step(jitted, x, y, 0.1f);
    CHECK(same(a, b));
    CHECK(bits(la) == bits(lb));
    CHECK(bits(la) != fp32_loss);
  }
  // (the bf16 call replays without a graph, a new precision's warm-up. Its products round their operands
  // into buffers of their own, so the plan does not fit and the next call traces again and the one after
  // captures fp32's graph anew; had it fit, the next would warm up fp32 and the one after capture: five
  // captures either way)
  CHECK(bits(step(jitted, x, y, 0.1f).second) == fp32_loss);
  CHECK(bits(step(jitted, x, y, 0.1f).second) == fp32_loss);
  CHECK(bits(step(jitted, x, y, 0.1f).second) == fp32_loss);
  CHECK(step.stats().graph_captures == 5);

  // The CPU backend records no graphs: the function runs on every replay.
  {
    pmap::ops::detail::ScopedBackend cpu(pmap::kernels::backend_for(pmap::DeviceKind::cpu));
    auto cpu_step = pmap::jit([&](const Mlp& p) { return ops::scale(p.w1, 2.0f); }, "scale");
    for (int s = 0; s < 3; ++s) CHECK(bits(cpu_step(jitted)) == bits(ops::scale(jitted.w1, 2.0f)));
    CHECK(cpu_step.stats().graph_captures == 0);
    CHECK(cpu_step.stats().graph_refusals == 0);
  }
  // Nor with JitOptions{.graphs = false}.
  auto plain = pmap::jit([&](const Mlp& p) { return ops::scale(p.w1, 2.0f); }, "scale", pmap::JitOptions{.graphs = false});
  for (int s = 0; s < 3; ++s) CHECK(bits(plain(jitted)) == bits(ops::scale(jitted.w1, 2.0f)));
  CHECK(plain.stats().graph_captures == 0);
  CHECK(plain.stats().replays == 2);
}

TEST_CASE("jit graphs: results that are arguments or of several kinds, and arguments that change") {
  pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
  // Returns a copy of an argument, a computed value, a scalar and an empty Array.
  auto f = pmap::jit([](const Array& a, const Array& b) {
    return std::make_tuple(ops::copy(a), ops::add(a, b), 3, Array());
  }, "mixed");
  for (int s = 0; s < 4; ++s) {
    const Array a = host(cuda_testing::random_floats(6, 20 + s), {2, 3});
    const Array b = host(cuda_testing::random_floats(6, 40 + s), {2, 3});
    auto [ca, sum, three, empty] = f(a, b);
    CHECK(bits(ca) == bits(a));  // each call's own argument, not the captured call's
    CHECK(bits(sum) == bits(ops::add(a, b)));
    CHECK(three == 3);
    CHECK(!empty.valid());
  }
  CHECK(f.stats().graph_captures == 1);
  CHECK(f.stats().graph_launches == 3);
}

TEST_CASE("jit graphs: what the capture refuses replays without a graph, with the reason") {
  pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
  const Array x = host(cuda_testing::random_floats(8, 5), {8});
  int runs = 0;
  // A copy to the host inside: a graph could not repeat it.
  auto f = pmap::jit([&](const Array& a) {
    ++runs;
    const float first = a.to_vector<float>()[0];
    return ops::scale(a, first);
  }, "reads_host");
  for (int s = 0; s < 4; ++s) CHECK(bits(f(x)) == bits(ops::scale(x, x.to_vector<float>()[0])));
  CHECK(runs == 5);  // the trace, the refused capture and its replay, the trace without a graph, a replay
  auto st = f.stats();
  CHECK(st.graph_captures == 0);
  CHECK(st.graph_refusals == 1);
  CHECK(st.graph_launches == 0);
  CHECK(st.traces == 2);  // traced again without placing its results (they come from the heap)
  CHECK(st.replays == 2);
  CHECK(st.diverged == 0);
  CHECK(st.last_result_allocations == 1);
  CHECK(st.last_allocations == 0);
  CHECK(st.graph_refusal.find("jit of 'reads_host'") != std::string::npos);
  CHECK(st.graph_refusal.find("synchronizes with the host") != std::string::npos);

  // A result that is memory of the closure: a launch could not copy it out once the closure is gone.
  const Array kept = host(cuda_testing::random_floats(8, 9), {8});
  auto h = pmap::jit([&](const Array& a) {
    return std::make_pair(Array::borrow(const_cast<void*>(kept.raw_data()), kept.shape(), kept.dtype()),
                          ops::scale(a, 2.0f));
  }, "closure_result");
  for (int s = 0; s < 3; ++s) {
    auto [k, twice] = h(x);
    CHECK(bits(k) == bits(kept));
    CHECK(bits(twice) == bits(ops::scale(x, 2.0f)));
  }
  CHECK(h.stats().graph_refusals == 1);
  CHECK(h.stats().graph_refusal.find("memory the function did not compute") != std::string::npos);

  // A static argument jit cannot compare: no graph for that signature, said once per trace.
  int config_runs = 0;
  auto g = pmap::jit([&](const Array& a, const Config&) {
    ++config_runs;
    return ops::scale(a, 2.0f);
  }, "configured");
  for (int s = 0; s < 3; ++s) CHECK(bits(g(x, Config{})) == bits(ops::scale(x, 2.0f)));
  CHECK(config_runs == 3);
  CHECK(g.stats().graph_refusals == 1);
  CHECK(g.stats().graph_refusal.find("argument 1 is neither a tree nor a bool, number, enum or string") !=
        std::string::npos);
}

TEST_CASE("jit graphs: a function that throws at its capture passes the error on; the next calls trace and capture") {
  pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
  const Array x = host(cuda_testing::random_floats(8, 5), {8});
  int runs = 0;
  auto f = pmap::jit([&](const Array& a) {
    if (++runs == 2) throw pmap::ValueError("second run");
    return ops::scale(a, 3.0f);
  }, "throws_once");
  CHECK(bits(f(x)) == bits(ops::scale(x, 3.0f)));
  CHECK_THROWS_WITH_AS(f(x), "second run", pmap::ValueError);
  for (int s = 0; s < 3; ++s) CHECK(bits(f(x)) == bits(ops::scale(x, 3.0f)));
  const auto st = f.stats();
  CHECK(st.traces == 2);  // after the throw
  CHECK(st.graph_captures == 1);
  CHECK(st.graph_launches == 2);
  CHECK(runs == 4);
}

TEST_CASE("jit graphs: a jitted function called inside another's capture refuses that capture, and both stay right") {
  pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
  const Array x = host(cuda_testing::random_floats(8, 5), {8});
  auto inner = pmap::jit([](const Array& a) { return ops::scale(a, 3.0f); }, "inner");
  auto outer = pmap::jit([&](const Array& a) { return ops::add(inner(a), a); }, "outer");
  const Array want = ops::add(ops::scale(x, 3.0f), x);
  for (int s = 0; s < 6; ++s) CHECK(bits(outer(x)) == bits(want));
  CHECK(outer.stats().graph_captures == 0);
  CHECK(outer.stats().graph_refusals == 1);
  CHECK(outer.stats().graph_refusal.find("jit of 'inner' called inside the capture of another") != std::string::npos);
  CHECK(inner.stats().graph_launches >= 1);  // its own graph, launched inside the outer's replays
  for (int s = 0; s < 3; ++s) CHECK(bits(inner(x)) == bits(ops::scale(x, 3.0f)));
}

TEST_CASE("jit graphs on cuda devices: inside pmap one graph launch per step, with the eager bits") {
  if (!cuda_testing::gpu_usable()) return;
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, -1), "data");
  const auto xv = cuda_testing::random_floats(16 * 4, 3);
  auto jitted_step = pmap::jit(sgd_step, "sgd_step");
  constexpr int kSteps = 5;
  // kSteps eager steps, or the jitted ones (1 trace, 1 capture, kSteps - 2 launches) after one eager step.
  auto run = [&](bool jitted) {
    return pmap::pmap([&] {
      const pmap::Device dev = pmap::current_device();
      Mlp p = make_mlp(4, dev);
      const Array x = Array::from_host(xv, {16, 4}, dev), y = labels(16, dev);
      std::vector<float> losses;
      for (int s = 0; s < kSteps; ++s) {
        auto [next, loss] = jitted && s > 0 ? jitted_step(p, x, y, 0.1f) : sgd_step(p, x, y, 0.1f);
        p = std::move(next);
        losses.push_back(loss.to_vector<float>()[0]);
      }
      std::vector<float> out = bits(p.w1);
      out.insert(out.end(), losses.begin(), losses.end());
      return Array::from_host(out, {static_cast<std::int64_t>(out.size())});
    }, gpus, "data")();
  };
  const auto eager = run(false);
#if defined(PMAPCC_CUDA_STANDIN)
  const std::uint64_t kernels_before = pmapcc_standin::kernel_launches();
  const std::uint64_t graphs_before = pmapcc_standin::graph_launches();
#endif
  const auto jitted = run(true);
  for (std::size_t d = 0; d < eager.size(); ++d) CHECK(bits(jitted[d]) == bits(eager[d]));
  const auto st = jitted_step.stats();
  const auto n = static_cast<std::uint64_t>(gpus.size());
  INFO(st.graph_refusal);
  CHECK(st.graph_captures == n);
  CHECK(st.graph_launches == n * (kSteps - 2));
  CHECK(st.graph_refusals == 0);
#if defined(PMAPCC_CUDA_STANDIN)
  // The eager run launched kSteps steps' kernels; the jitted one two steps' (the eager step and the trace):
  // the capture recorded, and each launch was one graph.
  const std::uint64_t kernels = pmapcc_standin::kernel_launches() - kernels_before;
  const std::uint64_t graphs = pmapcc_standin::graph_launches() - graphs_before;
  CHECK(graphs == n * (kSteps - 2));
  const std::uint64_t k0 = pmapcc_standin::kernel_launches();
  (void)run(false);
  const std::uint64_t eager_run = pmapcc_standin::kernel_launches() - k0;
  CHECK(eager_run % kSteps == 0);
  CHECK(kernels == eager_run / kSteps * 2);
#endif
}
