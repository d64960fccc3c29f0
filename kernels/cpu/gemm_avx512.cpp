// The avx512 variant's own fp32 GEMM, for products up to 1024 deep with B row-major: register tiles of up
// to 6 rows x 64 columns (24 zmm sums) over depth blocks of a 64-column panel of B read in place (L1-sized),
// A read in place, row-major or transposed (a broadcast per row and depth step). Eigen's blocked GEMM packs
// both operands first and tiles for large products: on the MNIST CNN's second conv (64 columns) it ran at
// 75 % of this core's measured FMA peak (bench_peak), this at 89 % (kMaxDepth has the figures).
//
// Every c[i][j] is one chain of FMAs in depth order, starting from c (accumulate) or 0: the order depends on
// nothing else (not the blocking, not the cache sizes, not the rows around it), so results are the same run
// after run and machine after machine with this variant.
#include <pmapcc/kernels/cpu/gemm.h>

#if defined(__AVX512F__)

#include <immintrin.h>

#include <algorithm>
#include <utility>

namespace PMAPCC_CPU_NS::detail {
namespace {

constexpr Index kPanel = 64;              // columns of a panel: 4 zmm
constexpr Index kPanelBytes = 24 * 1024;  // a panel's depth block stays in L1 (48 KB here) beside A and C
constexpr Index kMaxDepthBlock = kPanelBytes / (kPanel * static_cast<Index>(sizeof(float)));
constexpr Index kMaxRowBlock = 480;       // a block of row-major A (480 x 96 floats) stays in L2 across panels
// Deeper products run through Eigen, whose packed blocks suit them (the 1536^3 sgemm, a dense layer's
// forward over 3136 inputs). Which products run here depends on depth and B's layout, never on the number
// of columns, so a layer split over 'model' by output columns sums every output as the unsplit layer does.
// Measured on one core (bench_train sgemm, GFLOP/s, Eigen -> this): 588x64x288 165 -> 197, 288x64x392 (A
// transposed) 152 -> 200, 588x10x288 62 -> 100, 256x10x128 (A transposed) 43 -> 84, 588x128x288 171 -> 183.
// Transposed B stays with Eigen: transposing it into panels here made 392x288x64 (a conv's input gradient)
// 183 -> 167 and 128x3136x256 161 -> 146.
constexpr Index kMaxDepth = 1024;

// The block size that splits n into even blocks of at most max (rounded up to a multiple of `multiple`).
Index even_block(Index n, Index max, Index multiple) {
  const Index blocks = (n + max - 1) / max;
  const Index block = (n + blocks - 1) / blocks;
  return (block + multiple - 1) / multiple * multiple;
}

// A(i, k) = a[i * row_step + k * depth_step]: a row-major A, or the transpose of a row-major buffer.
struct Lhs {
  const float* a;
  Index row_step;
  Index depth_step;
  Lhs at(Index row, Index k) const { return {a + row * row_step + k * depth_step, row_step, depth_step}; }
};

// c (R rows of ldc, V zmm of columns, the last one masked by `last`) = (load ? c : 0) + A-rows @ B-block,
// A rows from `lhs` at row 0 / depth 0 of the block, B block rows at b + k * ldb.
template <int R, int V>
void tile(Index depth, Lhs lhs, const float* b, Index ldb, float* c, Index ldc, __mmask16 last, bool load) {
  __mmask16 mask[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) mask[v] = v == V - 1 ? last : __mmask16{0xFFFF};
  __m512 sum[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      sum[r][v] = load ? _mm512_maskz_loadu_ps(mask[v], c + r * ldc + 16 * v) : _mm512_setzero_ps();
  }
  for (Index k = 0; k < depth; ++k) {
    __m512 row[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) row[v] = _mm512_maskz_loadu_ps(mask[v], b + k * ldb + 16 * v);
    const float* ak = lhs.a + k * lhs.depth_step;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(ak[r * lhs.row_step]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) sum[r][v] = _mm512_fmadd_ps(x, row[v], sum[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, mask[v], sum[r][v]);
  }
}

// Rows of a tile for V zmm of columns: 24 sums at most (of 32 registers), so B's V loads and the
// broadcasts fit beside them.
template <int V>
constexpr int kTileRows = V == 4 ? 6 : V == 3 ? 8 : 12;

template <int V, int R = kTileRows<V>>
void tile_rows(Index rows, Index depth, Lhs lhs, const float* b, Index ldb, float* c, Index ldc, __mmask16 last,
               bool load) {
  Index i = 0;
  for (; i + R <= rows; i += R) tile<R, V>(depth, lhs.at(i, 0), b, ldb, c + i * ldc, ldc, last, load);
  const Index left = rows - i;
  if (left == 0) return;
  // the leftover rows, fewer than R: one smaller tile
  [&]<int... L>(std::integer_sequence<int, L...>) {
    ((left == L + 1 ? tile<L + 1, V>(depth, lhs.at(i, 0), b, ldb, c + i * ldc, ldc, last, load) : void()), ...);
  }(std::make_integer_sequence<int, R - 1>{});
}

}  // namespace

bool avx512_gemm_suits(Index rows, Index cols, Index depth, GemmOperand b) {
  return !b.transposed && rows > 0 && cols > 0 && depth > 0 && depth <= kMaxDepth;
}

void avx512_gemm(Index rows, Index cols, Index depth, GemmOperand a, const float* b, float* c, bool accumulate) {
  const Index stride = a.stride != 0 ? a.stride : a.transposed ? rows : depth;
  const Lhs lhs = a.transposed ? Lhs{a.data, 1, stride} : Lhs{a.data, stride, 1};
  const Index depth_block = even_block(depth, kMaxDepthBlock, 1);  // 288 deep: 3 x 96; 392: 5 x 79 (+ 76)
  // Row blocks for a row-major A only (24: a multiple of every tile height). Measured: 588x64x288 172 ->
  // 186-196 GFLOP/s with blocks of 294 rows, but 3136x256x128 with A transposed 141 -> 128 with blocks of 480.
  const Index row_block = a.transposed ? rows : even_block(rows, kMaxRowBlock, 24);
  for (Index i0 = 0; i0 < rows; i0 += row_block) {
    const Index mc = std::min(row_block, rows - i0);
    for (Index k0 = 0; k0 < depth; k0 += depth_block) {
      const Index kc = std::min(depth_block, depth - k0);
      const Lhs lhs_ik = lhs.at(i0, k0);
      const bool load = accumulate || k0 > 0;
      for (Index j0 = 0; j0 < cols; j0 += kPanel) {
        const Index width = std::min(kPanel, cols - j0);
        const auto vectors = static_cast<int>((width + 15) / 16);
        const auto tail = static_cast<unsigned>(width - 16 * (vectors - 1));
        const auto last = static_cast<__mmask16>((1u << tail) - 1u);
        const float* bk = b + k0 * cols + j0;
        float* cij = c + i0 * cols + j0;
        switch (vectors) {
          case 1: tile_rows<1>(mc, kc, lhs_ik, bk, cols, cij, cols, last, load); break;
          case 2: tile_rows<2>(mc, kc, lhs_ik, bk, cols, cij, cols, last, load); break;
          case 3: tile_rows<3>(mc, kc, lhs_ik, bk, cols, cij, cols, last, load); break;
          default: tile_rows<4>(mc, kc, lhs_ik, bk, cols, cij, cols, last, load); break;
        }
      }
    }
  }
}

}  // namespace PMAPCC_CPU_NS::detail

#endif
