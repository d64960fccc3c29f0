// Helpers shared by the CPU op files: argument checks, bias broadcast and reduction, workspace carving.
#include <pmapcc/kernels/cpu/common.h>

#include <pmap/error.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace PMAPCC_CPU_NS::detail {

void column_sums(const float* a, Index rows, Index cols, float* out) {
  constexpr Index kBlock = 256;  // columns per pass: the double accumulators stay on the stack
  double acc[kBlock];
  for (Index c0 = 0; c0 < cols; c0 += kBlock) {
    const Index width = std::min(kBlock, cols - c0);
    std::fill_n(acc, width, 0.0);
    for (Index r = 0; r < rows; ++r) {
      const float* row = a + r * cols + c0;
      for (Index c = 0; c < width; ++c) acc[c] += row[c];
    }
    for (Index c = 0; c < width; ++c) out[c0 + c] = static_cast<float>(acc[c]);
  }
}

void fill_rows(const float* b, Index rows, Index cols, float* out) {
  for (Index r = 0; r < rows; ++r) {
    if (b == nullptr) {
      std::fill_n(out + r * cols, cols, 0.0f);
    } else {
      std::copy_n(b, cols, out + r * cols);
    }
  }
}

void relu_in_place(float* out, Index count) {
  for (Index i = 0; i < count; ++i) out[i] = out[i] < 0.0f ? 0.0f : out[i];
}

float* Scratch::take(std::size_t floats) {
  const auto address = reinterpret_cast<std::uintptr_t>(next_);
  const std::uintptr_t aligned = (address + kAlign - 1) & ~static_cast<std::uintptr_t>(kAlign - 1);
  auto* start = reinterpret_cast<float*>(aligned);
  next_ = reinterpret_cast<unsigned char*>(start + floats);
  return start;
}

}  // namespace PMAPCC_CPU_NS::detail
