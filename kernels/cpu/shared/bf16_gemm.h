// bf16 products summed in fp32 on the CPU (AMX, AVX512_BF16's vdpbf16ps, or fp32 FMAs on the rounded
// operands; Path below): the GEMM of bf16 mixed precision.
// Inputs and outputs are fp32 buffers; each operand element is rounded to bf16 as it is packed, the
// products (exact in fp32) are summed in fp32, and the result is added to or stored into c. Internal to the
// kernels; the ops choose it by their precision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pmap::kernels::bf16 {

// float -> bf16 bits as AVX512_BF16's conversion instructions give them: round to nearest, ties to even;
// a NaN stays a quiet NaN of its sign; a subnormal becomes a zero of its sign (those instructions treat
// subnormal inputs as zero). widen() is exact.
std::uint16_t round_bits(float x) noexcept;
float widen(std::uint16_t bits) noexcept;
inline float round(float x) noexcept { return widen(round_bits(x)); }
// bits[i] = round_bits(x[i]) for i below n, vectorised where this CPU has AVX512_BF16.
void round_bits_into(const float* x, std::size_t n, std::uint16_t* bits) noexcept;
// out[i] = round(x[i]) for i below n (out may be x): operands of bf16 products that a kernel other than gemm()
// takes, rounded as gemm() rounds them. Vectorised where this CPU has AVX512_BF16, the same bits either way.
void round_into(const float* x, std::size_t n, float* out) noexcept;

// How the products are computed: AMX tiles (tdpbf16ps, 16 x 16 sums of 32 products each), AVX-512 vectors
// (avx512: vdpbf16ps, 2 products per lane per instruction), or AVX-512 fp32 FMAs on the rounded operands
// widened back to floats (fma: 1 product per lane per instruction, for CPUs whose vdpbf16ps does fewer
// products a second than their FMAs). All round the operands the same way and sum the exact products in fp32; the
// order of the sums differs, so their results differ by fp32 rounding.
enum class Path { amx, avx512, fma };

// Whether this CPU runs the bf16 GEMM on that path: AVX512F, AVX512BW, AVX512VL and AVX512_BF16 (its
// rounding instruction, on every path), and for AMX also AMX-TILE and AMX-BF16 with the kernel's permission
// to use the tile registers (asked for once).
bool supported(Path path) noexcept;
// Whether any path runs here.
bool supported() noexcept;
// The fastest path here: AMX where it runs; else fma on Intel CPUs (their vdpbf16ps has half the rate of
// two fp32 FMAs) and avx512 on the others (AMD's has twice it).
Path best_path() noexcept;
// The path of that name (name()), or best_path() for "auto" or "". Throws pmap::ValueError naming source for
// another name or a path this CPU does not run.
Path path_named(const std::string& name, const char* source);
// The path gemm() takes: path_named(PMAPCC_BF16_PATH), read once (a refusal throws again on later calls).
Path active_path();
const char* name(Path path) noexcept;

// An operand: a row-major buffer holding the matrix itself, or (transposed) its transpose.
struct Operand {
  const float* data;
  bool transposed = false;
};

// A left operand already rounded (by the caller, with round_bits_into), in the row layout the GEMM packs a
// into, so that gemm() skips that pass: element (r, k) at bits[r * stride + k]; stride = rounded_stride(depth)
// with zeros from depth up to it; rounded_rows(rows) rows readable (the rows past `rows` any value: their sums
// are not stored).
struct RoundedRows {
  const std::uint16_t* bits;
  std::int64_t stride;
};
std::int64_t rounded_stride(std::int64_t depth) noexcept;
std::int64_t rounded_rows(std::int64_t rows) noexcept;

// A left operand a (rows, depth) given by its transpose, rounded by the caller and paired along the depth (a
// weight gradient's x^T, written so by im2col): pair p of row r at pairs[p * stride + r], holding the bf16 of
// a(r, 2p) in its low half and of a(r, 2p + 1) in its high half (zero past the depth); stride >= rows,
// (depth + 1) / 2 rows of pairs. pair_rows_into writes one row of pairs.
struct PairedTranspose {
  const std::uint32_t* pairs;
  std::int64_t stride;
};
// out[i] = round_bits(r0[i]) | round_bits(r1[i]) << 16 for i below n (r1 null: the high halves zero).
void pair_rows_into(const float* r0, const float* r1, std::size_t n, std::uint32_t* out) noexcept;

// Bytes of packing space gemm needs for c (rows, cols) = a (rows, depth) @ b (depth, cols). A bound that
// only grows with each dimension, so a workspace sized for one product serves every smaller one.
std::size_t gemm_pack_bytes(std::int64_t rows, std::int64_t cols, std::int64_t depth) noexcept;

// c (rows, cols), row-major, contiguous = round(a) @ round(b), or += with accumulate, on active_path(). Each
// element of c is a sum in fp32 (products exact; the order fixed by the path and the shapes alone, so results
// are bitwise the same run after run) added to c's previous value (accumulate) or to zero. pack: at least
// gemm_pack_bytes(rows, cols, depth) bytes, any contents, 64-byte aligned is best. Throws pmap::ValueError
// when this CPU lacks AVX512_BF16 (supported()), for a bad PMAPCC_BF16_PATH, or when pack is null or too
// small for the shapes.
void gemm(std::int64_t rows, std::int64_t cols, std::int64_t depth, Operand a, Operand b, float* c, bool accumulate,
          void* pack, std::size_t pack_bytes);
// The same on a given path (tests and benchmarks compare them); throws pmap::ValueError where it does not
// run (supported(path)).
void gemm(Path path, std::int64_t rows, std::int64_t cols, std::int64_t depth, Operand a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes);
// The same with a rounded left operand: the same bits as gemm() on the floats it was rounded from. Throws
// pmap::ValueError also for null bits or a stride below rounded_stride(depth) or not a multiple of 32.
void gemm(std::int64_t rows, std::int64_t cols, std::int64_t depth, RoundedRows a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes);
void gemm(Path path, std::int64_t rows, std::int64_t cols, std::int64_t depth, RoundedRows a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes);
// The same with a transposed left operand given as its pairs: the same bits as gemm() on the transposed
// floats it was rounded from (Operand{x, true}). Throws pmap::ValueError also for null pairs or a stride below
// rows.
void gemm(std::int64_t rows, std::int64_t cols, std::int64_t depth, PairedTranspose a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes);
void gemm(Path path, std::int64_t rows, std::int64_t cols, std::int64_t depth, PairedTranspose a, Operand b, float* c,
          bool accumulate, void* pack, std::size_t pack_bytes);

}  // namespace pmap::kernels::bf16
