// Graph capture of a step through the CUDA backend (kernels/graph.h): warm-up, capture and replays give
// bitwise the results of running the ops directly, and what a captured step must not do (allocate, copy
// to or from the host, call a collective, grow scratch memory) raises CaptureError naming it. Each case
// runs on the host run of the CUDA kernels (a recording replayed) and, when one is usable, on a GPU (a
// CUDA graph); also the per-member reductions of the CUDA backend.
#include "cuda_testing.h"

#include <algorithm>

#include <pmap/detail/capture.h>

#if defined(PMAPCC_CUDA_STANDIN)
#include <pmapcc_standin.h>
#endif

#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cpu_backend.h>
#include <pmapcc/kernels/graph.h>

#include "src/host_cache.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using namespace cuda_testing;
namespace k = pmap::kernels;

// A small training step on fixed buffers of one device: conv (+ReLU) -> dense -> loss -> backward -> SGD
// at a learning rate that a cosine schedule with warmup computes from the step counter on the device, so
// every replay of a captured step must use another rate. SGD is optax's: sgd_trace's next trace and update,
// the update added to the weights and the trace copied back (Backend::copy, queued as the capture records it),
// so each replay reads the state the one before wrote.
struct TinyStep {
  static constexpr int kMembers = 2, kBatch = 8, kSide = 6, kChannels = 4, kClasses = 3;
  const k::Backend& be;
  k::Conv2dParams conv{};
  k::DenseParams dense{};
  pmap::Array x, labels, w_conv, w_dense, m_conv, m_dense, next, update, act, logits, dlogits, dact, g_conv,
      g_dense, loss, correct, ws, xent_ws, step, base_lr, lr;
  k::ScheduleParams schedule{};

  TinyStep(const k::Backend& backend, const pmap::Device& d) : be(backend) {
    conv.members = kMembers, conv.batch = kBatch, conv.height = conv.width = kSide, conv.in_channels = 1;
    conv.out_channels = kChannels, conv.shared_input = true, conv.relu = true;
    dense = k::DenseParams{kMembers, kBatch, kSide * kSide * kChannels, kClasses, false};
    const std::size_t act_n = static_cast<std::size_t>(kMembers * kBatch * kSide * kSide * kChannels);
    x = on(d, random_floats(static_cast<std::size_t>(kBatch * kSide * kSide), 1));
    labels = on(d, random_labels(kBatch, kClasses, 2));
    w_conv = on(d, random_floats(static_cast<std::size_t>(kMembers * 9 * kChannels), 3));
    w_dense = on(d, random_floats(static_cast<std::size_t>(kMembers * dense.in_features * kClasses), 4, -0.1f, 0.1f));
    m_conv = zeros(d, static_cast<std::size_t>(w_conv.size()));
    m_dense = zeros(d, static_cast<std::size_t>(w_dense.size()));
    const std::size_t largest = static_cast<std::size_t>(std::max(w_conv.size(), w_dense.size()));
    next = zeros(d, largest), update = zeros(d, largest);
    act = zeros(d, act_n), dact = zeros(d, act_n);
    logits = zeros(d, kMembers * kBatch * kClasses), dlogits = zeros(d, kMembers * kBatch * kClasses);
    g_conv = zeros(d, static_cast<std::size_t>(w_conv.size()));
    g_dense = zeros(d, static_cast<std::size_t>(w_dense.size()));
    loss = zeros(d, kMembers);
    correct = zeros(d, kMembers, pmap::DType::i32);
    ws = zeros(d, be.conv().conv2d_workspace_bytes(conv), pmap::DType::u8);
    xent_ws =
        zeros(d, be.loss().softmax_cross_entropy_workspace_bytes({kMembers, kBatch, kClasses, true}), pmap::DType::u8);
    step = zeros(d, 1, pmap::DType::i64);
    base_lr = on(d, std::vector<float>{0.1f, 0.05f});
    lr = zeros(d, kMembers);
    schedule.kind = k::ScheduleKind::cosine, schedule.warmup_steps = 2, schedule.decay_steps = 4;
  }

  void operator()() {
    const std::size_t act_n = static_cast<std::size_t>(act.size());
    be.conv().conv2d_forward(conv, x.data<float>(), w_conv.data<float>(), nullptr, act.data<float>(), ws.raw_data());
    be.dense().dense_forward(dense, act.data<float>(), w_dense.data<float>(), nullptr, logits.data<float>(), nullptr);
    be.loss().softmax_cross_entropy({kMembers, kBatch, kClasses, true}, logits.data<float>(),
                                    labels.data<std::int32_t>(), loss.data<float>(), dlogits.data<float>(), nullptr,
                                    correct.data<std::int32_t>(), nullptr, xent_ws.raw_data());
    be.dense().dense_backward(dense, act.data<float>(), w_dense.data<float>(), dlogits.data<float>(),
                              dact.data<float>(), g_dense.data<float>(), nullptr, nullptr);
    be.elementwise().activation_backward(k::UnaryOp::relu, act_n, act.data<float>(), dact.data<float>(),
                                         dact.data<float>());
    be.conv().conv2d_backward(conv, x.data<float>(), w_conv.data<float>(), dact.data<float>(), nullptr,
                              g_conv.data<float>(), nullptr, ws.raw_data());
    const k::OptimizerOps& ops = be.optimizer();
    ops.schedule_lr(schedule, kMembers, step.data<std::int64_t>(), base_lr.data<float>(), lr.data<float>());
    sgd(w_conv, m_conv, g_conv);
    sgd(w_dense, m_dense, g_dense);
    ops.increment(step.data<std::int64_t>());
  }

  // w += SGD's update of w from its gradient g and trace m, and m = the next trace (next and update: scratch
  // as large as the largest w).
  void sgd(pmap::Array& w, pmap::Array& m, const pmap::Array& g) {
    const std::size_t n = static_cast<std::size_t>(w.size());
    be.optimizer().sgd_trace(k::SgdParams{0.9f, false}, kMembers, n / kMembers, lr.data<float>(), g.data<float>(),
                             m.data<float>(), next.data<float>(), update.data<float>());
    be.elementwise().binary(k::BinaryOp::add, n, w.data<float>(), n, update.data<float>(), w.data<float>());
    be.copy(m.data<float>(), next.data<float>(), n * sizeof(float));
  }
};

// Runs fn on the target's device inside pmap (so a GPU works on a stream of its own, which a CUDA graph
// can capture).
template <class F> void on_device(const Target& t, F&& fn) {
  pmap::Mesh mesh({t.device}, "i");
  pmap::pmap([&] { fn(); }, mesh, "i")();
}

}  // namespace

TEST_CASE("cuda graphs: warm-up, capture and replays give bitwise the results of direct execution") {
  for (const Target& t : targets()) {
    CAPTURE(t.name);
    on_device(t, [&] {
      TinyStep direct(*t.backend, t.device), graphed(*t.backend, t.device);
      k::StepGraph step(*t.backend);
      for (int i = 0; i < 5; ++i) {
        direct();
        step.run([&] { graphed(); });
        CHECK(step.captured() == (i >= 1));  // call 0 runs eagerly, call 1 captures, later calls replay
      }
      CHECK(graphed.w_conv.to_vector<float>() == direct.w_conv.to_vector<float>());
      CHECK(graphed.w_dense.to_vector<float>() == direct.w_dense.to_vector<float>());
      CHECK(graphed.m_conv.to_vector<float>() == direct.m_conv.to_vector<float>());
      CHECK(graphed.m_dense.to_vector<float>() == direct.m_dense.to_vector<float>());
      CHECK(graphed.loss.to_vector<float>() == direct.loss.to_vector<float>());
      CHECK(graphed.correct.to_vector<std::int32_t>() == direct.correct.to_vector<std::int32_t>());
      // The replays counted their steps and took the schedule's rate of step 4 (cosine 2 steps into 4).
      CHECK(graphed.step.to_vector<std::int64_t>() == std::vector<std::int64_t>{5});
      CHECK(graphed.lr.to_vector<float>() ==
            std::vector<float>{static_cast<float>(0.1f * 0.5), static_cast<float>(0.05f * 0.5)});
      CHECK(graphed.w_conv.to_vector<float>() !=
            TinyStep(*t.backend, t.device).w_conv.to_vector<float>());  // it trained
      // A StepGraph that does not capture runs the body every call.
      int calls = 0;
      k::StepGraph eager(*t.backend, /*capture=*/false);
      for (int i = 0; i < 3; ++i) eager.run([&] { ++calls; });
      CHECK(calls == 3);
      CHECK_FALSE(eager.captured());
    });
  }
}

TEST_CASE("cuda graphs: a copy within one GPU is recorded, and each replay repeats it") {
  for (const Target& t : targets()) {
    if (t.device.is_cpu()) continue;  // (a host run's arrays are host memory: a copy there is refused, below)
    CAPTURE(t.name);
    on_device(t, [&] {
      auto src = zeros(t.device, 4);
      auto dst = zeros(t.device, 4);
      k::StepGraph g(*t.backend);
      for (int i = 0; i < 4; ++i) {
        const std::vector<float> v{1.0f * i, 2.0f * i, 3.0f + i, -1.0f * i};
        src.copy_from_host(v.data(), v.size() * sizeof(float));  // eager, between the launches
        g.run([&] { dst.copy_from(src); });
        CHECK(g.captured() == (i >= 1));
        CHECK(dst.to_vector<float>() == v);
      }
    });
  }
}

TEST_CASE("cuda graphs refuse what a captured step must not do, naming it, and leave no capture open") {
  for (const Target& t : targets()) {
    CAPTURE(t.name);
    on_device(t, [&] {
      const k::Backend& be = *t.backend;
      auto buf = zeros(t.device, 64);
      std::vector<float> host(64);
      auto capture = [&](const std::function<void()>& body) {
        k::StepGraph g(be);
        g.run([] {});  // warm-up
        g.run(body);
      };
      CHECK_THROWS_WITH_AS(capture([&] { pmap::Array more({4}, pmap::DType::f32, t.device); }),
                           doctest::Contains("allocates memory during the capture"), pmap::CaptureError);
      CHECK_THROWS_WITH_AS(capture([&] { buf.copy_to_host(host.data(), buf.nbytes()); }),
                           doctest::Contains("synchronizes with the host"), pmap::CaptureError);
      CHECK_THROWS_WITH_AS(capture([&] { pmap::psum_inplace(buf, "i"); }),
                           doctest::Contains("psum over 'i' meets the other devices"), pmap::CaptureError);
      // An array freed inside the capture: its memory may still be used at a replay (review F3b). Raised when
      // the body ends (a destructor cannot throw).
      {
#if defined(PMAPCC_CUDA_STANDIN)
        const std::size_t quarantined = pmapcc_standin::quarantined_bytes();
#endif
        pmap::Array doomed({4}, pmap::DType::f32, t.device);
        CHECK_THROWS_WITH_AS(capture([&] { pmap::Array gone = std::move(doomed); }),
                             doctest::Contains("is freed during the capture"), pmap::CaptureError);
#if defined(PMAPCC_CUDA_STANDIN)
        // Released once the capture has ended (a CUDA capture refuses cudaFree), not leaked: the stand-in
        // quarantines freed device memory (on a GPU, gpu_checks.sh's memcheck --leak-check sees it).
        if (!t.device.is_cpu()) CHECK(pmapcc_standin::quarantined_bytes() >= quarantined + 16);
#endif
      }
      if (t.device.is_cpu()) {  // a huge host block, a mapping of its own, freed once the capture has ended
        pmap::Array big({static_cast<std::int64_t>(pmap::detail::kHugeBytes / 4) + 16}, pmap::DType::f32, t.device);
        CHECK_THROWS_WITH_AS(capture([&] { pmap::Array gone = std::move(big); }),
                             doctest::Contains("is freed during the capture"), pmap::CaptureError);
      }
      // A random draw into an array would be replayed as the captured draw (review F3a).
      CHECK_THROWS_WITH_AS(capture([&] { pmap::uniform(pmap::key(1), buf); }),
                           doctest::Contains("uniform into"), pmap::CaptureError);
      // Scratch memory that would have to grow (an op without its workspace) is refused too.
      k::Conv2dParams p;
      p.members = 2, p.batch = 64, p.height = p.width = 20, p.in_channels = 3, p.out_channels = 8;
      auto x = zeros(t.device, 2 * 64 * 20 * 20 * 3), w = zeros(t.device, 2 * 9 * 3 * 8),
           y = zeros(t.device, 2 * 64 * 400 * 8);
      CHECK_THROWS_WITH_AS(capture([&] {
                             be.conv().conv2d_forward(p, x.data<float>(), w.data<float>(), nullptr, y.data<float>(),
                                                      nullptr);
                           }),
                           doctest::Contains("scratch memory"), pmap::CaptureError);
      CHECK(pmap::detail::capturing() == nullptr);
      // The device still works normally afterwards.
      be.elementwise().unary(k::UnaryOp::relu, 64, buf.data<float>(), buf.data<float>());
      CHECK(buf.to_vector<float>() == std::vector<float>(64, 0.0f));
    });
  }
}

TEST_CASE("cuda reduce_sum and reduce_mean match the CPU's per-member sums") {
  const int members = 3;
  const std::size_t n = 100003;
  const auto x = random_floats(members * n, 21);
  std::vector<float> sum(members), mean(members);
  k::cpu_backend().loss().reduce_sum(members, n, x.data(), sum.data());
  k::cpu_backend().loss().reduce_mean(members, n, x.data(), mean.data());
  std::vector<float> hs(members), hm(members);  // the host run sums in the CPU's order: the same bits
  k::cuda_backend_on_host().loss().reduce_sum(members, n, x.data(), hs.data());
  k::cuda_backend_on_host().loss().reduce_mean(members, n, x.data(), hm.data());
  CHECK(hs == sum);
  CHECK(hm == mean);
  PMAPCC_REQUIRE_GPU();
  auto gx = on_gpu(x), gs = gpu_floats(members), gm = gpu_floats(members);
  k::backend_for(pmap::DeviceKind::cuda).loss().reduce_sum(members, n, gx.data<float>(), gs.data<float>());
  k::backend_for(pmap::DeviceKind::cuda).loss().reduce_mean(members, n, gx.data<float>(), gm.data<float>());
  CHECK(relative_error(gs.to_vector<float>(), sum) <= kForwardTolerance);
  CHECK(relative_error(gm.to_vector<float>(), mean) <= kForwardTolerance);
}

}  // namespace PMAPCC_TEST_FILE
