// The bias-and-ReLU epilogue and deterministic column sums (bias gradients) for conv2d and dense: one
// item per output element, no cooperation between threads, so a host run checks them exactly.
#include <pmapcc/kernels/cuda/linear.h>

#include <cstdint>

#include <pmap/error.h>

namespace pmap::kernels::gpu {
namespace {

constexpr std::size_t kChunkRows = 256;  // rows summed by one item of the first pass
// Elements of a row-major operand of rows x cols per batch entry, over the batch.
std::size_t operand_span(long long rows, long long cols, long long stride, int batch) {
  return static_cast<std::size_t>(static_cast<long long>(batch - 1) * stride + rows * cols);
}

// out[i] = bf16_bits(in[i]): one item per element.
struct RoundBf16 {
  const float* in;
  std::uint16_t* out;
  PMAPCC_HD void operator()(std::size_t i) const { out[i] = bf16_bits(in[i]); }
};

// y[i] += b[member, column]; then ReLU (x < 0 ? 0 : x, so NaN passes, as the CPU ops).
struct BiasRelu {
  std::size_t per_member;  // rows * cols
  int cols;
  const float* b;
  bool relu;
  float* y;
  PMAPCC_HD void operator()(std::size_t i) const {
    float v = y[i];
    if (b != nullptr) v = v + b[(i / per_member) * static_cast<std::size_t>(cols) + i % static_cast<std::size_t>(cols)];
    if (relu) v = v < 0.0f ? 0.0f : v;
    y[i] = v;
  }
};

// Item (member, chunk, column), columns fastest (adjacent items read adjacent columns of a row): the sum of
// the chunk's rows in order, in double. One chunk: the float result; several: a double partial.
struct ColumnChunks {
  std::size_t rows;
  std::size_t chunks;
  int cols;
  const float* a;
  float* out;
  double* partial;
  PMAPCC_HD void operator()(std::size_t i) const {
    const std::size_t c = i % static_cast<std::size_t>(cols);
    const std::size_t chunk = (i / static_cast<std::size_t>(cols)) % chunks;
    const std::size_t m = i / (static_cast<std::size_t>(cols) * chunks);
    const std::size_t first = chunks == 1 ? 0 : chunk * kChunkRows;
    const std::size_t last = chunks == 1 ? rows : (first + kChunkRows < rows ? first + kChunkRows : rows);
    const float* am = a + m * rows * static_cast<std::size_t>(cols) + c;
    double sum = 0.0;
    for (std::size_t r = first; r < last; ++r) sum += am[r * static_cast<std::size_t>(cols)];
    if (chunks == 1) {
      out[m * static_cast<std::size_t>(cols) + c] = static_cast<float>(sum);
    } else {
      partial[i] = sum;  // (member, chunk, column), chunks of a column strided by cols
    }
  }
};

// Item (member, column): the chunks' partial sums of the column, in chunk order.
struct ColumnFinish {
  std::size_t chunks;
  int cols;
  const double* partial;
  float* out;
  PMAPCC_HD void operator()(std::size_t i) const {
    const std::size_t c = i % static_cast<std::size_t>(cols), m = i / static_cast<std::size_t>(cols);
    const double* pm = partial + m * chunks * static_cast<std::size_t>(cols) + c;
    double sum = 0.0;
    for (std::size_t k = 0; k < chunks; ++k) sum += pm[k * static_cast<std::size_t>(cols)];
    out[i] = static_cast<float>(sum);
  }
};

std::size_t chunks_for(std::size_t rows) { return rows <= kChunkRows ? 1 : (rows + kChunkRows - 1) / kChunkRows; }

}  // namespace

std::size_t bf16_operand_bytes(const Gemm& g) {
  if (!g.bf16 || g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return 0;
  const std::size_t a = operand_span(g.m, g.k, g.stride_a, g.batch), b = operand_span(g.k, g.n, g.stride_b, g.batch);
  return align_up(a * sizeof(std::uint16_t)) + align_up(b * sizeof(std::uint16_t)) + kWorkspaceAlign;
}

void product(const Exec& ex, const Gemm& g, const float* a, const float* b, float* c, void* bf16_space) {
  if (!g.bf16) return ex.gemm(g, a, b, c);
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return;
  if (bf16_space == nullptr) throw ValueError("a bf16 product needs bf16_operand_bytes(g) bytes of space, got none");
  const std::size_t a_n = operand_span(g.m, g.k, g.stride_a, g.batch);
  const std::size_t b_n = operand_span(g.k, g.n, g.stride_b, g.batch);
  const std::uintptr_t base = align_up(bf16_space);
  auto* a16 = reinterpret_cast<std::uint16_t*>(base);
  auto* b16 = reinterpret_cast<std::uint16_t*>(base + align_up(a_n * sizeof(std::uint16_t)));
  ex.launch(RoundBf16{a, a16}, a_n);
  ex.launch(RoundBf16{b, b16}, b_n);
  ex.gemm(g, a16, b16, c);
}

void bias_relu(const Exec& ex, int members, std::size_t rows, int cols, const float* b, bool relu, float* y) {
  if (b == nullptr && !relu) return;
  const std::size_t per_member = rows * static_cast<std::size_t>(cols);
  ex.launch(BiasRelu{per_member, cols, b, relu, y}, static_cast<std::size_t>(members) * per_member);
}

std::size_t column_sum_partials(int members, std::size_t rows, int cols) {
  const std::size_t chunks = chunks_for(rows);
  return chunks == 1 ? 0 : static_cast<std::size_t>(members) * chunks * static_cast<std::size_t>(cols);
}

void column_sums(const Exec& ex, int members, std::size_t rows, int cols, const float* a, float* out,
                 double* partial) {
  const std::size_t chunks = partial == nullptr ? 1 : chunks_for(rows);  // no partials: one pass per column
  const std::size_t outputs = static_cast<std::size_t>(members) * static_cast<std::size_t>(cols);
  ex.launch(ColumnChunks{rows, chunks, cols, a, out, partial}, outputs * chunks);
  if (chunks > 1) ex.launch(ColumnFinish{chunks, cols, partial, out}, outputs);
}

}  // namespace pmap::kernels::gpu
