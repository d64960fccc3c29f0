// CUDA-only kernel entry points: GraphStep (capture once, replay) gives bitwise the results of running the
// same ops directly; the Thrust reductions match the CPU's. Compiled only in CUDA builds (they call
// kernels/cuda directly); each case skips itself without a GPU.
#include "cuda_testing.h"

#if PMAPCC_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <pmap/detail/cuda_stream.h>

#include "kernels/cuda/graph.h"
#include "kernels/cuda/ops.h"
#include "kernels/ops.h"

namespace {

using namespace cuda_testing;
namespace k = pmap::kernels;

// A stream of the test's own (graphs cannot capture the legacy default stream), current for the scope.
class TestStream {
 public:
  TestStream() {
    REQUIRE(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess);
    scope_.emplace(stream_);
  }
  ~TestStream() {
    scope_.reset();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  void sync() const { REQUIRE(cudaStreamSynchronize(stream_) == cudaSuccess); }

 private:
  cudaStream_t stream_ = nullptr;
  std::optional<pmap::detail::StreamScope> scope_;
};

// A small training step on fixed device buffers: conv -> relu -> dense -> loss -> backward -> SGD.
struct TinyStep {
  static constexpr int kMembers = 2, kBatch = 8, kSide = 6, kChannels = 4, kClasses = 3;
  k::Conv2dParams conv{};
  k::DenseParams dense{};
  pmap::Array x, labels, w_conv, w_dense, m_conv, m_dense, act, relu, logits, dlogits, dact, g_conv, g_dense, loss,
      correct, ws;

  TinyStep() {
    conv.members = kMembers, conv.batch = kBatch, conv.height = conv.width = kSide, conv.in_channels = 1;
    conv.out_channels = kChannels, conv.shared_input = true;
    dense = k::DenseParams{kMembers, kBatch, kSide * kSide * kChannels, kClasses, false};
    const std::size_t act_n = static_cast<std::size_t>(kMembers * kBatch * kSide * kSide * kChannels);
    x = on_gpu(random_floats(static_cast<std::size_t>(kBatch * kSide * kSide), 1));
    labels = on_gpu(random_labels(kBatch, kClasses, 2));
    w_conv = on_gpu(random_floats(static_cast<std::size_t>(kMembers * 9 * kChannels), 3));
    w_dense = on_gpu(random_floats(static_cast<std::size_t>(kMembers * dense.in_features * kClasses), 4, -0.1f, 0.1f));
    m_conv = gpu_floats(w_conv.size()), m_dense = gpu_floats(w_dense.size());
    act = gpu_floats(act_n), relu = gpu_floats(act_n), dact = gpu_floats(act_n);
    logits = gpu_floats(kMembers * kBatch * kClasses), dlogits = gpu_floats(kMembers * kBatch * kClasses);
    g_conv = gpu_floats(w_conv.size()), g_dense = gpu_floats(w_dense.size());
    loss = gpu_floats(kMembers);
    correct = pmap::Array({kMembers}, pmap::DType::i32, kGpu);
    ws = pmap::Array({static_cast<std::int64_t>(k::gpu::conv2d_workspace_bytes(conv))}, pmap::DType::u8, kGpu);
  }

  void operator()() {
    const std::size_t act_n = static_cast<std::size_t>(act.size());
    k::gpu::conv2d_forward(conv, x.data<float>(), w_conv.data<float>(), nullptr, act.data<float>(), ws.raw_data());
    k::gpu::relu_forward(act_n, act.data<float>(), relu.data<float>());
    k::gpu::dense_forward(dense, relu.data<float>(), w_dense.data<float>(), nullptr, logits.data<float>());
    k::gpu::softmax_cross_entropy(k::SoftmaxXentParams{kMembers, kBatch, kClasses, true}, logits.data<float>(),
                                  labels.data<std::int32_t>(), loss.data<float>(), dlogits.data<float>(), nullptr,
                                  correct.data<std::int32_t>(), nullptr);
    k::gpu::dense_backward(dense, relu.data<float>(), w_dense.data<float>(), dlogits.data<float>(), dact.data<float>(),
                           g_dense.data<float>(), nullptr);
    k::gpu::relu_backward(act_n, relu.data<float>(), dact.data<float>(), dact.data<float>());
    k::gpu::conv2d_backward(conv, x.data<float>(), w_conv.data<float>(), dact.data<float>(), nullptr,
                            g_conv.data<float>(), nullptr, ws.raw_data());
    const k::SgdParams sgd{0.1f, 0.9f, false};
    k::gpu::sgd_momentum_update(sgd, static_cast<std::size_t>(w_conv.size()), w_conv.data<float>(),
                                m_conv.data<float>(), g_conv.data<float>());
    k::gpu::sgd_momentum_update(sgd, static_cast<std::size_t>(w_dense.size()), w_dense.data<float>(),
                                m_dense.data<float>(), g_dense.data<float>());
  }
};

}  // namespace

TEST_CASE("cuda GraphStep: warm-up, capture and replays give bitwise the results of direct execution") {
  PMAPCC_REQUIRE_GPU();
  TestStream stream;
  TinyStep direct, graphed;
  k::gpu::GraphStep step([&] { graphed(); });
  for (int i = 0; i < 5; ++i) {
    direct();
    step();
    CHECK(step.captured() == (i >= 1));  // call 0 runs eagerly, call 1 captures, later calls replay
  }
  stream.sync();
  CHECK(graphed.w_conv.to_vector<float>() == direct.w_conv.to_vector<float>());
  CHECK(graphed.w_dense.to_vector<float>() == direct.w_dense.to_vector<float>());
  CHECK(graphed.loss.to_vector<float>() == direct.loss.to_vector<float>());
  CHECK(graphed.correct.to_vector<std::int32_t>() == direct.correct.to_vector<std::int32_t>());
}

TEST_CASE("cuda GraphStep refuses the legacy default stream, and a failed capture leaves no capture open") {
  PMAPCC_REQUIRE_GPU();
  k::gpu::GraphStep legacy([] {});
  legacy();  // warm-up runs eagerly anywhere
  CHECK_THROWS_AS(legacy(), pmap::ValueError);
  TestStream stream;
  int calls = 0;
  k::gpu::GraphStep failing([&] {
    if (++calls == 2) throw pmap::ValueError("boom");
  });
  failing();
  CHECK_THROWS_AS(failing(), pmap::ValueError);
  CHECK_FALSE(pmap::detail::current_stream_capturing());
}

TEST_CASE("cuda reduce_sum and reduce_mean match the CPU's per-member sums") {
  PMAPCC_REQUIRE_GPU();
  const int members = 3;
  const std::size_t n = 100003;
  const auto x = random_floats(members * n, 21);
  std::vector<float> sum(members), mean(members);
  k::cpu::reduce_sum(members, n, x.data(), sum.data());
  k::cpu::reduce_mean(members, n, x.data(), mean.data());
  auto gx = on_gpu(x), gs = gpu_floats(members), gm = gpu_floats(members);
  k::gpu::reduce_sum(members, n, gx.data<float>(), gs.data<float>());
  k::gpu::reduce_mean(members, n, gx.data<float>(), gm.data<float>());
  CHECK(relative_error(gs.to_vector<float>(), sum) <= kForwardTolerance);
  CHECK(relative_error(gm.to_vector<float>(), mean) <= kForwardTolerance);
}

#endif  // PMAPCC_HAVE_CUDA
