// CUDA LayoutOps: strided copies and reductions, max pooling, one item per output element (per input
// element for max pooling's gradient, which gathers over the windows: no atomics). Each element is
// kernels/layout_math.h's, as the CPU computes it, so the results are bitwise the CPU ops'.
#include <pmapcc/kernels/cuda/backend.h>
#include <pmapcc/kernels/layout_math.h>

namespace pmap::kernels::gpu {
namespace {

struct Copy {
  StridedCopyParams p;
  const float* src;
  float* dst;
  PMAPCC_HD void operator()(std::size_t i) const {
    std::int64_t s = 0, d = 0;
    strided_copy_offsets(p, i, s, d);
    dst[d] = src[s];
  }
};

struct Reduce {
  ReduceOp op;
  StridedReduceParams p;
  const float* x;
  float* y;
  PMAPCC_HD void operator()(std::size_t o) const { y[o] = strided_reduce_value(op, p, x, o); }
};

struct PoolForward {
  MaxPoolParams p;
  MaxPoolGeometry g;
  const float* x;
  float* y;
  PMAPCC_HD void operator()(std::size_t o) const { y[o] = max_pool_value(p, g, x, o); }
};

struct PoolBackward {
  MaxPoolParams p;
  MaxPoolGeometry g;
  const float* x;
  const float* dy;
  float* dx;
  PMAPCC_HD void operator()(std::size_t i) const { dx[i] = max_pool_grad_value(p, g, x, dy, i); }
};

}  // namespace

void CudaLayoutOps::strided_copy(StridedCopyParams p, const float* src, float* dst) const {
  validate(p);
  const std::size_t items = extent_count(p.ndim, p.dims);
  if (items == 0) return;
  require(src, "strided_copy", "src");
  require(dst, "strided_copy", "dst");
  ex_.launch(Copy{p, src, dst}, items);
}

void CudaLayoutOps::strided_reduce(ReduceOp op, StridedReduceParams p, const float* x, float* y) const {
  validate(p);
  const std::size_t outputs = extent_count(p.outer_ndim, p.outer_dims);
  if (outputs == 0) return;
  require(x, to_string(op), "x");
  require(y, to_string(op), "y");
  ex_.launch(Reduce{op, p, x, y}, outputs);
}

void CudaLayoutOps::max_pool_forward(MaxPoolParams p, const float* x, float* y) const {
  const MaxPoolGeometry g = max_pool_geometry(p);
  require(x, "max_pool_forward", "x");
  require(y, "max_pool_forward", "y");
  ex_.launch(PoolForward{p, g, x, y},
             static_cast<std::size_t>(p.batch) * g.out_height * g.out_width * static_cast<std::size_t>(p.channels));
}

void CudaLayoutOps::max_pool_backward(MaxPoolParams p, const float* x, const float* dy, float* dx) const {
  const MaxPoolGeometry g = max_pool_geometry(p);
  require(x, "max_pool_backward", "x");
  require(dy, "max_pool_backward", "dy");
  require(dx, "max_pool_backward", "dx");
  ex_.launch(PoolBackward{p, g, x, dy, dx},
             static_cast<std::size_t>(p.batch) * p.height * p.width * static_cast<std::size_t>(p.channels));
}

}  // namespace pmap::kernels::gpu
