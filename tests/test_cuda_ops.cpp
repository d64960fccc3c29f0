// Every CUDA op against its CPU twin (the oracle) on random inputs, for 1 and 3 members, shared and
// per-member inputs: relative error <= 1e-5 forward and <= 1e-4 backward; the element-wise ops bitwise.
// Each case skips itself without a GPU.
#include "cuda_testing.h"

#include <cstring>
#include <string>

#include "kernels/backend.h"

namespace {

using namespace cuda_testing;
namespace k = pmap::kernels;

const k::Backend& cpu() { return k::backend_for(pmap::DeviceKind::cpu); }
const k::Backend& gpu() { return k::backend_for(pmap::DeviceKind::cuda); }

std::size_t count(std::int64_t a, std::int64_t b = 1, std::int64_t c = 1, std::int64_t d = 1, std::int64_t e = 1) {
  return static_cast<std::size_t>(a * b * c * d * e);
}

template <class T> bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// One conv2d configuration run on both backends: forward and every gradient compared.
void check_conv(const k::Conv2dParams& p) {
  CAPTURE(p.members);
  CAPTURE(p.shared_input);
  CAPTURE(p.kernel_h);
  CAPTURE(p.stride_h);
  const k::ConvGeometry g = k::conv2d_geometry(p);
  const std::size_t x_n = count(p.shared_input ? 1 : p.members, p.batch, p.height, p.width, p.in_channels);
  const std::size_t w_n = count(p.members, p.kernel_h, p.kernel_w, p.in_channels, p.out_channels);
  const std::size_t b_n = count(p.members, p.out_channels);
  const std::size_t y_n = count(p.members, p.batch, g.out_height, g.out_width, p.out_channels);
  const auto x = random_floats(x_n, 1), w = random_floats(w_n, 2), b = random_floats(b_n, 3), dy = random_floats(y_n, 4);
  std::vector<float> y(y_n), dx(x_n), dw(w_n), db(b_n);
  std::vector<unsigned char> cpu_ws(cpu().conv2d_workspace_bytes(p));
  cpu().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), cpu_ws.data());
  cpu().conv2d_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), cpu_ws.data());

  auto gx = on_gpu(x), gw = on_gpu(w), gb = on_gpu(b), gdy = on_gpu(dy);
  auto gy = gpu_floats(y_n), gdx = gpu_floats(x_n), gdw = gpu_floats(w_n), gdb = gpu_floats(b_n);
  pmap::Array ws({static_cast<std::int64_t>(gpu().conv2d_workspace_bytes(p))}, pmap::DType::u8, kGpu);
  gpu().conv2d_forward(p, gx.data<float>(), gw.data<float>(), gb.data<float>(), gy.data<float>(), ws.raw_data());
  gpu().conv2d_backward(p, gx.data<float>(), gw.data<float>(), gdy.data<float>(), gdx.data<float>(),
                        gdw.data<float>(), gdb.data<float>(), ws.raw_data());
  CHECK(relative_error(gy.to_vector<float>(), y) <= kForwardTolerance);
  CHECK(relative_error(gdx.to_vector<float>(), dx) <= kBackwardTolerance);
  CHECK(relative_error(gdw.to_vector<float>(), dw) <= kBackwardTolerance);
  CHECK(relative_error(gdb.to_vector<float>(), db) <= kBackwardTolerance);
}

}  // namespace

TEST_CASE("cuda conv2d matches the CPU op: SAME 3x3, strided VALID, explicit pads, 1x1") {
  PMAPCC_REQUIRE_GPU();
  for (int members : {1, 3}) {
    for (bool shared : {false, true}) {
      k::Conv2dParams p;
      p.members = members, p.batch = 2, p.height = 7, p.width = 6, p.in_channels = 3, p.out_channels = 5;
      p.shared_input = shared;
      check_conv(p);  // SAME 3x3 stride 1: the model's layers
      k::Conv2dParams strided = p;
      strided.kernel_h = 3, strided.kernel_w = 2, strided.stride_h = 2, strided.stride_w = 3;
      strided.padding = k::Padding::valid;
      check_conv(strided);
      k::Conv2dParams padded = p;
      padded.padding = k::Padding::explicit_pads;
      padded.pad_top = 2, padded.pad_bottom = 0, padded.pad_left = 1, padded.pad_right = 3, padded.stride_h = 2;
      check_conv(padded);
      k::Conv2dParams pointwise = p;
      pointwise.kernel_h = pointwise.kernel_w = 1;
      check_conv(pointwise);
    }
  }
}

TEST_CASE("cuda conv2d at the model's first-layer size: batch 128, 28x28x1 -> 32, 3 members sharing the batch") {
  PMAPCC_REQUIRE_GPU();
  k::Conv2dParams p;
  p.members = 3, p.batch = 128, p.height = 28, p.width = 28, p.in_channels = 1, p.out_channels = 32;
  p.shared_input = true;
  check_conv(p);  // tall bias gradients: the chunked column sums
}

TEST_CASE("cuda dense matches the CPU op (short batches, and tall ones that use the workspace)") {
  PMAPCC_REQUIRE_GPU();
  for (int batch : {9, 1500}) {
    for (int members : {1, 3}) {
      for (bool shared : {false, true}) {
        CAPTURE(batch);
        CAPTURE(members);
        CAPTURE(shared);
        k::DenseParams p{members, batch, 17, 6, shared};
        const std::size_t x_n = count(shared ? 1 : members, p.batch, p.in_features);
        const std::size_t w_n = count(members, p.in_features, p.out_features), b_n = count(members, p.out_features);
        const std::size_t y_n = count(members, p.batch, p.out_features);
        const auto x = random_floats(x_n, 5), w = random_floats(w_n, 6), b = random_floats(b_n, 7);
        const auto dy = random_floats(y_n, 8);
        std::vector<float> y(y_n), dx(x_n), dw(w_n), db(b_n);
        std::vector<unsigned char> cpu_ws(cpu().dense_workspace_bytes(p));
        cpu().dense_forward(p, x.data(), w.data(), b.data(), y.data(), cpu_ws.data());
        cpu().dense_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), cpu_ws.data());
        auto gx = on_gpu(x), gw = on_gpu(w), gb = on_gpu(b), gdy = on_gpu(dy);
        auto gy = gpu_floats(y_n), gdx = gpu_floats(x_n), gdw = gpu_floats(w_n), gdb = gpu_floats(b_n);
        pmap::Array ws({static_cast<std::int64_t>(gpu().dense_workspace_bytes(p))}, pmap::DType::u8, kGpu);
        gpu().dense_forward(p, gx.data<float>(), gw.data<float>(), gb.data<float>(), gy.data<float>(), ws.raw_data());
        gpu().dense_backward(p, gx.data<float>(), gw.data<float>(), gdy.data<float>(), gdx.data<float>(),
                             gdw.data<float>(), gdb.data<float>(), ws.raw_data());
        CHECK(relative_error(gy.to_vector<float>(), y) <= kForwardTolerance);
        CHECK(relative_error(gdx.to_vector<float>(), dx) <= kBackwardTolerance);
        CHECK(relative_error(gdw.to_vector<float>(), dw) <= kBackwardTolerance);
        CHECK(relative_error(gdb.to_vector<float>(), db) <= kBackwardTolerance);
        // A null workspace is allowed too (the bias gradient is then summed in one pass).
        auto gdb_null = gpu_floats(b_n);
        gpu().dense_backward(p, gx.data<float>(), gw.data<float>(), gdy.data<float>(), nullptr, nullptr,
                             gdb_null.data<float>(), nullptr);
        CHECK(relative_error(gdb_null.to_vector<float>(), db) <= kBackwardTolerance);
      }
    }
  }
}

TEST_CASE("cuda avg_pool is bitwise the CPU op: tiled windows with odd edges, and overlapping windows") {
  PMAPCC_REQUIRE_GPU();
  for (int members : {1, 3}) {
    for (int stride : {2, 1}) {
      CAPTURE(members);
      CAPTURE(stride);
      k::AvgPoolParams p{members, 2, 7, 5, 3, 2, 2, stride, stride};
      const k::PoolGeometry g = k::avg_pool_geometry(p);
      const std::size_t x_n = count(members, p.batch, p.height, p.width, p.channels);
      const std::size_t y_n = count(members, p.batch, g.out_height, g.out_width, p.channels);
      const auto x = random_floats(x_n, 9), dy = random_floats(y_n, 10);
      std::vector<float> y(y_n), dx(x_n);
      cpu().avg_pool_forward(p, x.data(), y.data());
      cpu().avg_pool_backward(p, dy.data(), dx.data());
      auto gx = on_gpu(x), gdy = on_gpu(dy), gy = gpu_floats(y_n), gdx = gpu_floats(x_n);
      gpu().avg_pool_forward(p, gx.data<float>(), gy.data<float>());
      gpu().avg_pool_backward(p, gdy.data<float>(), gdx.data<float>());
      CHECK(bitwise_equal(gy.to_vector<float>(), y));
      CHECK(bitwise_equal(gdx.to_vector<float>(), dx));
    }
  }
}

TEST_CASE("cuda relu and SGD-momentum are bitwise the CPU ops") {
  PMAPCC_REQUIRE_GPU();
  const std::size_t n = 10007;
  auto x = random_floats(n, 11);
  x[3] = 0.0f, x[4] = -0.0f, x[5] = std::nanf("");
  const auto dy = random_floats(n, 12);
  std::vector<float> y(n), dx(n);
  cpu().relu_forward(n, x.data(), y.data());
  cpu().relu_backward(n, y.data(), dy.data(), dx.data());
  auto gx = on_gpu(x), gdy = on_gpu(dy), gy = gpu_floats(n), gdx = gpu_floats(n);
  gpu().relu_forward(n, gx.data<float>(), gy.data<float>());
  gpu().relu_backward(n, gy.data<float>(), gdy.data<float>(), gdx.data<float>());
  CHECK(bitwise_equal(gy.to_vector<float>(), y));
  CHECK(bitwise_equal(gdx.to_vector<float>(), dx));

  for (bool nesterov : {false, true}) {
    CAPTURE(nesterov);
    const k::SgdParams sgd{0.1f, 0.9f, nesterov};
    auto params = random_floats(n, 13), momentum = random_floats(n, 14);
    const auto grads = random_floats(n, 15);
    auto gp = on_gpu(params), gm = on_gpu(momentum), gg = on_gpu(grads);
    for (int step = 0; step < 3; ++step) {
      cpu().sgd_momentum_update(sgd, n, params.data(), momentum.data(), grads.data());
      gpu().sgd_momentum_update(sgd, n, gp.data<float>(), gm.data<float>(), gg.data<float>());
    }
    CHECK(bitwise_equal(gp.to_vector<float>(), params));
    CHECK(bitwise_equal(gm.to_vector<float>(), momentum));
  }
}

TEST_CASE("cuda softmax cross-entropy matches the CPU op, and loss and counts reach the host") {
  PMAPCC_REQUIRE_GPU();
  for (int members : {1, 3}) {
    for (bool shared_labels : {true, false}) {
      CAPTURE(members);
      CAPTURE(shared_labels);
      k::SoftmaxXentParams p{members, 37, 10, shared_labels};
      const std::size_t z_n = count(members, p.batch, p.classes);
      const auto logits = random_floats(z_n, 16, -8.0f, 8.0f);
      const auto labels = random_labels(count(shared_labels ? 1 : members, p.batch), p.classes, 17);
      std::vector<float> loss(static_cast<std::size_t>(members)), dlogits(z_n), probs(z_n);
      std::vector<std::int32_t> correct(static_cast<std::size_t>(members));
      cpu().softmax_cross_entropy(p, logits.data(), labels.data(), loss.data(), dlogits.data(), probs.data(),
                                  correct.data());
      auto gz = on_gpu(logits), gl = on_gpu(labels), gd = gpu_floats(z_n), gp = gpu_floats(z_n);
      std::vector<float> gloss(loss.size(), -1.0f);
      std::vector<std::int32_t> gcorrect(correct.size(), -1);
      gpu().softmax_cross_entropy(p, gz.data<float>(), gl.data<std::int32_t>(), gloss.data(), gd.data<float>(),
                                  gp.data<float>(), gcorrect.data());
      CHECK(relative_error(gloss, loss) <= kForwardTolerance);
      CHECK(gcorrect == correct);
      CHECK(relative_error(gp.to_vector<float>(), probs) <= kForwardTolerance);
      CHECK(relative_error(gd.to_vector<float>(), dlogits) <= kBackwardTolerance);
    }
  }
}

TEST_CASE("cuda softmax cross-entropy raises ValueError for a label outside 0..K-1") {
  PMAPCC_REQUIRE_GPU();
  k::SoftmaxXentParams p{1, 4, 10, true};
  auto gz = on_gpu(random_floats(40, 18));
  auto gl = on_gpu(std::vector<std::int32_t>{1, 10, 3, -1});
  std::vector<float> loss(1);
  CHECK_THROWS_AS(gpu().softmax_cross_entropy(p, gz.data<float>(), gl.data<std::int32_t>(), loss.data(), nullptr,
                                              nullptr, nullptr),
                  pmap::ValueError);
}

TEST_CASE("cuda ops reject null pointers and bad parameters before queueing work") {
  PMAPCC_REQUIRE_GPU();
  k::DenseParams bad{1, 0, 3, 4, false};
  auto buf = gpu_floats(16);
  CHECK_THROWS_AS(gpu().dense_forward(bad, buf.data<float>(), buf.data<float>(), nullptr, buf.data<float>(), nullptr),
                  pmap::ValueError);
  CHECK_THROWS_AS(gpu().relu_forward(4, nullptr, buf.data<float>()), pmap::ValueError);
}

TEST_CASE("Array prefix copies move only the first bytes, on host and (with a GPU) device arrays") {
  std::vector<pmap::Device> devices{pmap::Device{}};
  if (pmap::cuda_device_count() > 0) devices.push_back(kGpu);
  for (const auto& d : devices) {
    CAPTURE(d);
    pmap::Array a({4, 3}, pmap::DType::f32, d);
    const std::vector<float> rows{1, 2, 3, 4, 5, 6};
    a.copy_prefix_from_host(rows.data(), rows.size() * sizeof(float));
    CHECK(a.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0});
    std::vector<float> back(3, -1.0f);
    a.copy_prefix_to_host(back.data(), 3 * sizeof(float));
    CHECK(back == std::vector<float>{1, 2, 3});
    CHECK_THROWS_AS(a.copy_prefix_from_host(rows.data(), 13 * sizeof(float)), pmap::ShapeError);
  }
}
