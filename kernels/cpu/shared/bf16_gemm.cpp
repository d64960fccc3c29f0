// The bf16 GEMM (bf16_gemm.h). Blocked like a BLAS: a block of b (KC x NC) is rounded and packed into
// panels of 32 columns whose depth pairs are interleaved (the layout vdpbf16ps and tdpbf16ps read), a block
// of a (MC x KC) is rounded into rows of depth pairs (or, transposed on the vector path, interleaved the
// same way as b), unless the caller rounded a's rows already (RoundedRows: read in place) or gave a transposed
// a's depth pairs (PairedTranspose: read in place on the vector path, widened on the fma path). The vector path
// sums 8 x 32 register tiles of c, 2 products per lane per instruction; the AMX path 32 x 32 tiles of c in
// four tile registers, 32 products per element per instruction, and runs a weight gradient (transposed a)
// as its transposed product when that scatters less. The fma path packs the rounded operands as floats
// and sums 12 x 32 tiles of c with fp32 FMAs. Only
// the functions marked with a target attribute use AVX-512, AVX512_BF16 or AMX; gemm() checks the CPU
// before it calls them.
#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu/shared/cpu_threads.h>

#include <pmap/error.h>

#include <cpuid.h>
#include <immintrin.h>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#define PMAPCC_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define PMAPCC_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace pmap::kernels::bf16 {
namespace {

using I = std::int64_t;
using Pair = std::uint32_t;  // two bf16 of consecutive depth: the lower one in the low half

constexpr I kMR = 8;     // rows of the vector path's register tile
constexpr I kNR = 32;    // columns of a tile (both paths): two vectors, or two tile registers, of 16 sums
constexpr I kTR = 32;    // rows of the AMX path's tile: two tile registers of 16 rows
constexpr I kTK = 16;    // depth pairs per AMX instruction (64 bytes of bf16 per tile row)
constexpr I kMC = 96;    // rows of a block of a (a multiple of kTR)
constexpr I kKC = 384;   // depth of a block (a multiple of 2 * kTK)
constexpr I kNC = 512;   // columns of a block of b (a multiple of kNR)
constexpr std::size_t kAlign = 64;

I round_up(I x, I m) { return (x + m - 1) / m * m; }
std::size_t align_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The block sizes for a product: each at most its constant, and never more than the shape needs (rounded
// up to what the AMX path pads to, so that one size serves both paths).
struct Blocks {
  I mc, kc, nc;
};
Blocks blocks(I rows, I cols, I depth) {
  return {std::min(kMC, round_up(rows, kTR)), std::min(kKC, round_up(depth, 2 * kTK)),
          std::min(kNC, round_up(cols, kNR))};
}

// Depth pairs per packed row: the block's pairs, rounded up to whole AMX instructions on that path.
I padded_pairs(Path path, I kc) { return path == Path::amx ? round_up((kc + 1) / 2, kTK) : (kc + 1) / 2; }
// Packed blocks' bytes: 4 per element, what the fma path's floats take (the bf16 paths use half of it).
std::size_t a_bytes(const Blocks& b) { return align_up(static_cast<std::size_t>(b.mc * b.kc) * 4); }
std::size_t b_bytes(const Blocks& b) { return align_up(static_cast<std::size_t>(b.nc * b.kc) * 4); }

__mmask16 first(I n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}

// The left operand in one of its forms: a's floats, or (when not null) the rows the caller rounded, or the
// depth pairs of a transposed a the caller rounded.
struct Left {
  Operand a;
  const RoundedRows* rounded = nullptr;
  const PairedTranspose* paired = nullptr;
};

// n (at most 16) floats rounded to bf16, in the low 16 bits of 16 lanes of 32 bits; lanes past n are 0.
PMAPCC_BF16_TARGET inline __m512i widen16(const float* x, I n) {
  const __m512 v = _mm512_maskz_loadu_ps(first(n), x);
  // The zero-masking forms throughout: GCC 12 warns of the undefined pass-through of the plain ones.
  return _mm512_maskz_cvtepu16_epi32(0xFFFF, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// n (at most 16) floats rounded to bf16 and widened back (exact): lanes past n are 0.
PMAPCC_BF16_TARGET inline __m512 rounded16(const float* x, I n) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, widen16(x, n), 16));
}

// 16 pairs from two rows of consecutive depth (r1 null: past the end of the depth, zeros).
PMAPCC_BF16_TARGET inline __m512i pairs16(const float* r0, const float* r1, I n) {
  const __m512i lo = widen16(r0, n);
  if (r1 == nullptr) return lo;
  return _mm512_or_si512(lo, _mm512_maskz_slli_epi32(0xFFFF, widen16(r1, n), 16));
}

// 32 floats of consecutive depth (n of them; lanes past n are 0) rounded to bf16 as 16 pairs.
PMAPCC_BF16_TARGET inline __m512i depth_pairs16(const float* x, I n) {
  const __m512 lo = _mm512_maskz_loadu_ps(first(n), x), hi = _mm512_maskz_loadu_ps(first(n - 16), x + 16);
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // lo's 16 in the low half
}

// The 16 x 16 matrix of 32-bit lanes in v, transposed in place: lane c of v[r] moves to lane r of v[c].
PMAPCC_BF16_TARGET inline void transpose16(__m512i (&v)[16]) {
  __m512i t[16];
  for (int r = 0; r < 16; r += 2) {  // t[r], t[r + 1]: rows r and r + 1 interleaved, lane by lane
    t[r] = _mm512_maskz_unpacklo_epi32(0xFFFF, v[r], v[r + 1]);
    t[r + 1] = _mm512_maskz_unpackhi_epi32(0xFFFF, v[r], v[r + 1]);
  }
  for (int r = 0; r < 16; r += 4) {  // v[r + e], 128-bit block b: rows r..r+3 of column 4b + e
    v[r] = _mm512_maskz_unpacklo_epi64(0xFF, t[r], t[r + 2]);
    v[r + 1] = _mm512_maskz_unpackhi_epi64(0xFF, t[r], t[r + 2]);
    v[r + 2] = _mm512_maskz_unpacklo_epi64(0xFF, t[r + 1], t[r + 3]);
    v[r + 3] = _mm512_maskz_unpackhi_epi64(0xFF, t[r + 1], t[r + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // column 4b + e: block b of v[e], v[4 + e], v[8 + e], v[12 + e]
    const __m512i x0 = _mm512_maskz_shuffle_i32x4(0xFFFF, v[e], v[4 + e], 0x88);
    const __m512i x1 = _mm512_maskz_shuffle_i32x4(0xFFFF, v[e], v[4 + e], 0xDD);
    const __m512i y0 = _mm512_maskz_shuffle_i32x4(0xFFFF, v[8 + e], v[12 + e], 0x88);
    const __m512i y1 = _mm512_maskz_shuffle_i32x4(0xFFFF, v[8 + e], v[12 + e], 0xDD);
    t[e] = _mm512_maskz_shuffle_i32x4(0xFFFF, x0, y0, 0x88);
    t[4 + e] = _mm512_maskz_shuffle_i32x4(0xFFFF, x1, y1, 0x88);
    t[8 + e] = _mm512_maskz_shuffle_i32x4(0xFFFF, x0, y0, 0xDD);
    t[12 + e] = _mm512_maskz_shuffle_i32x4(0xFFFF, x1, y1, 0xDD);
  }
  std::copy(t, t + 16, v);
}

PMAPCC_BF16_TARGET void round_bits_vector(const float* x, std::size_t n, std::uint16_t* bits) {
  for (std::size_t i = 0; i < n; i += 16) {
    const I left = static_cast<I>(std::min<std::size_t>(16, n - i));
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(first(left), x + i));
    _mm256_mask_storeu_epi16(bits + i, first(left), reinterpret_cast<__m256i>(v));
  }
}

PMAPCC_BF16_TARGET void pair_rows_vector(const float* r0, const float* r1, std::size_t n, Pair* out) {
  for (std::size_t i = 0; i < n; i += 16) {
    const I left = static_cast<I>(std::min<std::size_t>(16, n - i));
    _mm512_mask_storeu_epi32(out + i, first(left), pairs16(r0 + i, r1 == nullptr ? nullptr : r1 + i, left));
  }
}

PMAPCC_BF16_TARGET void round_vector(const float* x, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; i += 16) {
    const I left = static_cast<I>(std::min<std::size_t>(16, n - i));
    _mm512_mask_storeu_ps(out + i, first(left), rounded16(x + i, left));
  }
}

// Depth rows k0 and k0 + 1 (the latter when below k_end) of a row-major buffer, from column j0 on, as
// `width` pairs (zeros past the given columns).
PMAPCC_BF16_TARGET void interleave(const float* m, I ld, I k0, I k_end, I j0, I columns, Pair* out, I width) {
  const float* r0 = m + k0 * ld + j0;
  pair_rows_vector(r0, k0 + 1 < k_end ? r0 + ld : nullptr, static_cast<std::size_t>(columns), out);
  std::fill(out + columns, out + width, Pair{0});
}

// b's block (depth [k0, k0 + kc), columns [j0, j0 + nc)) as panels of kNR columns: panel q holds, for each
// depth pair p below kpp, kNR pairs at out + (q * kpp + p) * kNR (zeros past the block's depth and columns).
PMAPCC_BF16_TARGET void pack_b(const Operand& b, I depth, I cols, I k0, I kc, I j0, I nc, I kpp, Pair* out) {
  const I kp = (kc + 1) / 2, panels = (nc + kNR - 1) / kNR;
  for (I q = 0; q < panels; ++q) {
    Pair* panel = out + q * kpp * kNR;
    const I width = std::min(kNR, nc - q * kNR);
    if (kpp > kp) std::memset(panel + kp * kNR, 0, static_cast<std::size_t>((kpp - kp) * kNR) * sizeof(Pair));
    if (!b.transposed) {  // b[k][j] at data[k * cols + j]
      for (I p = 0; p < kp; ++p)
        interleave(b.data, cols, k0 + 2 * p, k0 + kc, j0 + q * kNR, width, panel + p * kNR, kNR);
      continue;
    }
    // b[k][j] at data[j * depth + k]: each column's depth run is contiguous. 16 pairs of each of 16 columns
    // are rounded into 16 vectors, which a transpose turns into 16 pairs of the panel's rows.
    if (width < kNR) std::memset(panel, 0, static_cast<std::size_t>(kp * kNR) * sizeof(Pair));
    for (I g = 0; g < width; g += 16) {
      const float* cols16 = b.data + (j0 + q * kNR + g) * depth + k0;
      for (I k = 0; k < kc; k += 32) {
        __m512i v[16];
        for (I c = 0; c < 16; ++c)
          v[c] = g + c < width ? depth_pairs16(cols16 + c * depth + k, kc - k) : _mm512_setzero_si512();
        transpose16(v);
        for (I p = 0; p < std::min<I>(16, kp - k / 2); ++p) _mm512_storeu_si512(panel + (k / 2 + p) * kNR + g, v[p]);
      }
    }
  }
}

// a's block (rows [i0, i0 + mc), depth [k0, k0 + kc)) as rows of kpp pairs: pair p of row i at
// out[i * kpp + p], zeros past the block's depth. On the vector path a transposed a is interleaved like b
// instead: pair p of row i at out[p * stride + i] with stride = mc rounded up to 16. The AMX path adds zero
// rows up to a whole tile.
PMAPCC_BF16_TARGET void pack_a(Path path, const Operand& a, I rows, I depth, I i0, I mc, I k0, I kc, I kpp,
                               Pair* out) {
  const I kp = (kc + 1) / 2;
  if (a.transposed && path == Path::avx512) {  // a[i][k] at data[k * rows + i]
    const I stride = round_up(mc, 16);
    for (I p = 0; p < kp; ++p) interleave(a.data, rows, k0 + 2 * p, k0 + kc, i0, mc, out + p * stride, stride);
    return;
  }
  const I mcp = path == Path::amx ? round_up(mc, kTR) : mc;
  if (mcp > mc) std::memset(out + mc * kpp, 0, static_cast<std::size_t>((mcp - mc) * kpp) * sizeof(Pair));
  if (a.transposed) {  // AMX: interleave 16 rows at a time, then scatter each pair to its row
    const __m512i lanes = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(static_cast<int>(kpp)));
    for (I p = 0; p < kpp; ++p) {
      if (p >= kp) {
        for (I i = 0; i < mc; ++i) out[i * kpp + p] = 0;
        continue;
      }
      const float* r0 = a.data + (k0 + 2 * p) * rows + i0;
      const float* r1 = k0 + 2 * p + 1 < k0 + kc ? r0 + rows : nullptr;
      for (I i = 0; i < mc; i += 16) {
        const I n = std::min<I>(16, mc - i);
        _mm512_mask_i32scatter_epi32(out + i * kpp + p, first(n), lanes,
                                     pairs16(r0 + i, r1 == nullptr ? nullptr : r1 + i, n), 4);
      }
    }
    return;
  }
  for (I i = 0; i < mc; ++i) {  // a[i][k] at data[i * depth + k]
    const float* row = a.data + (i0 + i) * depth + k0;
    auto* dst = reinterpret_cast<std::uint16_t*>(out + i * kpp);
    for (I k = 0; k < 2 * kpp; k += 16) {
      const __m256i v = _mm512_maskz_cvtepi32_epi16(0xFFFF, widen16(row + k, std::min<I>(16, kc - k)));
      _mm256_mask_storeu_epi16(dst + k, first(2 * kpp - k), v);
    }
  }
}

// The AMX path's rows of pairs (pack_a's layout, zero rows up to a whole tile) from the caller's depth pairs
// of a transposed a: pair p of row i is paired.pairs[(k0 / 2 + p) * stride + i0 + i].
PMAPCC_BF16_TARGET void pack_a_paired(const PairedTranspose& paired, I i0, I mc, I k0, I kc, I kpp, Pair* out) {
  const I kp = (kc + 1) / 2, mcp = round_up(mc, kTR);
  std::memset(out, 0, static_cast<std::size_t>(mcp * kpp) * sizeof(Pair));
  for (I p = 0; p < kp; ++p) {
    const Pair* src = paired.pairs + (k0 / 2 + p) * paired.stride + i0;
    for (I i = 0; i < mc; ++i) out[i * kpp + p] = src[i];
  }
}

// MR rows of sums (lo: columns 0-15, hi: 16-31) into the first `columns` columns of c's rows ldc apart,
// added to c's values with add.
template <int MR>
PMAPCC_BF16_TARGET __attribute__((always_inline)) inline void store_tile(__m512 (&lo)[MR], __m512 (&hi)[MR], float* c,
                                                                         I ldc, I columns, bool add) {
  const __mmask16 m0 = first(columns), m1 = first(columns - 16);
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    float* row = c + r * ldc;
    if (add) {
      lo[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), lo[r]);
      hi[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), hi[r]);
    }
    _mm512_mask_storeu_ps(row, m0, lo[r]);
    if (m1 != 0) _mm512_mask_storeu_ps(row + 16, m1, hi[r]);
  }
}

// c[r][0..columns) += (or, with add false, =) the sums of MR rows of packed a (pair p of row r at
// a[r * si + p * sp]) times one panel of packed b, over kp pairs.
template <int MR>
PMAPCC_BF16_TARGET void tile(I kp, const Pair* a, I si, I sp, const Pair* b, float* c, I ldc, I columns, bool add) {
  __m512 lo[MR], hi[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (I p = 0; p < kp; ++p) {
    const auto b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * kNR));
    const auto b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * kNR + 16));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const auto x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[r * si + p * sp])));
      lo[r] = _mm512_dpbf16_ps(lo[r], x, b0);
      hi[r] = _mm512_dpbf16_ps(hi[r], x, b1);
    }
  }
  store_tile<MR>(lo, hi, c, ldc, columns, add);
}

using Tile = void (*)(I, const Pair*, I, I, const Pair*, float*, I, I, bool);
constexpr Tile kTiles[kMR + 1] = {nullptr,  &tile<1>, &tile<2>, &tile<3>, &tile<4>,
                                  &tile<5>, &tile<6>, &tile<7>, &tile<8>};

// The AMX path's tile: c[r][0..columns) for r below rows_left (at most 32) += (or, with add false, =) 32 rows
// of packed a (rows of kpp pairs) times one panel of packed b, over kpp pairs (a multiple of kTK). Tile
// registers 0-3 hold the four 16 x 16 quarters of the sums, 4-5 the two 16-row slices of a, 6-7 the two
// 16-column halves of b.
// Row r of a starts at a + r * lda. With transposed, sum (r, q) goes to c[q * ldc + r] instead (run's
// transposed product).
PMAPCC_AMX_TARGET void amx_tile(I kpp, const Pair* a, I lda, const Pair* b, float* c, I ldc, I rows_left, I columns,
                                bool add, bool transposed) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const auto a_stride = static_cast<long>(lda * sizeof(Pair)), b_stride = static_cast<long>(kNR * sizeof(Pair));
  for (I p = 0; p < kpp; p += kTK) {
    _tile_loadd(4, a + p, a_stride);
    _tile_loadd(5, a + 16 * lda + p, a_stride);
    _tile_loadd(6, b + p * kNR, b_stride);
    _tile_loadd(7, b + p * kNR + 16, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float sums[kTR][kNR];
  _tile_stored(0, &sums[0][0], kNR * sizeof(float));
  _tile_stored(1, &sums[0][16], kNR * sizeof(float));
  _tile_stored(2, &sums[16][0], kNR * sizeof(float));
  _tile_stored(3, &sums[16][16], kNR * sizeof(float));
  if (transposed) {  // column q of the sums, gathered, is a run of c's row q
    const __mmask16 r0 = first(rows_left), r1 = first(rows_left - 16);
    const __m512i down = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(static_cast<int>(kNR)));
    for (I q = 0; q < columns; ++q) {
      float* row = c + q * ldc;
      __m512 lo = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, down, &sums[0][q], 4);
      __m512 hi = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, down, &sums[16][q], 4);
      if (add) {
        lo = _mm512_add_ps(_mm512_maskz_loadu_ps(r0, row), lo);
        hi = _mm512_add_ps(_mm512_maskz_loadu_ps(r1, row + 16), hi);
      }
      _mm512_mask_storeu_ps(row, r0, lo);
      if (r1 != 0) _mm512_mask_storeu_ps(row + 16, r1, hi);
    }
    return;
  }
  const __mmask16 m0 = first(columns), m1 = first(columns - 16);
  for (I r = 0; r < std::min(kTR, rows_left); ++r) {
    float* row = c + r * ldc;
    __m512 lo = _mm512_load_ps(sums[r]), hi = _mm512_load_ps(sums[r] + 16);
    if (add) {
      lo = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), lo);
      hi = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), hi);
    }
    _mm512_mask_storeu_ps(row, m0, lo);
    if (m1 != 0) _mm512_mask_storeu_ps(row + 16, m1, hi);
  }
}

// The tile registers' shape, loaded once per GEMM call by the calling thread: 8 tiles of 16 rows of 64
// bytes (palette 1).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(TileConfig) == 64, "the tile configuration is 64 bytes");

PMAPCC_AMX_TARGET void amx_begin() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}
PMAPCC_AMX_TARGET void amx_end() { _tile_release(); }

// c = (accumulate ? c : 0) + a @ b: the first block of depth stores into c unless accumulating, the others add.
// With transposed (AMX only), c holds the product's transpose: element (i, j) at c[j * rows + i]. The tiles
// read left's rounded rows, or on the vector path its pairs, in place of packed a.
PMAPCC_BF16_TARGET void run(Path path, I rows, I cols, I depth, const Left& left, const Operand& b, float* c,
                            bool accumulate, bool transposed, Pair* ap, Pair* bp, const Blocks& bl) {
  for (I j0 = 0; j0 < cols; j0 += bl.nc) {
    const I nc = std::min(bl.nc, cols - j0);
    for (I k0 = 0; k0 < depth; k0 += bl.kc) {
      const I kc = std::min(bl.kc, depth - k0), kpp = padded_pairs(path, kc);
      const bool add = accumulate || k0 > 0;
      pack_b(b, depth, cols, k0, kc, j0, nc, kpp, bp);
      for (I i0 = 0; i0 < rows; i0 += bl.mc) {
        const I mc = std::min(bl.mc, rows - i0);
        const Pair* block = ap;  // pair p of the block's row r at block[r * si + p * sp]
        I si = kpp, sp = 1;
        if (left.rounded != nullptr) {
          block = reinterpret_cast<const Pair*>(left.rounded->bits + i0 * left.rounded->stride + k0);
          si = left.rounded->stride / 2;
        } else if (left.paired != nullptr && path != Path::amx) {
          block = left.paired->pairs + (k0 / 2) * left.paired->stride + i0;
          si = 1;
          sp = left.paired->stride;
        } else if (left.paired != nullptr) {
          pack_a_paired(*left.paired, i0, mc, k0, kc, kpp, ap);
        } else {
          pack_a(path, left.a, rows, depth, i0, mc, k0, kc, kpp, ap);
          if (left.a.transposed && path != Path::amx) {  // pack_a's interleaved layout
            si = 1;
            sp = round_up(mc, 16);
          }
        }
        if (path == Path::amx) {
          for (I i = 0; i < mc; i += kTR)
            for (I j = 0; j < nc; j += kNR)
              amx_tile(kpp, block + i * si, si, bp + (j / kNR) * kpp * kNR,
                       transposed ? c + (j0 + j) * rows + i0 + i : c + (i0 + i) * cols + j0 + j,
                       transposed ? rows : cols, mc - i, std::min(kNR, nc - j), add, transposed);
          continue;
        }
        for (I i = 0; i < mc; i += kMR) {
          const I mr = std::min(kMR, mc - i);
          for (I j = 0; j < nc; j += kNR)
            kTiles[mr](kpp, block + i * si, si, sp, bp + (j / kNR) * kpp * kNR, c + (i0 + i) * cols + j0 + j, cols,
                       std::min(kNR, nc - j), add);
        }
      }
    }
  }
}

// The fma path: the same blocks, rounded to bf16 but packed as floats (the rounded value, low 16 bits zero),
// and summed by fp32 FMAs, one chain per element of c in depth order within a block.
constexpr I kFR = 12;  // rows of the fma path's register tile: 12 x 32 sums in 24 zmm registers

// b's block as panels of kNR columns of floats: panel q holds depth row k at out + (q * kc + k) * kNR.
PMAPCC_BF16_TARGET void pack_b_fma(const Operand& b, I depth, I cols, I k0, I kc, I j0, I nc, float* out) {
  const I panels = (nc + kNR - 1) / kNR;
  for (I q = 0; q < panels; ++q) {
    float* panel = out + q * kc * kNR;
    const I width = std::min(kNR, nc - q * kNR);
    if (!b.transposed) {  // b[k][j] at data[k * cols + j]
      for (I k = 0; k < kc; ++k) {
        const float* row = b.data + (k0 + k) * cols + j0 + q * kNR;
        _mm512_storeu_ps(panel + k * kNR, rounded16(row, width));
        _mm512_storeu_ps(panel + k * kNR + 16, width > 16 ? rounded16(row + 16, width - 16) : _mm512_setzero_ps());
      }
      continue;
    }
    // b[k][j] at data[j * depth + k]: each column's depth run is contiguous. 16 depth values of each of 16
    // columns are rounded into 16 vectors, which a transpose turns into 16 rows of the panel.
    if (width < kNR) std::memset(panel, 0, static_cast<std::size_t>(kc * kNR) * sizeof(float));
    for (I g = 0; g < width; g += 16) {
      const float* cols16 = b.data + (j0 + q * kNR + g) * depth + k0;
      for (I k = 0; k < kc; k += 16) {
        const I n = std::min<I>(16, kc - k);
        __m512i v[16];
        for (I c = 0; c < 16; ++c)
          v[c] = g + c < width ? _mm512_castps_si512(rounded16(cols16 + c * depth + k, n)) : _mm512_setzero_si512();
        transpose16(v);
        for (I r = 0; r < n; ++r) _mm512_storeu_ps(panel + (k + r) * kNR + g, _mm512_castsi512_ps(v[r]));
      }
    }
  }
}

// a's block (rows [i0, i0 + mc), depth [k0, k0 + kc)) rounded into floats: element (i, k) at out[i * kc + k],
// or for a transposed a at out[k * stride + i] with stride = mc rounded up to 16 (both read in a's own order).
// left's rounded rows or pairs are rounded already: widened (pairs into the transposed layout).
PMAPCC_BF16_TARGET void pack_a_fma(const Left& left, I rows, I depth, I i0, I mc, I k0, I kc, float* out) {
  const Operand& a = left.a;
  if (left.paired != nullptr) {
    const I stride = round_up(mc, 16);
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (I k = 0; k < kc; k += 2) {
      const Pair* src = left.paired->pairs + (k0 + k) / 2 * left.paired->stride + i0;
      for (I i = 0; i < mc; i += 16) {
        const __mmask16 m = first(mc - i);
        const __m512i v = _mm512_maskz_loadu_epi32(m, src + i);
        _mm512_mask_storeu_ps(out + k * stride + i, m, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, v, 16)));
        if (k + 1 < kc)
          _mm512_mask_storeu_ps(out + (k + 1) * stride + i, m,
                                _mm512_castsi512_ps(_mm512_maskz_and_epi32(0xFFFF, v, high)));
      }
    }
    return;
  }
  const RoundedRows* rounded = left.rounded;
  if (rounded != nullptr) {
    for (I i = 0; i < mc; ++i) {
      const std::uint16_t* row = rounded->bits + (i0 + i) * rounded->stride + k0;
      for (I k = 0; k < kc; k += 16) {
        const __mmask16 m = first(kc - k);
        const __m512i w = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, row + k));
        _mm512_mask_storeu_ps(out + i * kc + k, m, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, w, 16)));
      }
    }
    return;
  }
  if (a.transposed) {  // a[i][k] at data[k * rows + i]
    const I stride = round_up(mc, 16);
    for (I k = 0; k < kc; ++k) {
      const float* src = a.data + (k0 + k) * rows + i0;
      for (I i = 0; i < mc; i += 16)
        _mm512_mask_storeu_ps(out + k * stride + i, first(mc - i), rounded16(src + i, std::min<I>(16, mc - i)));
    }
    return;
  }
  for (I i = 0; i < mc; ++i) {  // a[i][k] at data[i * depth + k]
    const float* src = a.data + (i0 + i) * depth + k0;
    for (I k = 0; k < kc; k += 16)
      _mm512_mask_storeu_ps(out + i * kc + k, first(kc - k), rounded16(src + k, std::min<I>(16, kc - k)));
  }
}

// c[r][0..columns) += (or, with add false, =) the sums of MR rows of packed a (element k of row r at
// a[r * si + k * sp]) times one panel of packed b, over kc depth rows.
template <int MR>
PMAPCC_BF16_TARGET void fma_tile(I kc, const float* a, I si, I sp, const float* b, float* c, I ldc, I columns,
                                 bool add) {
  __m512 lo[MR], hi[MR];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (I k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(b + k * kNR), b1 = _mm512_loadu_ps(b + k * kNR + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * si + k * sp]);
      lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
      hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
    }
  }
  store_tile<MR>(lo, hi, c, ldc, columns, add);
}

using FmaTile = void (*)(I, const float*, I, I, const float*, float*, I, I, bool);
constexpr FmaTile kFmaTiles[kFR + 1] = {nullptr,      &fma_tile<1>, &fma_tile<2>,  &fma_tile<3>, &fma_tile<4>,
                                        &fma_tile<5>, &fma_tile<6>, &fma_tile<7>,  &fma_tile<8>, &fma_tile<9>,
                                        &fma_tile<10>, &fma_tile<11>, &fma_tile<12>};

// run() on the fma path.
PMAPCC_BF16_TARGET void run_fma(I rows, I cols, I depth, const Left& left, const Operand& b, float* c, bool accumulate,
                                float* ap, float* bp, const Blocks& bl) {
  // pack_a_fma's transposed layout
  const bool across = left.paired != nullptr || (left.rounded == nullptr && left.a.transposed);
  for (I j0 = 0; j0 < cols; j0 += bl.nc) {
    const I nc = std::min(bl.nc, cols - j0);
    for (I k0 = 0; k0 < depth; k0 += bl.kc) {
      const I kc = std::min(bl.kc, depth - k0);
      const bool add = accumulate || k0 > 0;
      pack_b_fma(b, depth, cols, k0, kc, j0, nc, bp);
      for (I i0 = 0; i0 < rows; i0 += bl.mc) {
        const I mc = std::min(bl.mc, rows - i0);
        pack_a_fma(left, rows, depth, i0, mc, k0, kc, ap);
        const I si = across ? 1 : kc, sp = across ? round_up(mc, 16) : 1;
        for (I i = 0; i < mc; i += kFR) {
          const I mr = std::min(kFR, mc - i);
          for (I j = 0; j < nc; j += kNR)
            kFmaTiles[mr](kc, ap + i * si, si, sp, bp + (j / kNR) * kc * kNR, c + (i0 + i) * cols + j0 + j, cols,
                          std::min(kNR, nc - j), add);
        }
      }
    }
  }
}

// Asks Linux once for this process's permission to use the AMX tile data (ARCH_REQ_XCOMP_PERM).
bool amx_permitted() noexcept {
#if defined(__linux__) && defined(SYS_arch_prctl)
  static const bool yes = [] {
    constexpr long kRequestPermission = 0x1023, kTileData = 18;
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return yes;
#else
  return false;
#endif
}

bool vector_supported() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return yes;
#else
  return false;
#endif
}

}  // namespace

std::uint16_t round_bits(float x) noexcept {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t exponent = u & 0x7F800000u, mantissa = u & 0x007FFFFFu;
  if (exponent == 0x7F800000u && mantissa != 0) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN
  if (exponent == 0) return static_cast<std::uint16_t>((u >> 16) & 0x8000u);  // zero or subnormal: signed zero
  u += 0x7FFFu + ((u >> 16) & 1u);                                          // to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

float widen(std::uint16_t bits) noexcept {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float x = 0;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

void round_bits_into(const float* x, std::size_t n, std::uint16_t* bits) noexcept {
  if (vector_supported()) {
    round_bits_vector(x, n, bits);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) bits[i] = round_bits(x[i]);
}

std::int64_t rounded_stride(std::int64_t depth) noexcept { return round_up(std::max<I>(depth, 1), 2 * kTK); }
std::int64_t rounded_rows(std::int64_t rows) noexcept { return round_up(std::max<I>(rows, 1), kTR); }

void round_into(const float* x, std::size_t n, float* out) noexcept {
  if (vector_supported()) {
    round_vector(x, n, out);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) out[i] = round(x[i]);
}

void pair_rows_into(const float* r0, const float* r1, std::size_t n, std::uint32_t* out) noexcept {
  if (vector_supported()) {
    pair_rows_vector(r0, r1, n, out);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const Pair high = r1 == nullptr ? Pair{0} : static_cast<Pair>(round_bits(r1[i])) << 16;
    out[i] = static_cast<Pair>(round_bits(r0[i])) | high;
  }
}

bool supported(Path path) noexcept {
  if (!vector_supported()) return false;
  if (path != Path::amx) return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE (read directly: not every compiler's
  // __builtin_cpu_supports knows them).
  static const bool amx = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    return (d >> 22 & 1u) != 0 && (d >> 24 & 1u) != 0 && amx_permitted();
  }();
  return amx;
#else
  return false;
#endif
}

bool supported() noexcept { return supported(Path::avx512); }

Path best_path() noexcept {
  if (supported(Path::amx)) return Path::amx;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // vdpbf16ps's rate against the fp32 FMA's (bench_peak, one core): half on Intel's Xeons (84.7 against
  // 169.1 GFLOP/s on the Xeon of 2026-11-30), twice on AMD's EPYC (448.4 against 223.0).
  static const bool intel = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
    return b == 0x756E6547u && d == 0x49656E69u && c == 0x6C65746Eu;  // "GenuineIntel"
  }();
  if (intel) return Path::fma;
#endif
  return Path::avx512;
}

const char* name(Path path) noexcept {
  switch (path) {
    case Path::amx: return "amx";
    case Path::avx512: return "avx512";
    case Path::fma: return "fma";
  }
  return "?";
}

Path path_named(const std::string& want, const char* source) {
  if (want.empty() || want == "auto") return best_path();
  for (Path p : {Path::amx, Path::avx512, Path::fma}) {
    if (want != name(p)) continue;
    if (!supported(p))
      throw ValueError(std::string(source) + "=" + want + ": this CPU (or its kernel) does not run the bf16 GEMM's " +
                       want + " path" + (supported() ? "" : " (it lacks AVX512_BF16)"));
    return p;
  }
  throw ValueError(std::string(source) + ": unknown bf16 GEMM path '" + want + "' (expected amx, avx512, fma or auto)");
}

Path active_path() {
  static const Path chosen = [] {
    const char* env = std::getenv("PMAPCC_BF16_PATH");
    return path_named(env == nullptr ? "" : env, "PMAPCC_BF16_PATH");
  }();
  return chosen;
}

std::size_t gemm_pack_bytes(std::int64_t rows, std::int64_t cols, std::int64_t depth) noexcept {
  if (rows <= 0 || cols <= 0 || depth <= 0) return 0;
  // Either order of rows and columns: gemm may run the transposed product.
  const Blocks bl = blocks(rows, cols, depth), swapped = blocks(cols, rows, depth);
  return std::max(a_bytes(bl) + b_bytes(bl), a_bytes(swapped) + b_bytes(swapped)) + kAlign;
}

namespace {

// gemm() for any form of a.
void checked_gemm(Path path, I rows, I cols, I depth, const Left& left, const Operand& b, float* c, bool accumulate,
                  void* pack, std::size_t pack_bytes) {
  const RoundedRows* rounded = left.rounded;
  if (!supported(path))
    throw ValueError(path == Path::amx ? std::string("bf16 GEMM: this CPU (or its kernel) does not let pmapcc use AMX "
                                                     "tiles (AMX-TILE, AMX-BF16), which the amx path needs")
                                       : std::string("bf16 GEMM: this CPU lacks AVX512_BF16 (with AVX512F, BW and VL), "
                                                     "which bf16 precision needs"));
  if (rows < 0 || cols < 0 || depth < 0)
    throw ValueError("bf16 GEMM: negative shape " + std::to_string(rows) + " x " + std::to_string(cols) + " x " +
                     std::to_string(depth));
  if (rounded != nullptr && (rounded->bits == nullptr || rounded->stride < rounded_stride(depth) ||
                             rounded->stride % (2 * kTK) != 0))
    throw ValueError("bf16 GEMM: rounded rows need bits and a stride that is a multiple of " +
                     std::to_string(2 * kTK) + " and at least " + std::to_string(rounded_stride(depth)) + " for depth " +
                     std::to_string(depth) + "; got stride " + std::to_string(rounded->stride));
  if (left.paired != nullptr && (left.paired->pairs == nullptr || left.paired->stride < rows))
    throw ValueError("bf16 GEMM: the pairs of a transposed a need pairs and a stride of at least its " +
                     std::to_string(rows) + " rows; got stride " + std::to_string(left.paired->stride));
  const std::size_t need = gemm_pack_bytes(rows, cols, depth);
  if (need > 0 && (pack == nullptr || pack_bytes < need))
    throw ValueError("bf16 GEMM: the packing space holds " + std::to_string(pack == nullptr ? 0 : pack_bytes) +
                     " bytes; " + std::to_string(rows) + " x " + std::to_string(cols) + " x " + std::to_string(depth) +
                     " needs " + std::to_string(need));
  if (need == 0) {  // an empty product: c stays, or is zeroed
    if (!accumulate) std::fill_n(c, rows * cols, 0.0f);
    return;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(pack);
  auto* base = reinterpret_cast<unsigned char*>((address + kAlign - 1) / kAlign * kAlign);
  if (path == Path::fma) {
    const Blocks bl = blocks(rows, cols, depth);
    auto* ap = reinterpret_cast<float*>(base);
    run_fma(rows, cols, depth, left, b, c, accumulate, ap, reinterpret_cast<float*>(base + a_bytes(bl)), bl);
    return;
  }
  // A transposed a (a weight gradient: x^T @ dy) reaches the AMX tiles' row layout only through a scatter
  // (pack_a). When b has fewer columns than a has rows, the transposed product c^T = b^T @ a^T scatters the
  // smaller operand instead, and its tiles are written transposed.
  const Operand& a = left.a;
  const bool swap = path == Path::amx && rounded == nullptr && left.paired == nullptr && a.transposed &&
                    !b.transposed && cols < rows;
  const Blocks bl = swap ? blocks(cols, rows, depth) : blocks(rows, cols, depth);
  auto* ap = reinterpret_cast<Pair*>(base);
  auto* bp = reinterpret_cast<Pair*>(base + a_bytes(bl));
  if (path == Path::amx) amx_begin();
  if (swap) {
    run(path, cols, rows, depth, Left{Operand{b.data, true}}, Operand{a.data, false}, c, accumulate, true, ap, bp, bl);
  } else {
    run(path, rows, cols, depth, left, b, c, accumulate, false, ap, bp, bl);
  }
  if (path == Path::amx) amx_end();
}

}  // namespace

namespace {

// A product over cpu::threads() threads (kernels/cpu/shared/cpu_threads.h), by ranges of whole row tiles (kTR rows; the
// AMX path's row blocks, kMC, there); each range runs part(first, count, packing space, its bytes): the
// caller's space on the calling thread, a helper's own on a helper. A pack too small for the whole fails as
// the whole would, before any range runs.
template <class Part>
void split(Path path, I rows, I cols, I depth, void* pack, std::size_t pack_bytes, const Part& part) {
  if (pack == nullptr || pack_bytes < gemm_pack_bytes(rows, cols, depth)) {
    part(0, rows, pack, pack_bytes);
    return;
  }
  const I align = path == Path::amx ? kMC : kTR;  // RoundedRows' ranges read up to a whole kTR past their rows
  cpu::detail::split_rows(rows, cols, depth, align, [&](I first, I count, bool helper) {
    if (!helper) return part(first, count, pack, pack_bytes);
    const std::size_t bytes = gemm_pack_bytes(count, cols, depth);
    part(first, count, cpu::detail::helper_scratch(bytes), bytes);
  });
}

}  // namespace

void gemm(Path path, std::int64_t rows, std::int64_t cols, std::int64_t depth, Operand a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes) {
  checked_gemm(path, rows, cols, depth, Left{a}, b, c, accumulate, pack, pack_bytes);
}

void gemm(std::int64_t rows, std::int64_t cols, std::int64_t depth, Operand a, Operand b, float* c, bool accumulate,
          void* pack, std::size_t pack_bytes) {
  const Path path = active_path();
  if (a.transposed || a.data == nullptr) {  // rows of c are columns of a's buffer: not split
    gemm(path, rows, cols, depth, a, b, c, accumulate, pack, pack_bytes);
    return;
  }
  split(path, rows, cols, depth, pack, pack_bytes, [&](I first, I count, void* space, std::size_t bytes) {
    gemm(path, count, cols, depth, Operand{a.data + first * depth}, b, c + first * cols, accumulate, space, bytes);
  });
}

void gemm(Path path, std::int64_t rows, std::int64_t cols, std::int64_t depth, RoundedRows a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes) {
  checked_gemm(path, rows, cols, depth, Left{Operand{nullptr}, &a}, b, c, accumulate, pack, pack_bytes);
}

void gemm(std::int64_t rows, std::int64_t cols, std::int64_t depth, RoundedRows a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes) {
  const Path path = active_path();
  if (a.bits == nullptr) {
    gemm(path, rows, cols, depth, a, b, c, accumulate, pack, pack_bytes);
    return;
  }
  split(path, rows, cols, depth, pack, pack_bytes, [&](I first, I count, void* space, std::size_t bytes) {
    gemm(path, count, cols, depth, RoundedRows{a.bits + first * a.stride, a.stride}, b, c + first * cols, accumulate,
         space, bytes);
  });
}

void gemm(Path path, std::int64_t rows, std::int64_t cols, std::int64_t depth, PairedTranspose a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes) {
  checked_gemm(path, rows, cols, depth, Left{Operand{nullptr}, nullptr, &a}, b, c, accumulate, pack, pack_bytes);
}

void gemm(std::int64_t rows, std::int64_t cols, std::int64_t depth, PairedTranspose a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes) {
  const Path path = active_path();
  if (a.pairs == nullptr || a.stride < rows) {
    gemm(path, rows, cols, depth, a, b, c, accumulate, pack, pack_bytes);
    return;
  }
  split(path, rows, cols, depth, pack, pack_bytes, [&](I first, I count, void* space, std::size_t bytes) {
    gemm(path, count, cols, depth, PairedTranspose{a.pairs + first, a.stride}, b, c + first * cols, accumulate, space,
         bytes);
  });
}

}  // namespace pmap::kernels::bf16
