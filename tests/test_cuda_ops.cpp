// Every CUDA op against its CPU twin (the oracle) on random inputs, for 1 and 3 members, shared and
// per-member inputs: relative error <= 1e-5 forward and <= 1e-4 backward; the element-wise ops and the
// ensemble reductions bitwise. Each case runs the CUDA backend on the host (every kernel over its whole
// launch grid, the GEMMs through cuBLAS's column-major arguments) and, when one is usable, on the GPU.
#include "cuda_testing.h"

#include <cstring>
#include <string>

#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cuda/exec.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using namespace cuda_testing;
namespace k = pmap::kernels;

const k::Backend& cpu() { return k::backend_for(pmap::DeviceKind::cpu); }

std::size_t count(std::int64_t a, std::int64_t b = 1, std::int64_t c = 1, std::int64_t d = 1, std::int64_t e = 1) {
  return static_cast<std::size_t>(a * b * c * d * e);
}

template <class T> bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

pmap::Array workspace(const Target& t, std::size_t bytes) { return zeros(t.device, bytes, pmap::DType::u8); }

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = k::gpu::bf16_widen(k::gpu::bf16_bits(x));
  return v;
}

// The CPU twin's inputs for a target op run in `precision`: as they are in fp32, rounded as the GPU rounds
// them in bf16 (every product's operands are among x, w and dy: patches are x's values or padding zeros).
std::vector<float> operands(const std::vector<float>& v, k::Precision precision) {
  return precision == k::Precision::bf16 ? bf16_rounded(v) : v;
}

// One conv2d configuration run on the CPU (fp32) and on the target in `precision`: forward (with bias and
// fused ReLU, and without) and every gradient compared; the bias gradient sums the unrounded dy. In bf16,
// also checks that the rounding happened (the fp32 result differs).
void check_conv(const Target& t, const k::Conv2dParams& p, k::Precision precision = k::Precision::fp32) {
  CAPTURE(t.name);
  CAPTURE(p.members);
  CAPTURE(p.shared_input);
  CAPTURE(p.kernel_h);
  CAPTURE(p.stride_h);
  CAPTURE(p.relu);
  CAPTURE(k::name(precision));
  const k::ConvGeometry g = k::conv2d_geometry(p);
  const std::size_t x_n = count(p.shared_input ? 1 : p.members, p.batch, p.height, p.width, p.in_channels);
  const std::size_t w_n = count(p.members, p.kernel_h, p.kernel_w, p.in_channels, p.out_channels);
  const std::size_t b_n = count(p.members, p.out_channels);
  const std::size_t y_n = count(p.members, p.batch, g.out_height, g.out_width, p.out_channels);
  const auto x = random_floats(x_n, 1), w = random_floats(w_n, 2), b = random_floats(b_n, 3),
             dy = random_floats(y_n, 4);
  const auto xr = operands(x, precision), wr = operands(w, precision), dyr = operands(dy, precision);
  std::vector<float> y(y_n), y32(y_n), dx(x_n), dw(w_n), db(b_n);
  std::vector<unsigned char> cpu_ws(cpu().conv().conv2d_workspace_bytes(p));
  cpu().conv().conv2d_forward(p, xr.data(), wr.data(), b.data(), y.data(), cpu_ws.data());
  cpu().conv().conv2d_forward(p, x.data(), w.data(), b.data(), y32.data(), cpu_ws.data());
  cpu().conv().conv2d_backward(p, xr.data(), wr.data(), dyr.data(), dx.data(), dw.data(), nullptr, cpu_ws.data());
  cpu().conv().conv2d_backward(p, x.data(), w.data(), dy.data(), nullptr, nullptr, db.data(), cpu_ws.data());

  k::Conv2dParams pt = p;  // the target's
  pt.precision = precision;
  const k::Backend& be = *t.backend;
  auto gx = on(t.device, x), gw = on(t.device, w), gb = on(t.device, b), gdy = on(t.device, dy);
  auto gy = zeros(t.device, y_n), gdx = zeros(t.device, x_n), gdw = zeros(t.device, w_n), gdb = zeros(t.device, b_n);
  auto ws = workspace(t, be.conv().conv2d_workspace_bytes(pt));
  be.conv().conv2d_forward(pt, gx.data<float>(), gw.data<float>(), gb.data<float>(), gy.data<float>(), ws.raw_data());
  be.conv().conv2d_backward(pt, gx.data<float>(), gw.data<float>(), gdy.data<float>(), gdx.data<float>(),
                            gdw.data<float>(), gdb.data<float>(), ws.raw_data());
  CHECK(relative_error(gy.to_vector<float>(), y) <= kForwardTolerance);
  if (precision == k::Precision::bf16) CHECK(relative_error(gy.to_vector<float>(), y32) > 1e-4);
  CHECK(relative_error(gdx.to_vector<float>(), dx) <= kBackwardTolerance);
  CHECK(relative_error(gdw.to_vector<float>(), dw) <= kBackwardTolerance);
  CHECK(relative_error(gdb.to_vector<float>(), db) <= kBackwardTolerance);
  // Without bias: the epilogue is the ReLU alone (or nothing); without workspace: scratch memory (holding
  // the patches and, in bf16, the rounded operands).
  cpu().conv().conv2d_forward(p, xr.data(), wr.data(), nullptr, y.data(), nullptr);
  be.conv().conv2d_forward(pt, gx.data<float>(), gw.data<float>(), nullptr, gy.data<float>(), nullptr);
  CHECK(relative_error(gy.to_vector<float>(), y) <= kForwardTolerance);
}

// One dense configuration, likewise; then the weight and bias gradients again without a workspace (the
// bias gradient summed in one pass, bf16 operands in scratch memory).
void check_dense(const Target& t, const k::DenseParams& p, k::Precision precision = k::Precision::fp32) {
  CAPTURE(t.name);
  CAPTURE(p.batch);
  CAPTURE(p.members);
  CAPTURE(p.shared_input);
  CAPTURE(p.relu);
  CAPTURE(k::name(precision));
  const std::size_t x_n = count(p.shared_input ? 1 : p.members, p.batch, p.in_features);
  const std::size_t w_n = count(p.members, p.in_features, p.out_features), b_n = count(p.members, p.out_features);
  const std::size_t y_n = count(p.members, p.batch, p.out_features);
  const auto x = random_floats(x_n, 5), w = random_floats(w_n, 6), b = random_floats(b_n, 7);
  const auto dy = random_floats(y_n, 8);
  const auto xr = operands(x, precision), wr = operands(w, precision), dyr = operands(dy, precision);
  std::vector<float> y(y_n), dx(x_n), dw(w_n), db(b_n);
  std::vector<unsigned char> cpu_ws(cpu().dense().dense_workspace_bytes(p));
  cpu().dense().dense_forward(p, xr.data(), wr.data(), b.data(), y.data(), cpu_ws.data());
  cpu().dense().dense_backward(p, xr.data(), wr.data(), dyr.data(), dx.data(), dw.data(), nullptr, cpu_ws.data());
  cpu().dense().dense_backward(p, x.data(), w.data(), dy.data(), nullptr, nullptr, db.data(), cpu_ws.data());
  k::DenseParams pt = p;  // the target's
  pt.precision = precision;
  const k::Backend& be = *t.backend;
  auto gx = on(t.device, x), gw = on(t.device, w), gb = on(t.device, b), gdy = on(t.device, dy);
  auto gy = zeros(t.device, y_n), gdx = zeros(t.device, x_n), gdw = zeros(t.device, w_n);
  auto gdb = zeros(t.device, b_n);
  auto ws = workspace(t, be.dense().dense_workspace_bytes(pt));
  be.dense().dense_forward(pt, gx.data<float>(), gw.data<float>(), gb.data<float>(), gy.data<float>(), ws.raw_data());
  be.dense().dense_backward(pt, gx.data<float>(), gw.data<float>(), gdy.data<float>(), gdx.data<float>(),
                            gdw.data<float>(), gdb.data<float>(), ws.raw_data());
  CHECK(relative_error(gy.to_vector<float>(), y) <= kForwardTolerance);
  CHECK(relative_error(gdx.to_vector<float>(), dx) <= kBackwardTolerance);
  CHECK(relative_error(gdw.to_vector<float>(), dw) <= kBackwardTolerance);
  CHECK(relative_error(gdb.to_vector<float>(), db) <= kBackwardTolerance);
  auto gdw_null = zeros(t.device, w_n), gdb_null = zeros(t.device, b_n);
  be.dense().dense_backward(pt, gx.data<float>(), gw.data<float>(), gdy.data<float>(), nullptr, gdw_null.data<float>(),
                            gdb_null.data<float>(), nullptr);
  CHECK(relative_error(gdw_null.to_vector<float>(), dw) <= kBackwardTolerance);
  CHECK(relative_error(gdb_null.to_vector<float>(), db) <= kBackwardTolerance);
}

}  // namespace

TEST_CASE("cuda conv2d matches the CPU op: SAME 3x3, strided VALID, explicit pads, 1x1, fused ReLU") {
  for (const Target& t : targets()) {
    for (int members : {1, 3}) {
      for (bool shared : {false, true}) {
        k::Conv2dParams p;
        p.members = members, p.batch = 2, p.height = 7, p.width = 6, p.in_channels = 3, p.out_channels = 5;
        p.shared_input = shared;
        check_conv(t, p);  // SAME 3x3 stride 1: the model's layers
        k::Conv2dParams relu = p;
        relu.relu = true;
        check_conv(t, relu);
        k::Conv2dParams strided = p;
        strided.kernel_h = 3, strided.kernel_w = 2, strided.stride_h = 2, strided.stride_w = 3;
        strided.padding = k::Padding::valid;
        check_conv(t, strided);
        k::Conv2dParams padded = p;
        padded.padding = k::Padding::explicit_pads;
        padded.pad_top = 2, padded.pad_bottom = 0, padded.pad_left = 1, padded.pad_right = 3, padded.stride_h = 2;
        check_conv(t, padded);
        k::Conv2dParams pointwise = p;
        pointwise.kernel_h = pointwise.kernel_w = 1;
        check_conv(t, pointwise);
      }
    }
  }
}

TEST_CASE("cuda conv2d at a first-layer size: batch 16, 28x28x1 -> 32, 3 members sharing the batch") {
  for (const Target& t : targets()) {
    k::Conv2dParams p;
    p.members = 3, p.batch = 16, p.height = 28, p.width = 28, p.in_channels = 1, p.out_channels = 32;
    p.shared_input = true, p.relu = true;
    check_conv(t, p);  // 12544 rows: the bias gradients are summed in chunks, then the chunks
  }
}

TEST_CASE("cuda dense matches the CPU op (short batches, and tall ones that use the workspace)") {
  for (const Target& t : targets())
    for (int batch : {9, 1500})
      for (int members : {1, 3})
        for (bool shared : {false, true})
          for (bool relu : {false, true}) check_dense(t, k::DenseParams{members, batch, 17, 6, shared, relu});
}

TEST_CASE("cuda conv2d and dense in bf16 are the fp32 CPU ops on operands rounded as the GPU rounds them") {
  const k::Precision bf16 = k::Precision::bf16;
  for (const Target& t : targets()) {
    for (int members : {1, 3}) {
      for (bool shared : {false, true}) {
        k::Conv2dParams p;
        p.members = members, p.batch = 2, p.height = 7, p.width = 6, p.in_channels = 3, p.out_channels = 5;
        p.shared_input = shared, p.relu = true;
        check_conv(t, p, bf16);
        k::Conv2dParams strided = p;
        strided.kernel_h = 3, strided.kernel_w = 2, strided.stride_h = 2, strided.stride_w = 3;
        strided.padding = k::Padding::valid;
        check_conv(t, strided, bf16);
        k::Conv2dParams pointwise = p;
        pointwise.kernel_h = pointwise.kernel_w = 1;
        check_conv(t, pointwise, bf16);
      }
    }
    for (int batch : {9, 1500})
      for (int members : {1, 3})
        for (bool shared : {false, true}) check_dense(t, k::DenseParams{members, batch, 40, 6, shared, true}, bf16);
  }
}

TEST_CASE("cuda avg_pool is bitwise the CPU op: tiled windows with odd edges, overlapping windows, through a ReLU") {
  for (const Target& t : targets()) {
    const k::Backend& be = *t.backend;
    for (int members : {1, 3}) {
      for (int stride : {2, 1}) {
        CAPTURE(t.name);
        CAPTURE(members);
        CAPTURE(stride);
        k::AvgPoolParams p{members, 2, 7, 5, 3, 2, 2, stride, stride};
        const k::PoolGeometry g = k::avg_pool_geometry(p);
        const std::size_t x_n = count(members, p.batch, p.height, p.width, p.channels);
        const std::size_t y_n = count(members, p.batch, g.out_height, g.out_width, p.channels);
        auto x = random_floats(x_n, 9), dy = random_floats(y_n, 10);
        dy[1] = -0.0f;  // a negative zero survives the tiled backward as on the CPU
        std::vector<float> y(y_n), dx(x_n), masked(x_n);
        cpu().conv().avg_pool_forward(p, x.data(), y.data());
        cpu().conv().avg_pool_backward(p, dy.data(), dx.data());
        cpu().conv().avg_pool_relu_backward(p, x.data(), dy.data(), masked.data());
        auto gx = on(t.device, x), gdy = on(t.device, dy), gy = zeros(t.device, y_n), gdx = zeros(t.device, x_n);
        be.conv().avg_pool_forward(p, gx.data<float>(), gy.data<float>());
        be.conv().avg_pool_backward(p, gdy.data<float>(), gdx.data<float>());
        CHECK(bitwise_equal(gy.to_vector<float>(), y));
        CHECK(bitwise_equal(gdx.to_vector<float>(), dx));
        be.conv().avg_pool_relu_backward(p, gx.data<float>(), gdy.data<float>(), gx.data<float>());  // in place over r
        CHECK(bitwise_equal(gx.to_vector<float>(), masked));
      }
    }
  }
}

TEST_CASE("cuda relu is bitwise the CPU op (the optimizer ops: test_optimizer.cpp)") {
  // The element-wise ops' relu and its activation_backward, over +-0 and a NaN.
  for (const Target& t : targets()) {
    CAPTURE(t.name);
    const k::Backend& be = *t.backend;
    const std::size_t n = 10007;
    auto x = random_floats(n, 11);
    x[3] = 0.0f, x[4] = -0.0f, x[5] = std::nanf("");
    const auto dy = random_floats(n, 12);
    std::vector<float> y(n), dx(n);
    cpu().elementwise().unary(k::UnaryOp::relu, n, x.data(), y.data());
    cpu().elementwise().activation_backward(k::UnaryOp::relu, n, y.data(), dy.data(), dx.data());
    auto gx = on(t.device, x), gdy = on(t.device, dy), gy = zeros(t.device, n), gdx = zeros(t.device, n);
    be.elementwise().unary(k::UnaryOp::relu, n, gx.data<float>(), gy.data<float>());
    be.elementwise().activation_backward(k::UnaryOp::relu, n, gy.data<float>(), gdy.data<float>(), gdx.data<float>());
    CHECK(bitwise_equal(gy.to_vector<float>(), y));
    CHECK(bitwise_equal(gdx.to_vector<float>(), dx));
  }
}

TEST_CASE("cuda softmax cross-entropy matches the CPU op, with loss and counts on the device") {
  for (const Target& t : targets()) {
    const k::Backend& be = *t.backend;
    for (int members : {1, 3}) {
      for (bool shared_labels : {true, false}) {
        CAPTURE(t.name);
        CAPTURE(members);
        CAPTURE(shared_labels);
        k::SoftmaxXentParams p{members, 37, 10, shared_labels};
        const std::size_t z_n = count(members, p.batch, p.classes);
        const auto logits = random_floats(z_n, 16, -8.0f, 8.0f);
        const auto labels = random_labels(count(shared_labels ? 1 : members, p.batch), p.classes, 17);
        std::vector<float> loss(static_cast<std::size_t>(members)), dlogits(z_n), probs(z_n);
        std::vector<std::int32_t> correct(static_cast<std::size_t>(members));
        cpu().loss().softmax_cross_entropy(p, logits.data(), labels.data(), loss.data(), dlogits.data(), probs.data(),
                                    correct.data(), nullptr, nullptr);
        auto gz = on(t.device, logits), gl = on(t.device, labels), gd = zeros(t.device, z_n), gp = zeros(t.device, z_n);
        auto gloss = zeros(t.device, loss.size()), gcorrect = zeros(t.device, correct.size(), pmap::DType::i32);
        auto bad = zeros(t.device, 1, pmap::DType::i32);
        auto ws = workspace(t, be.loss().softmax_cross_entropy_workspace_bytes(p));
        be.loss().softmax_cross_entropy(p, gz.data<float>(), gl.data<std::int32_t>(), gloss.data<float>(),
                                        gd.data<float>(), gp.data<float>(), gcorrect.data<std::int32_t>(),
                                        bad.data<std::int32_t>(), ws.raw_data());
        CHECK(relative_error(gloss.to_vector<float>(), loss) <= kForwardTolerance);
        CHECK(gcorrect.to_vector<std::int32_t>() == correct);
        CHECK(relative_error(gp.to_vector<float>(), probs) <= kForwardTolerance);
        CHECK(relative_error(gd.to_vector<float>(), dlogits) <= kBackwardTolerance);
        CHECK(bad.to_vector<std::int32_t>() == std::vector<std::int32_t>{0});
        if (t.device.is_cpu()) {  // the host run computes in the CPU's order with the same libm: the same bits
          CHECK(bitwise_equal(gloss.to_vector<float>(), loss));
          CHECK(bitwise_equal(gp.to_vector<float>(), probs));
          CHECK(bitwise_equal(gd.to_vector<float>(), dlogits));
        }
      }
    }
  }
}

TEST_CASE("cuda softmax cross-entropy skips and counts labels outside 0..K-1, a shared label once") {
  for (const Target& t : targets()) {
    CAPTURE(t.name);
    const k::Backend& be = *t.backend;
    for (bool shared : {true, false}) {
      CAPTURE(shared);
      const int members = 3;
      k::SoftmaxXentParams p{members, 4, 10, shared};
      const auto z = random_floats(static_cast<std::size_t>(members * 40), 18);
      std::vector<std::int32_t> labels{1, 10, 3, -1};  // two bad
      if (!shared) labels = {1, 10, 3, -1, 2, 2, 2, 2, 0, 0, 0, 99};  // three bad over the members
      auto gz = on(t.device, z), gl = on(t.device, labels);
      auto loss = zeros(t.device, members), correct = zeros(t.device, members, pmap::DType::i32);
      auto dz = zeros(t.device, z.size());
      auto bad = on(t.device, std::vector<std::int32_t>{5});  // added to, not overwritten
      be.loss().softmax_cross_entropy(p, gz.data<float>(), gl.data<std::int32_t>(), loss.data<float>(),
                                      dz.data<float>(), nullptr, correct.data<std::int32_t>(), bad.data<std::int32_t>(),
                                      nullptr);
      CHECK(bad.to_vector<std::int32_t>() == std::vector<std::int32_t>{5 + (shared ? 2 : 3)});
      // A skipped row adds nothing: the loss is that of the good rows over the whole batch.
      const auto dzh = dz.to_vector<float>();
      CHECK(std::all_of(dzh.begin() + 10, dzh.begin() + 20, [](float v) { return v == 0.0f; }));  // row 1: label 10
      const std::vector<std::int32_t> good{1, 3};
      std::vector<float> one_loss(1);
      std::vector<std::int32_t> one_correct(1);
      std::vector<float> rows{z.begin(), z.begin() + 10};
      rows.insert(rows.end(), z.begin() + 20, z.begin() + 30);
      cpu().loss().softmax_cross_entropy(k::SoftmaxXentParams{1, 2, 10, true}, rows.data(), good.data(),
                                         one_loss.data(), nullptr, nullptr, one_correct.data(), nullptr, nullptr);
      CHECK(loss.to_vector<float>()[0] == doctest::Approx(one_loss[0] * 2 / 4).epsilon(1e-6));
    }
  }
  CHECK_THROWS_AS(
      cpu().loss().softmax_cross_entropy(k::SoftmaxXentParams{1, 1, 10, true}, std::vector<float>(10).data(),
                                         std::vector<std::int32_t>{12}.data(), std::vector<float>(1).data(), nullptr,
                                         nullptr, nullptr, nullptr, nullptr),
      pmap::ValueError);
}

TEST_CASE("cuda ensemble reductions are bitwise the CPU ops: member sums, mean, argmax hits") {
  for (const Target& t : targets()) {
    CAPTURE(t.name);
    const k::MetricOps& be = t.backend->metrics();
    const int count_m = 3, rows = 11, classes = 10;
    const std::size_t n = static_cast<std::size_t>(rows) * classes;
    const auto x = random_floats(count_m * n, 19, 0.0f, 1.0f);
    std::vector<float> out = random_floats(n, 20);
    auto gx = on(t.device, x), gout = on(t.device, out);
    cpu().metrics().sum_members(count_m, n, x.data(), out.data(), true);
    be.sum_members(count_m, n, gx.data<float>(), gout.data<float>(), true);
    CHECK(bitwise_equal(gout.to_vector<float>(), out));
    cpu().metrics().sum_members(2, n, x.data(), out.data(), false);
    be.sum_members(2, n, gx.data<float>(), gout.data<float>(), false);
    CHECK(bitwise_equal(gout.to_vector<float>(), out));
    cpu().metrics().divide(n, out.data(), 3.0f);
    be.divide(n, gout.data<float>(), 3.0f);
    CHECK(bitwise_equal(gout.to_vector<float>(), out));
    // Ties go to the first index, as jnp.argmax: row 0 ties classes 2 and 5 with label 5 (a miss).
    out[2] = out[5] = 7.0f;
    const auto labels = random_labels(static_cast<std::size_t>(rows), classes, 21);
    std::vector<std::int32_t> with_tie = labels;
    with_tie[0] = 5;
    auto gtie = on(t.device, out), glab = on(t.device, with_tie);
    std::int32_t hits = 3;
    cpu().metrics().argmax_hits(rows, classes, out.data(), with_tie.data(), &hits);
    auto ghits = on(t.device, std::vector<std::int32_t>{3});
    be.argmax_hits(rows, classes, gtie.data<float>(), glab.data<std::int32_t>(), ghits.data<std::int32_t>());
    CHECK(ghits.to_vector<std::int32_t>() == std::vector<std::int32_t>{hits});
    int expect = 3;
    for (int r = 0; r < rows; ++r) {
      const auto* s = out.data() + r * classes;
      expect += static_cast<int>(std::max_element(s, s + classes) - s) == with_tie[static_cast<std::size_t>(r)];
    }
    CHECK(hits == expect);
  }
}

TEST_CASE("cuda ops reject null pointers and bad parameters before queueing work") {
  for (const Target& t : targets()) {
    CAPTURE(t.name);
    const k::Backend& be = *t.backend;
    k::DenseParams bad{1, 0, 3, 4, false};
    auto buf = zeros(t.device, 16);
    CHECK_THROWS_AS(
        be.dense().dense_forward(bad, buf.data<float>(), buf.data<float>(), nullptr, buf.data<float>(), nullptr),
        pmap::ValueError);
    CHECK_THROWS_AS(be.elementwise().unary(k::UnaryOp::relu, 4, nullptr, buf.data<float>()), pmap::ValueError);
    CHECK_THROWS_AS(be.metrics().sum_members(0, 4, buf.data<float>(), buf.data<float>(), false), pmap::ValueError);
    CHECK_THROWS_AS(be.loss().softmax_cross_entropy(k::SoftmaxXentParams{1, 2, 3, true}, buf.data<float>(), nullptr,
                                             buf.data<float>(), nullptr, nullptr, nullptr, nullptr, nullptr),
                    pmap::ValueError);
  }
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

}  // namespace PMAPCC_TEST_FILE
