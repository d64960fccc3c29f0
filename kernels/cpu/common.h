// Internal to the CPU kernels: Eigen views of raw row-major buffers and helpers the op files share.
// Host .cpp only (Eigen does not build cleanly under nvcc).
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <vector>

#include <pmapcc/kernels/cpu/ops.h>

namespace PMAPCC_CPU_NS::detail {

using Index = Eigen::Index;
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixView = Eigen::Map<RowMatrix>;             // (rows, cols) over a float*, row-major, contiguous
using ConstMatrixView = Eigen::Map<const RowMatrix>;  // the same over a const float*

using pmap::kernels::require;  // kernels/ops.h

// out (cols) = column sums of a (rows, cols), each accumulated in double over rows in order, then rounded.
void column_sums(const float* a, Index rows, Index cols, float* out);

// out (rows, cols): every row = b (cols), or zeros when b is nullptr. The GEMM then adds onto it.
void fill_rows(const float* b, Index rows, Index cols, float* out);

// out (count) = max(out, 0) in place, as UnaryOp::relu (NaN stays NaN): a ReLU fused into an op's output.
void relu_in_place(float* out, Index count);

// The caller's workspace, or one allocated for this call when the caller passed none.
class Workspace {
 public:
  Workspace(void* given, std::size_t bytes) : base_(given) {
    if (base_ == nullptr) {
      owned_.resize(bytes);
      base_ = owned_.data();
    }
  }
  void* get() const { return base_; }

 private:
  void* base_;
  std::vector<unsigned char> owned_;
};

// Carves float buffers, 64-byte aligned, out of a caller's workspace.
class Scratch {
 public:
  explicit Scratch(void* base) : next_(static_cast<unsigned char*>(base)) {}
  // The next buffer of floats, at the next 64-byte boundary: a workspace needs kAlign spare bytes per take.
  float* take(std::size_t floats);
  static constexpr std::size_t kAlign = 64;

 private:
  unsigned char* next_;
};

}  // namespace PMAPCC_CPU_NS::detail
