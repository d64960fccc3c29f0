// The CPU kernels' GEMM. With Eigen 3.4 it calls Eigen's blocked GEMM (the one behind c.noalias() = a * b)
// with packing buffers from the caller's workspace; other Eigen versions go through the public API, which
// allocates its packing buffers per call.
#include <pmapcc/kernels/cpu/gemm.h>

#include <pmap/error.h>
#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu/shared/cpu_threads.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

namespace PMAPCC_CPU_NS::detail {
namespace {

// Rows per split unit when a product runs on several threads (cpu::detail::split_rows).
constexpr Index kSplitAlign = 16;

void gemm_public(Index rows, Index cols, Index depth, GemmOperand a, GemmOperand b, float* c,
                 bool accumulate) {
  MatrixView out(c, rows, cols);
  const auto run = [&](const auto& lhs, const auto& rhs) {
    if (accumulate) {
      out.noalias() += lhs * rhs;
    } else {
      out.noalias() = lhs * rhs;
    }
  };
  using Strided = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
  if (a.stride != 0) {  // a range of rows of a larger a (gemm's split): a strided view
    const Strided a_rows(a.data, rows, depth, Eigen::OuterStride<>(a.stride));
    const Strided a_cols(a.data, depth, rows, Eigen::OuterStride<>(a.stride));
    const ConstMatrixView b_rows(b.data, depth, cols), b_cols(b.data, cols, depth);
    if (!a.transposed && !b.transposed) run(a_rows, b_rows);
    if (!a.transposed && b.transposed) run(a_rows, b_cols.transpose());
    if (a.transposed && !b.transposed) run(a_cols.transpose(), b_rows);
    if (a.transposed && b.transposed) run(a_cols.transpose(), b_cols.transpose());
    return;
  }
  const ConstMatrixView a_rows(a.data, rows, depth), a_cols(a.data, depth, rows);
  const ConstMatrixView b_rows(b.data, depth, cols), b_cols(b.data, cols, depth);
  if (!a.transposed && !b.transposed) run(a_rows, b_rows);
  if (!a.transposed && b.transposed) run(a_rows, b_cols.transpose());
  if (a.transposed && !b.transposed) run(a_cols.transpose(), b_rows);
  if (a.transposed && b.transposed) run(a_cols.transpose(), b_cols.transpose());
}

std::size_t fp32_pack_floats(Index rows, Index cols, Index depth);
void fp32_gemm(Index rows, Index cols, Index depth, GemmOperand a, GemmOperand b, float* c, bool accumulate,
               float* pack, std::size_t pack_floats);

}  // namespace

std::size_t gemm_pack_floats(Index rows, Index cols, Index depth, Precision precision) {
  if (precision == Precision::fp32) return fp32_pack_floats(rows, cols, depth);
  return (bf16::gemm_pack_bytes(rows, cols, depth) + sizeof(float) - 1) / sizeof(float);
}

void gemm(Index rows, Index cols, Index depth, GemmOperand a, GemmOperand b, float* c, bool accumulate,
          float* pack, std::size_t pack_floats, Precision precision) {
  if (precision == Precision::fp32) {
    // A range of c's rows is a range of a's rows, or of its buffer's columns when a is transposed.
    const Index stride = a.stride != 0 ? a.stride : a.transposed ? rows : depth;
    cpu::detail::split_rows(rows, cols, depth, kSplitAlign, [&](Index first, Index count, bool helper) {
      if (!helper && count == rows) return fp32_gemm(rows, cols, depth, a, b, c, accumulate, pack, pack_floats);
      const std::size_t floats = helper ? fp32_pack_floats(count, cols, depth) : pack_floats;
      float* space = helper ? static_cast<float*>(cpu::detail::helper_scratch(floats * sizeof(float))) : pack;
      const GemmOperand part{a.data + (a.transposed ? first : first * stride), a.transposed, stride};
      fp32_gemm(count, cols, depth, part, b, c + first * cols, accumulate, space, floats);
    });
    return;
  }
  bf16::gemm(rows, cols, depth, {a.data, a.transposed}, {b.data, b.transposed}, c, accumulate, pack,
             pack_floats * sizeof(float));
}

void require_precision(Precision precision, const char* op) {
  if (precision == Precision::fp32) return;
  const std::string_view variant = PMAPCC_CPU_STR(PMAPCC_CPU_VARIANT);  // no allocation per op call
  if (!bf16::supported())
    throw ValueError(std::string(op) + ": bf16 precision needs AVX512_BF16 (with AVX512F, BW and VL), which this "
                     "CPU lacks: use fp32");
  if (variant != "avx512")
    throw ValueError(std::string(op) + ": bf16 precision runs in the avx512 CPU kernels, and the " +
                     std::string(variant) +
                     " variant is active (PMAPCC_CPU_ISA): use fp32, or PMAPCC_CPU_ISA=avx512 or auto");
}

}  // namespace PMAPCC_CPU_NS::detail

#if EIGEN_WORLD_VERSION == 3 && EIGEN_MAJOR_VERSION == 4

namespace PMAPCC_CPU_NS::detail {
namespace {

constexpr std::size_t kAlignFloats = 16;  // 64 bytes: enough for any SIMD packet Eigen uses

std::size_t align_up(std::size_t floats) { return (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Eigen's blocking (kc, mc, nc) for a row-major result, as gemm_blocking_space computes it, pointing at
// our buffers. A row-major C = A B runs as C^T = B^T A^T: Eigen's m is our cols, its n our rows.
class WorkspaceBlocking : public Eigen::internal::level3_blocking<float, float> {
 public:
  WorkspaceBlocking(Index rows, Index cols, Index depth) {
    m_mc = cols;
    m_nc = rows;
    m_kc = depth;
    Eigen::internal::computeProductBlockingSizes<float, float, 1>(m_kc, m_mc, m_nc, Index{1});
  }
  std::size_t floats() const {
    return align_up(static_cast<std::size_t>(m_kc * m_mc)) + static_cast<std::size_t>(m_kc * m_nc) +
           kAlignFloats;
  }
  void use(float* pack) {
    const auto address = reinterpret_cast<std::uintptr_t>(pack);
    const std::uintptr_t mask = kAlignFloats * sizeof(float) - 1;
    auto* base = reinterpret_cast<float*>((address + mask) & ~mask);
    m_blockA = base;
    m_blockB = base + align_up(static_cast<std::size_t>(m_kc * m_mc));
  }
};

template <int AOrder, int BOrder>
void run_gemm(Index rows, Index cols, Index depth, const float* a, Index a_stride, const float* b, float* c,
              WorkspaceBlocking& blocking) {
  using Product = Eigen::internal::general_matrix_matrix_product<Index, float, AOrder, false, float, BOrder,
                                                                 false, Eigen::RowMajor, 1>;
  const Index lda = a_stride != 0 ? a_stride : AOrder == Eigen::RowMajor ? depth : rows;
  const Index ldb = BOrder == Eigen::RowMajor ? cols : depth;
  Product::run(rows, cols, depth, a, lda, b, ldb, c, 1, cols, 1.0f, blocking, nullptr);
}

// The largest depth block (kc) Eigen's blocking ever picks on this machine: the one it picks for a very
// deep product. Every product's kc is at most min(depth, this).
Index max_depth_block() {
  static const Index kc = [] {
    Index k = Index{1} << 24, m = 1024, n = 1024;
    Eigen::internal::computeProductBlockingSizes<float, float, 1>(k, m, n, Index{1});
    return k;
  }();
  return kc;
}

}  // namespace

// Eigen packs at most kc x cols of B^T (its lhs) and kc x rows of A^T (its rhs) with kc <= min(depth,
// max_depth_block()): a bound that only grows with each dimension, so a workspace sized for a product
// serves every smaller one (a batch-128 plan serves batch 64), which Eigen's own sizes do not guarantee.
namespace {

std::size_t fp32_pack_floats(Index rows, Index cols, Index depth) {
  if (rows == 0 || cols == 0 || depth == 0) return 0;
  const auto kc = static_cast<std::size_t>(std::min(depth, max_depth_block()));
  return align_up(kc * static_cast<std::size_t>(cols)) + kc * static_cast<std::size_t>(rows) + kAlignFloats;
}

void fp32_gemm(Index rows, Index cols, Index depth, GemmOperand a, GemmOperand b, float* c, bool accumulate,
               float* pack, std::size_t pack_floats) {
#if defined(__AVX512F__)
  if (avx512_gemm_suits(rows, cols, depth, b)) {
    avx512_gemm(rows, cols, depth, a, b.data, c, accumulate);
    return;
  }
#endif
  if (!accumulate) std::fill_n(c, rows * cols, 0.0f);
  if (rows == 0 || cols == 0 || depth == 0) return;
  WorkspaceBlocking blocking(rows, cols, depth);
  if (pack == nullptr || pack_floats < blocking.floats()) {
    gemm_public(rows, cols, depth, a, b, c, true);
    return;
  }
  blocking.use(pack);
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (!a.transposed && !b.transposed) run_gemm<R, R>(rows, cols, depth, a.data, a.stride, b.data, c, blocking);
  if (!a.transposed && b.transposed) run_gemm<R, C>(rows, cols, depth, a.data, a.stride, b.data, c, blocking);
  if (a.transposed && !b.transposed) run_gemm<C, R>(rows, cols, depth, a.data, a.stride, b.data, c, blocking);
  if (a.transposed && b.transposed) run_gemm<C, C>(rows, cols, depth, a.data, a.stride, b.data, c, blocking);
}

}  // namespace
}  // namespace PMAPCC_CPU_NS::detail

#else  // another Eigen: the public API (it allocates its packing buffers)

namespace PMAPCC_CPU_NS::detail {
namespace {

std::size_t fp32_pack_floats(Index, Index, Index) { return 0; }

void fp32_gemm(Index rows, Index cols, Index depth, GemmOperand a, GemmOperand b, float* c, bool accumulate,
               float*, std::size_t) {
  gemm_public(rows, cols, depth, a, b, c, accumulate);
}

}  // namespace
}  // namespace PMAPCC_CPU_NS::detail

#endif
