// Tests of the CPU kernels' ISA variants (kernels/cpu_backend.h) and of the ops added for speed: every variant
// against the generic one, the fused ReLU paths against the unfused ops (bitwise), matmul against its
// definition, and workspaces sized for a batch serving every smaller batch.
#include <doctest/doctest.h>
#include <pmap/error.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_checks.h"
#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu_backend.h>
#include <pmapcc/kernels/cpu/shared/cpu_threads.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace kc = kernel_checks;
namespace cpu = pmap::kernels::cpu;
namespace {
const pmap::kernels::CpuBackend& cpu_ops() { return pmap::kernels::cpu_backend(); }
}  // namespace
using namespace pmap::kernels;

namespace {

// Restores the variant that was active when the test began.
class IsaGuard {
 public:
  IsaGuard() : saved_(cpu::isa()) {}
  ~IsaGuard() { cpu::set_isa(saved_); }

 private:
  std::string saved_;
};

Conv2dParams conv(int members, int batch, int hw, int cin, int cout, bool shared) {
  Conv2dParams p;
  p.members = members, p.batch = batch, p.height = p.width = hw, p.in_channels = cin, p.out_channels = cout;
  p.shared_input = shared;
  return p;
}

std::size_t conv_x(const Conv2dParams& p) {
  return std::size_t(p.shared_input ? 1 : p.members) * p.batch * p.height * p.width * p.in_channels;
}
std::size_t conv_w(const Conv2dParams& p) { return std::size_t(p.members) * 9 * p.in_channels * p.out_channels; }
std::size_t conv_y(const Conv2dParams& p) { return std::size_t(p.members) * p.batch * p.height * p.width * p.out_channels; }

// Everything the MNIST step computes on the CPU, as one flat vector of results, for the active variant.
std::vector<float> step_outputs() {
  std::vector<float> out;
  const auto append = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
  // 13 output channels of a 1-channel input (the direct path): full, half and quarter packets and a scalar
  // channel, in whichever mix the variant's packet width gives.
  for (const Conv2dParams& p :
       {conv(2, 3, 28, 1, 32, true), conv(2, 3, 14, 32, 64, false), conv(2, 3, 9, 1, 13, true)}) {
    const auto x = kc::random_floats(conv_x(p), 1), w = kc::random_floats(conv_w(p), 2, 0.3f);
    const auto b = kc::random_floats(std::size_t(p.members) * p.out_channels, 3), dy = kc::random_floats(conv_y(p), 4);
    std::vector<float> y(conv_y(p)), dx(conv_x(p)), dw(conv_w(p)), db(b.size());
    cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), nullptr);
    cpu_ops().conv().conv2d_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), nullptr);
    append(y), append(dx), append(dw), append(db);
  }
  DenseParams d;
  d.members = 2, d.batch = 5, d.in_features = 300, d.out_features = 40;
  const auto x = kc::random_floats(2 * 5 * 300, 5), w = kc::random_floats(2 * 300 * 40, 6, 0.1f);
  const auto b = kc::random_floats(2 * 40, 7), dy = kc::random_floats(2 * 5 * 40, 8);
  std::vector<float> y(2 * 5 * 40), dx(x.size()), dw(w.size()), db(b.size());
  cpu_ops().dense().dense_forward(d, x.data(), w.data(), b.data(), y.data(), nullptr);
  cpu_ops().dense().dense_backward(d, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), nullptr);
  append(y), append(dx), append(dw), append(db);
  return out;
}

// The element-wise ops, which must round the same in every variant.
std::vector<float> elementwise_outputs() {
  std::vector<float> out;
  const auto append = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
  AvgPoolParams q;
  q.members = 2, q.batch = 2, q.height = 6, q.width = 7, q.channels = 12;
  const auto x = kc::random_floats(2 * 2 * 6 * 7 * 12, 9), dy = kc::random_floats(2 * 2 * 3 * 3 * 12, 10);
  std::vector<float> y(dy.size()), dx(x.size()), relu(x.size()), masked(x.size());
  cpu_ops().conv().avg_pool_forward(q, x.data(), y.data());
  cpu_ops().conv().avg_pool_backward(q, dy.data(), dx.data());
  cpu_ops().elementwise().unary(UnaryOp::relu, x.size(), x.data(), relu.data());
  cpu_ops().conv().avg_pool_relu_backward(q, relu.data(), dy.data(), masked.data());
  append(y), append(dx), append(relu), append(masked);
  const std::vector<float> trace = kc::random_floats(77, 12), lr{0.1f};
  std::vector<float> next(77), updates(77);
  cpu_ops().optimizer().sgd_trace(pmap::kernels::SgdParams{0.9f, true}, 1, 77, lr.data(), x.data(), trace.data(),
                                  next.data(), updates.data());
  append(next), append(updates);
  return out;
}

}  // namespace

TEST_CASE("CPU kernel variants: one is active, generic always exists, names are checked") {
  IsaGuard guard;
  const auto isas = cpu::available_isas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == "generic");
  CHECK(std::find(isas.begin(), isas.end(), cpu::isa()) != isas.end());
  MESSAGE("CPU kernel variants here: " << isas.size() << ", active: " << cpu::isa());
  cpu::set_isa("generic");
  CHECK(cpu::isa() == "generic");
  cpu::set_isa("auto");
  CHECK(cpu::isa() == isas.back());
  CHECK_THROWS_AS(cpu::set_isa("sse9"), pmap::ValueError);
  for (const char* name : {"avx2", "avx512"}) {
    CAPTURE(name);
    if (std::find(isas.begin(), isas.end(), name) == isas.end()) {
      CHECK_THROWS_AS(cpu::set_isa(name), pmap::NotAvailable);
    } else {
      cpu::set_isa(name);
      CHECK(cpu::isa() == name);
    }
  }
}

TEST_CASE("CPU kernel variants agree with the generic one: GEMM ops to rounding, element-wise ops bitwise") {
  IsaGuard guard;
  cpu::set_isa("generic");
  const std::vector<float> step = step_outputs(), elementwise = elementwise_outputs();
  std::vector<double> step_ref(step.begin(), step.end());
  for (const std::string& isa : cpu::available_isas()) {
    CAPTURE(isa);
    cpu::set_isa(isa);
    CHECK(kc::max_rel_diff(step_outputs(), step_ref) < 1e-5);
    const auto e = elementwise_outputs();
    CHECK(kc::same_bits(e.data(), elementwise.data(), e.size()));
  }
}

TEST_CASE("matmul matches the definition, accumulate adds, members are independent") {
  MatmulParams p;
  p.members = 2, p.rows = 7, p.cols = 13, p.depth = 300;
  const auto a = kc::random_floats(2 * 7 * 300, 21), b = kc::random_floats(2 * 300 * 13, 22);
  std::vector<float> c(2 * 7 * 13, 5.0f);
  std::vector<double> ref;
  for (int m = 0; m < 2; ++m)
    for (int i = 0; i < 7; ++i)
      for (int j = 0; j < 13; ++j) {
        double s = 0;
        for (int k = 0; k < 300; ++k) s += double(a[(m * 7 + i) * 300 + k]) * b[(m * 300 + k) * 13 + j];
        ref.push_back(s);
      }
  cpu_ops().matmul(p, a.data(), b.data(), c.data(), nullptr);
  CHECK(kc::max_rel_diff(c, ref) < 1e-6);
  p.accumulate = true;
  std::vector<unsigned char> ws(cpu_ops().matmul_workspace_bytes(p));
  cpu_ops().matmul(p, a.data(), b.data(), c.data(), ws.data());
  for (double& v : ref) v *= 2;
  CHECK(kc::max_rel_diff(c, ref) < 1e-6);
  CHECK_THROWS_AS(cpu_ops().matmul_workspace_bytes(MatmulParams{}), pmap::ValueError);
}

// c = a @ b (+ c0) per the definition, in double, for matmul's layouts.
std::vector<double> matmul_reference(const MatmulParams& p, const std::vector<float>& a, const std::vector<float>& b,
                                     const std::vector<float>& c0) {
  std::vector<double> ref;
  for (int m = 0; m < p.members; ++m) {
    const float* am = a.data() + std::size_t(m) * p.rows * p.depth;
    const float* bm = b.data() + std::size_t(m) * p.depth * p.cols;
    for (int i = 0; i < p.rows; ++i)
      for (int j = 0; j < p.cols; ++j) {
        double s = p.accumulate ? c0[(std::size_t(m) * p.rows + i) * p.cols + j] : 0.0;
        for (int k = 0; k < p.depth; ++k) {
          const float x = p.transpose_a ? am[std::size_t(k) * p.rows + i] : am[std::size_t(i) * p.depth + k];
          const float y = p.transpose_b ? bm[std::size_t(j) * p.depth + k] : bm[std::size_t(k) * p.cols + j];
          s += double(x) * y;
        }
        ref.push_back(s);
      }
  }
  return ref;
}

// Every variant, every layout, the shapes of the MNIST CNN's products (narrow results: 64 and 10 columns,
// 288 and 256 deep) and ones that cross the AVX-512 GEMM's edges: leftover rows of each tile height, masked
// last columns, depth blocks, more than one 64-column panel, a single row, column and depth step.
TEST_CASE("matmul in every variant and layout matches the definition, and repeats bit for bit") {
  IsaGuard guard;
  struct Shape {
    int rows, cols, depth;
  };
  const Shape shapes[] = {{588, 64, 288}, {288, 64, 392}, {392, 288, 64}, {128, 10, 256}, {37, 70, 200},
                          {13, 48, 97},   {11, 33, 300},  {25, 16, 1},    {1, 1, 1},      {7, 129, 5},
                          {30, 300, 40}};
  // The inputs and the reference once per shape and layout, then every variant against them.
  for (const Shape& shape : shapes)
    for (int layout = 0; layout < 8; ++layout) {
      MatmulParams p;
      p.members = 2, p.rows = shape.rows, p.cols = shape.cols, p.depth = shape.depth;
      p.transpose_a = (layout & 1) != 0, p.transpose_b = (layout & 2) != 0, p.accumulate = (layout & 4) != 0;
      CAPTURE(p.rows);
      CAPTURE(p.cols);
      CAPTURE(p.depth);
      CAPTURE(layout);
      const auto a = kc::random_floats(std::size_t(2) * p.rows * p.depth, 41 + layout);
      const auto b = kc::random_floats(std::size_t(2) * p.depth * p.cols, 42 + layout);
      const auto c0 = kc::random_floats(std::size_t(2) * p.rows * p.cols, 43 + layout);
      const std::vector<double> ref = matmul_reference(p, a, b, c0);
      for (const std::string& isa : cpu::available_isas()) {
        CAPTURE(isa);
        cpu::set_isa(isa);
        std::vector<unsigned char> ws(cpu_ops().matmul_workspace_bytes(p));
        std::vector<float> c = c0, again = c0;
        cpu_ops().matmul(p, a.data(), b.data(), c.data(), ws.data());
        CHECK(kc::max_rel_diff(c, ref) < 1e-6);
        cpu_ops().matmul(p, a.data(), b.data(), again.data(), nullptr);  // own workspace: the same bits
        CHECK(kc::same_bits(c.data(), again.data(), c.size()));
      }
    }
}

namespace {

// Restores the helper-thread count that was set when the test began.
class ThreadsGuard {
 public:
  ThreadsGuard() : saved_(cpu::threads()) {}
  ~ThreadsGuard() { cpu::set_threads(saved_); }

 private:
  int saved_;
};

// Products large enough to be split over helper threads (kernels/cpu/shared/cpu_threads.h), in the active variant:
// matmul in both layouts of b, accumulating into c, at row counts on and off the split's units, then a conv
// layer (its forward and input gradient split; weight gradient not) and a dense layer, forward and backward.
std::vector<float> split_outputs(Precision precision) {
  std::vector<float> out;
  const auto append = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
  if (precision == Precision::fp32) {
    for (const int rows : {997, 1024, 50})
      for (const bool transpose_b : {false, true}) {
        MatmulParams p;
        p.members = 2, p.rows = rows, p.cols = 70, p.depth = 300, p.transpose_b = transpose_b, p.accumulate = true;
        const auto a = kc::random_floats(std::size_t(2) * rows * 300, 61), b = kc::random_floats(2 * 300 * 70, 62);
        std::vector<float> c = kc::random_floats(std::size_t(2) * rows * 70, 63);
        cpu_ops().matmul(p, a.data(), b.data(), c.data(), nullptr);
        append(c);
      }
  }
  Conv2dParams p = conv(2, 7, 14, 32, 64, false);
  p.precision = precision;
  const auto x = kc::random_floats(conv_x(p), 64), w = kc::random_floats(conv_w(p), 65, 0.3f);
  const auto b = kc::random_floats(std::size_t(p.members) * p.out_channels, 66), dy = kc::random_floats(conv_y(p), 67);
  std::vector<float> y(conv_y(p)), dx(conv_x(p)), dw(conv_w(p)), db(b.size());
  cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), nullptr);
  cpu_ops().conv().conv2d_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), nullptr);
  append(y), append(dx), append(dw), append(db);
  DenseParams d;
  d.members = 2, d.batch = 300, d.in_features = 500, d.out_features = 130, d.precision = precision;
  const auto dxin = kc::random_floats(2 * 300 * 500, 68), dwt = kc::random_floats(2 * 500 * 130, 69, 0.1f);
  const auto dbias = kc::random_floats(2 * 130, 70), ddy = kc::random_floats(2 * 300 * 130, 71);
  std::vector<float> dyo(2 * 300 * 130), ddx(dxin.size()), ddw(dwt.size()), ddb(dbias.size());
  cpu_ops().dense().dense_forward(d, dxin.data(), dwt.data(), dbias.data(), dyo.data(), nullptr);
  cpu_ops().dense().dense_backward(d, dxin.data(), dwt.data(), ddy.data(), ddx.data(), ddw.data(), ddb.data(), nullptr);
  append(dyo), append(ddx), append(ddw), append(ddb);
  return out;
}

}  // namespace

TEST_CASE("CPU ops split over helper threads (cpu::set_threads) give the bits of one thread, in every variant") {
  IsaGuard isa_guard;
  ThreadsGuard threads_guard;
  for (const std::string& isa : cpu::available_isas()) {
    CAPTURE(isa);
    cpu::set_isa(isa);
    std::vector<Precision> precisions{Precision::fp32};
    if (isa == "avx512" && pmap::kernels::bf16::supported()) precisions.push_back(Precision::bf16);
    for (const Precision precision : precisions) {
      CAPTURE(static_cast<int>(precision));
      cpu::set_threads(1);
      const std::vector<float> one = split_outputs(precision);
      for (const int threads : {2, 3, 2}) {  // 2 again: the team of the first call, reused
        CAPTURE(threads);
        cpu::set_threads(threads);
        CHECK(cpu::threads() == threads);
        const std::uint64_t before = pmap::kernels::cpu::detail::helper_ranges();
        const std::vector<float> many = split_outputs(precision);
        CHECK(pmap::kernels::cpu::detail::helper_ranges() > before);  // the products were split
        REQUIRE(many.size() == one.size());
        CHECK(kc::same_bits(many.data(), one.data(), one.size()));
      }
    }
  }
  cpu::set_threads(1);
  CHECK_THROWS_WITH_AS(cpu::set_threads(0), doctest::Contains("set_threads: 0 is not a thread count"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(cpu::set_threads(65), doctest::Contains("expected 1 to 64"), pmap::ValueError);
  CHECK(cpu::threads() == 1);
}

TEST_CASE("conv2d and dense with relu equal the op then the element-wise relu, bitwise (GEMM and direct paths)") {
  for (const Conv2dParams& base : {conv(2, 3, 9, 1, 12, true), conv(2, 3, 9, 5, 7, false)}) {
    CAPTURE(base.in_channels);
    Conv2dParams p = base;
    const auto x = kc::random_floats(conv_x(p), 31), w = kc::random_floats(conv_w(p), 32);
    const auto b = kc::random_floats(std::size_t(p.members) * p.out_channels, 33);
    std::vector<float> plain(conv_y(p)), fused(conv_y(p));
    cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), plain.data(), nullptr);
    cpu_ops().elementwise().unary(UnaryOp::relu, plain.size(), plain.data(), plain.data());
    p.relu = true;
    cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), fused.data(), nullptr);
    CHECK(kc::same_bits(plain.data(), fused.data(), plain.size()));
    CHECK(std::count(fused.begin(), fused.end(), 0.0f) > 0);
  }
  DenseParams d;
  d.members = 2, d.batch = 4, d.in_features = 30, d.out_features = 9;
  const auto x = kc::random_floats(2 * 4 * 30, 34), w = kc::random_floats(2 * 30 * 9, 35), b = kc::random_floats(18, 36);
  std::vector<float> plain(2 * 4 * 9), fused(plain.size());
  cpu_ops().dense().dense_forward(d, x.data(), w.data(), b.data(), plain.data(), nullptr);
  cpu_ops().elementwise().unary(UnaryOp::relu, plain.size(), plain.data(), plain.data());
  d.relu = true;
  cpu_ops().dense().dense_forward(d, x.data(), w.data(), b.data(), fused.data(), nullptr);
  CHECK(kc::same_bits(plain.data(), fused.data(), plain.size()));
}

TEST_CASE("avg_pool_relu_backward equals avg_pool_backward then relu's activation_backward, bitwise, also in place") {
  IsaGuard guard;
  for (const std::string& isa : cpu::available_isas()) {
    cpu::set_isa(isa);
    // 5 channels; 32 into a 64-byte aligned dx of over 1 MiB that is not r (AVX-512's streaming stores when
    // the windows tile)
    for (const int channels : {5, 32}) {
      for (const int stride : {2, 1, 3}) {  // tiled windows, overlapping ones, and gaps between windows
        CAPTURE(isa);
        CAPTURE(channels);
        CAPTURE(stride);
        AvgPoolParams q;
        q.members = 2, q.height = 7, q.width = 9;  // a row and a column past the tiled windows
        q.batch = channels == 32 ? 70 : 2;
        q.channels = channels;
        q.window_h = q.window_w = 2, q.stride_h = q.stride_w = stride;
        const auto g = avg_pool_geometry(q);
        const std::size_t xs = std::size_t(2) * q.batch * 7 * 9 * channels;
        const std::size_t ys = std::size_t(2) * q.batch * g.out_height * g.out_width * channels;
        std::vector<float> r = kc::random_floats(xs, 41);
        for (std::size_t i = 0; i < xs; i += 7) r[i] = std::nanf("");  // NaN activations: no gradient
        for (std::size_t i = 3; i < xs; i += 11) r[i] = -0.0f;
        cpu_ops().elementwise().unary(UnaryOp::relu, xs, r.data(), r.data());
        const auto dy = kc::random_floats(ys, 42);
        std::vector<float> expect(xs), storage(xs + 16, 7.0f);
        float* got = storage.data();
        while (reinterpret_cast<std::uintptr_t>(got) % 64 != 0) ++got;
        cpu_ops().conv().avg_pool_backward(q, dy.data(), expect.data());
        cpu_ops().elementwise().activation_backward(UnaryOp::relu, xs, r.data(), expect.data(), expect.data());
        cpu_ops().conv().avg_pool_relu_backward(q, r.data(), dy.data(), got);
        CHECK(kc::same_bits(expect.data(), got, xs));
        cpu_ops().conv().avg_pool_relu_backward(q, r.data(), dy.data(), r.data());  // over the activation
        CHECK(kc::same_bits(expect.data(), r.data(), xs));
      }
    }
  }
}

TEST_CASE("conv2d and dense workspaces sized for a batch serve every smaller batch") {
  // Guard bytes after the workspace must survive every call with a smaller batch.
  constexpr std::size_t kGuard = 4096;
  const auto untouched = [](const std::vector<unsigned char>& ws, std::size_t bytes) {
    return std::all_of(ws.begin() + static_cast<std::ptrdiff_t>(bytes), ws.end(), [](unsigned char v) { return v == 0xab; });
  };
  for (const Conv2dParams& big : {conv(1, 128, 28, 1, 32, true), conv(1, 128, 14, 32, 64, false)}) {
    CAPTURE(big.in_channels);
    const std::size_t bytes = cpu_ops().conv().conv2d_workspace_bytes(big);
    std::vector<unsigned char> ws(bytes + kGuard, 0xab);
    const auto x = kc::random_floats(conv_x(big), 51), w = kc::random_floats(conv_w(big), 52);
    std::vector<float> y(conv_y(big)), dx(conv_x(big)), dw(conv_w(big)), db(big.out_channels);
    for (int batch : {1, 2, 3, 5, 8, 13, 33, 64, 65, 100, 127}) {
      Conv2dParams p = big;
      p.batch = batch;
      cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), nullptr, y.data(), ws.data());
      cpu_ops().conv().conv2d_backward(p, x.data(), w.data(), y.data(), dx.data(), dw.data(), db.data(), ws.data());
      CHECK(untouched(ws, bytes));
    }
  }
  DenseParams big;
  big.batch = 128, big.in_features = 3136, big.out_features = 256;
  const std::size_t bytes = cpu_ops().dense().dense_workspace_bytes(big);
  std::vector<unsigned char> ws(bytes + kGuard, 0xab);
  const auto x = kc::random_floats(128 * 3136, 53), w = kc::random_floats(3136 * 256, 54);
  std::vector<float> y(128 * 256), dx(x.size()), dw(w.size()), db(256);
  for (int batch : {1, 7, 31, 64, 100}) {
    DenseParams p = big;
    p.batch = batch;
    cpu_ops().dense().dense_forward(p, x.data(), w.data(), nullptr, y.data(), ws.data());
    cpu_ops().dense().dense_backward(p, x.data(), w.data(), y.data(), dx.data(), dw.data(), db.data(), ws.data());
    CHECK(untouched(ws, bytes));
  }
}

TEST_CASE("strided_copy: contiguous runs copied whole and element by element give the definition, in every variant") {
  IsaGuard guard;
  struct Pattern {
    const char* name;
    std::vector<std::int64_t> dims, src_strides, dst_strides;
    std::int64_t src_offset, dst_offset;
    std::size_t src_size, dst_size;
  };
  const std::vector<Pattern> patterns{
      {"rows 2:6 of (3, 8, 5): runs of 20", {3, 4, 5}, {40, 5, 1}, {20, 5, 1}, 10, 0, 120, 60},
      {"into columns 3:6 of (2, 6, 4) (a concatenation): runs of 12", {2, 3, 4}, {12, 4, 1}, {24, 4, 1}, 0, 12, 24, 48},
      {"a transpose: no run", {4, 3}, {1, 4}, {3, 1}, 0, 0, 12, 12},
      {"every other element: no run", {5}, {2}, {1}, 1, 0, 11, 5},
      {"one run with offsets", {17}, {1}, {1}, 3, 2, 20, 19},
      {"a run of the last axis only", {3, 2, 4}, {4, 12, 1}, {8, 4, 1}, 0, 0, 24, 24},
      {"no elements", {0, 5}, {5, 1}, {5, 1}, 0, 0, 1, 1},
      {"a broadcast row (stride 0): runs of 4", {3, 4}, {0, 1}, {4, 1}, 0, 0, 4, 12},
      {"an axis of 1 between runs", {2, 1, 3}, {5, 9, 1}, {3, 3, 1}, 1, 0, 9, 6},
      {"a scalar (no axes)", {}, {}, {}, 2, 1, 3, 2},
  };
  for (const std::string& isa : cpu::available_isas()) {
    cpu::set_isa(isa);
    for (const Pattern& t : patterns) {
      CAPTURE(isa);
      CAPTURE(t.name);
      StridedCopyParams p;
      p.ndim = static_cast<int>(t.dims.size());
      for (int k = 0; k < p.ndim; ++k) {
        p.dims[k] = t.dims[k];
        p.src_strides[k] = t.src_strides[k];
        p.dst_strides[k] = t.dst_strides[k];
      }
      p.src_offset = t.src_offset;
      p.dst_offset = t.dst_offset;
      const auto src = kc::random_floats(t.src_size, 61);
      std::vector<float> got(t.dst_size, -7.0f), expect(t.dst_size, -7.0f);
      // The definition: each multi-index's element, the untouched ones left as they were.
      std::int64_t count = 1;
      for (const auto d : t.dims) count *= d;
      for (std::int64_t i = 0; i < count; ++i) {
        std::int64_t rest = i, s = t.src_offset, d = t.dst_offset;
        for (int k = p.ndim - 1; k >= 0; --k) {
          s += rest % t.dims[k] * t.src_strides[k];
          d += rest % t.dims[k] * t.dst_strides[k];
          rest /= t.dims[k];
        }
        expect[static_cast<std::size_t>(d)] = src[static_cast<std::size_t>(s)];
      }
      cpu_ops().layout().strided_copy(p, src.data(), got.data());
      CHECK(kc::same_bits(expect.data(), got.data(), t.dst_size));
    }
  }
}

}  // namespace PMAPCC_TEST_FILE
