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
#include <cuda_runtime.h>
#include <pmapcc_standin.h>
#endif

#include <pmap/detail/allocation.h>
#include <pmap/error.h>
#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/jit.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>

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

TEST_CASE("jit graphs: a function that throws at its capture passes the error on, the next calls trace and capture") {
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

namespace {

// A data-parallel SGD step with a collective of every kind NCCL runs: the gradients pmean'd, the loss
// pmax'd (NCCL's max through order keys), and a checksum of the first bias through all_gather,
// psum_scatter and a ring ppermute. Returns (params, {max loss, checksum}).
std::pair<Mlp, std::vector<Array>> dp_step(const Mlp& p, const Array& x, const Array& y, float lr) {
  auto [loss, g] = pmap::value_and_grad(loss_of, "loss_of")(p, x, y);
  auto update = [&](const Array& w, const Array& gw) {
    return ops::subtract(w, ops::scale(pmap::pmean(gw, "data"), lr));
  };
  const int n = pmap::axis_size("data");
  std::vector<std::pair<int, int>> ring;
  for (int i = 0; i < n; ++i) ring.emplace_back(i, (i + 1) % n);
  const Array gathered = pmap::all_gather(p.b1, "data");  // (n, 8)
  const Array mine = pmap::psum_scatter(gathered, "data");  // (8): row `rank` summed over the devices
  Array check = ops::add(ops::sum(mine), ops::sum(pmap::ppermute(p.b1, "data", ring)));
  std::vector<Array> extra;
  extra.push_back(pmap::pmax(loss, "data"));
  extra.push_back(std::move(check));
  return {Mlp{update(p.w1, g.w1), update(p.b1, g.b1), update(p.w2, g.w2), update(p.b2, g.b2)}, std::move(extra)};
}

// kSteps data-parallel steps on every GPU (each its own shard of x), eager or jitted after one eager step:
// per device, its w1's bits then each step's max loss and checksum.
pmap::Sharded<Array> run_dp(const pmap::Mesh& gpus, pmap::Jitted<decltype(&dp_step)>* jitted, int steps) {
  return pmap::pmap([&] {
    const pmap::Device dev = pmap::current_device();
    const int rank = pmap::axis_index("data");
    Mlp p = make_mlp(4, dev);
    const Array x = Array::from_host(cuda_testing::random_floats(16 * 4, 30 + static_cast<std::uint32_t>(rank)),
                                     {16, 4}, dev);
    const Array y = labels(16, dev);
    std::vector<float> out;
    for (int s = 0; s < steps; ++s) {
      auto [next, extra] = jitted != nullptr && s > 0 ? (*jitted)(p, x, y, 0.1f) : dp_step(p, x, y, 0.1f);
      p = std::move(next);
      for (const Array& e : extra) out.push_back(e.to_vector<float>()[0]);
    }
    const auto w = bits(p.w1);
    out.insert(out.begin(), w.begin(), w.end());
    return Array::from_host(out, {static_cast<std::int64_t>(out.size())});
  }, gpus, "data")();
}

}  // namespace

TEST_CASE("cuda graphs with collectives: jit records a data-parallel step's collectives, one launch per step") {
  // NCCL's collectives on several GPUs (recorded into each device's graph; each launch meets the peers on
  // the host first), or a one-GPU mesh's local collectives (copies on the stream).
  if (!cuda_testing::gpu_usable()) return;
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, -1), "data");
  const auto n = static_cast<std::uint64_t>(gpus.size());
  constexpr int kSteps = 6;
  const auto eager = run_dp(gpus, nullptr, kSteps);
  auto step = pmap::jit(dp_step, "dp_step");
#if defined(PMAPCC_CUDA_STANDIN)
  const std::uint64_t graphs_before = pmapcc_standin::graph_launches();
#endif
  const auto jitted = run_dp(gpus, &step, kSteps);
  for (std::size_t d = 0; d < eager.size(); ++d) CHECK(bits(jitted[d]) == bits(eager[d]));
  auto st = step.stats();
  INFO(st.graph_refusal);
  CHECK(st.graph_refusals == 0);
  CHECK(st.graph_captures == n);  // (one eager step, the trace, the capture and its launch, 3 more launches)
  CHECK(st.graph_launches == n * (kSteps - 2));
  CHECK(st.last_allocations == 0);
#if defined(PMAPCC_CUDA_STANDIN)
  CHECK(pmapcc_standin::graph_launches() - graphs_before == n * (kSteps - 2));
#endif

  // The jitted function outlives the mesh: the mesh's communicators drop its graphs before NCCL tears
  // them down (the stand-in stops the program otherwise: NCCL would wait for them forever), and a new
  // mesh captures again, with the same bits.
  {
    pmap::Mesh again(pmap::local_devices(pmap::DeviceKind::cuda, -1), "data");
    const auto second = run_dp(again, &step, kSteps);
    for (std::size_t d = 0; d < eager.size(); ++d) CHECK(bits(second[d]) == bits(eager[d]));
  }
  st = step.stats();
  CHECK(st.graph_refusals == 0);
  CHECK(st.graph_captures == 2 * n);
  CHECK(st.graph_launches == 2 * n * (kSteps - 2));
}

TEST_CASE("cuda graphs with collectives: a device that launches while another calls a collective raises, never hangs") {
  if (!cuda_testing::gpu_usable()) return;
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, -1), "data");
  if (gpus.size() < 2) return;  // (a one-GPU mesh's graphs meet no peer)
  auto step = pmap::jit(dp_step, "dp_step");
  auto diverging = pmap::pmap([&] {
    const pmap::Device dev = pmap::current_device();
    Mlp p = make_mlp(4, dev);
    const Array x = Array::from_host(cuda_testing::random_floats(16 * 4, 3), {16, 4}, dev), y = labels(16, dev);
    for (int s = 0; s < 2; ++s) p = step(p, x, y, 0.1f).first;  // the trace, the capture and its launch
    if (pmap::axis_index("data") == 0) {
      p = step(p, x, y, 0.1f).first;  // a launch: it meets the peers first
    } else {
      (void)pmap::psum(p.b2, "data");  // ... which do something else
    }
    return std::move(p.b2);
  }, gpus, "data");
  CHECK_THROWS_WITH_AS(diverging(), doctest::Contains("the launch of a jitted graph holding collectives"),
                       pmap::CollectiveMismatch);
  CHECK(step.stats().graph_captures == static_cast<std::uint64_t>(gpus.size()));
}

TEST_CASE("cuda graphs with collectives: a capture refused on one device only fails one call, then none records") {
  // Device 0 reads its argument on the host (refused in a capture) before the psum; the others record the
  // psum. NCCL needs every device to record a collective or none: that call raises CollectiveMismatch, and
  // from then on every device replays the function without a graph.
  if (!cuda_testing::gpu_usable()) return;
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, -1), "data");
  if (gpus.size() < 2) return;
  auto f = pmap::jit([](const Array& a) {
    if (pmap::axis_index("data") == 0) (void)a.to_vector<float>();
    return pmap::psum(a, "data");
  }, "reads_on_device_0");
  const auto n = static_cast<float>(gpus.size());
  auto call = pmap::pmap([&] {
    return f(Array::from_host(std::vector<float>{1, 2, 3}, {3}, pmap::current_device()));
  }, gpus, "data");
  const auto right = [&] {
    const auto out = call();
    for (std::size_t d = 0; d < out.size(); ++d) CHECK(bits(out[d]) == std::vector<float>{n, 2 * n, 3 * n});
  };
  right();  // the trace
  CHECK_THROWS_WITH_AS(call(), doctest::Contains("recording it into a CUDA graph"), pmap::CollectiveMismatch);
  for (int s = 0; s < 3; ++s) right();
  const auto st = f.stats();
  CHECK(st.graph_captures == 0);
  CHECK(st.graph_launches == 0);
  CHECK(st.graph_refusals == static_cast<std::uint64_t>(gpus.size()));
}

TEST_CASE("cuda graphs with collectives: devices launching different graphs raise, never hang") {
  // Two jitted functions whose collectives differ (a psum of 4 elements, one of 3): both captured on every
  // device, then one device launches the first while the others launch the second.
  if (!cuda_testing::gpu_usable()) return;
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, -1), "data");
  if (gpus.size() < 2) return;
  auto f = pmap::jit([](const Array& a) { return pmap::psum(a, "data"); }, "psum4");
  auto g = pmap::jit([](const Array& a) { return pmap::psum(a, "data"); }, "psum3");
  auto differing = pmap::pmap([&] {
    const pmap::Device dev = pmap::current_device();
    const Array a = Array::from_host(std::vector<float>{1, 2, 3, 4}, {4}, dev);
    const Array b = Array::from_host(std::vector<float>{1, 2, 3}, {3}, dev);
    for (int s = 0; s < 2; ++s) {  // the trace, then the capture and its launch, of each
      CHECK(f(a).to_vector<float>()[3] == 4.0f * static_cast<float>(pmap::axis_size("data")));
      CHECK(g(b).to_vector<float>()[2] == 3.0f * static_cast<float>(pmap::axis_size("data")));
    }
    return pmap::axis_index("data") == 0 ? f(a) : g(b);
  }, gpus, "data");
  CHECK_THROWS_WITH_AS(differing(), doctest::Contains("the launch of a jitted graph holding collectives"),
                       pmap::CollectiveMismatch);
  CHECK(f.stats().graph_captures == static_cast<std::uint64_t>(gpus.size()));
  CHECK(g.stats().graph_captures == static_cast<std::uint64_t>(gpus.size()));
}

TEST_CASE("cuda graphs with collectives: what a graph does not record replays without one, with the eager bits") {
  if (!cuda_testing::gpu_usable()) return;
  // Virtual devices on one GPU meet in the host hub: their collectives are refused, on every device alike.
  {
    const std::vector<pmap::Device> virtual_devices{{pmap::DeviceKind::cuda, 0, 0}, {pmap::DeviceKind::cuda, 1, 0}};
    pmap::Mesh shared(virtual_devices, "data");
    const auto eager = run_dp(shared, nullptr, 5);
    auto step = pmap::jit(dp_step, "dp_step");
    const auto jitted = run_dp(shared, &step, 5);
    for (std::size_t d = 0; d < eager.size(); ++d) CHECK(bits(jitted[d]) == bits(eager[d]));
    const auto st = step.stats();
    CHECK(st.graph_captures == 0);
    CHECK(st.graph_refusals == 2);
    CHECK(st.graph_refusal.find("meets the other devices on the host") != std::string::npos);
  }
  // On a 2x2 mesh of GPUs, collectives over "data" and over "model" (both NCCL): one graph records one such
  // axis's collectives, so the second axis's are refused.
  std::vector<pmap::Device> four = pmap::local_devices(pmap::DeviceKind::cuda, -1);
  if (four.size() < 4) return;
  four.resize(4);
  pmap::Mesh grid(four, {{"data", 2}, {"model", 2}});
  auto both = [](const Array& a) { return pmap::psum(pmap::psum(a, "data"), "model"); };
  auto step = pmap::jit(both, "both_axes");
  const auto out = pmap::pmap([&] {
    const Array a = Array::from_host(std::vector<float>{1, 2}, {2}, pmap::current_device());
    Array r;
    for (int s = 0; s < 4; ++s) r = step(a);
    CHECK(bits(r) == bits(both(a)));
    return r;
  }, grid, {"data", "model"})();
  CHECK(bits(out[0]) == std::vector<float>{4, 8});
  const auto st = step.stats();
  CHECK(st.graph_captures == 0);
  CHECK(st.graph_refusals == 4);
  CHECK(st.graph_refusal.find("a second axis with several devices") != std::string::npos);
}

#if defined(PMAPCC_CUDA_STANDIN)
TEST_CASE("cuda graphs with collectives (stand-in only): a launch that fails on one GPU fails the step on all, never hangs") {
  // The launch fails on one GPU after the meeting, so its peers' graphs wait on the GPU for collectives that
  // never come: their wait gives up (the mesh's failure, then the abort grace), aborts NCCL (dropping the
  // graphs first: NCCL's abort waits for them) and pmap raises the first failure.
  if (!cuda_testing::gpu_usable()) return;
  pmap::Mesh gpus(pmap::local_devices(pmap::DeviceKind::cuda, -1), "data");
  if (gpus.size() < 2) return;
  auto step = pmap::jit(dp_step, "dp_step");
  std::atomic<int> ready{0};
  auto failing = pmap::pmap([&] {
    const pmap::Device dev = pmap::current_device();
    Mlp p = make_mlp(4, dev);
    const Array x = Array::from_host(cuda_testing::random_floats(16 * 4, 3), {16, 4}, dev), y = labels(16, dev);
    for (int s = 0; s < 2; ++s) p = step(p, x, y, 0.1f).first;  // the trace, the capture and its launch
    pmap::psum(Array::from_host(std::vector<float>{1.0f}, {1}, dev), "data").to_vector<float>();  // all here
    if (++ready == pmap::axis_size("data")) pmapcc_standin::inject_fault("cudaGraphLaunch", cudaErrorInvalidValue);
    pmap::psum(Array::from_host(std::vector<float>{1.0f}, {1}, dev), "data").to_vector<float>();  // injected
    p = step(p, x, y, 0.1f).first;  // one GPU's launch fails
    return std::move(p.b2);
  }, gpus, "data");
  CHECK_THROWS_AS(failing(), pmap::CudaError);
  pmapcc_standin::clear_faults();
  CHECK(step.stats().graph_captures == static_cast<std::uint64_t>(gpus.size()));
}
#endif

}  // namespace PMAPCC_TEST_FILE
