// CPU LayoutOps: strided copies and reductions, max pooling. Plain loops over the output elements, each
// computed by kernels/layout_math.h as the CUDA kernels compute it, so both give the same bits (a copy's
// contiguous runs are copied whole: the same elements).
#include <algorithm>

#include <pmapcc/kernels/layout_math.h>
#include <pmapcc/kernels/ops.h>

#include <pmapcc/kernels/cpu/ops.h>

namespace PMAPCC_CPU_NS {

void LayoutOpsImpl::strided_copy(StridedCopyParams p, const float* src, float* dst) const {
  validate(p);
  const std::size_t items = extent_count(p.ndim, p.dims);
  if (items == 0) return;
  require(src, "strided_copy", "src");
  require(dst, "strided_copy", "dst");
  // The innermost axes both sides hold contiguously (each stride the next axis's times its extent, the last
  // 1): one run of `run` elements per index of the axes before them, copied whole (slices along a leading
  // axis, concatenations, the members' parts).
  int outer = p.ndim;
  std::int64_t run = 1;
  while (outer > 0 && p.src_strides[outer - 1] == run && p.dst_strides[outer - 1] == run) run *= p.dims[--outer];
  if (run > 1) {
    StridedCopyParams q = p;
    q.ndim = outer;
    const std::size_t runs = extent_count(outer, p.dims);
    for (std::size_t i = 0; i < runs; ++i) {
      std::int64_t s = 0, d = 0;
      strided_copy_offsets(q, i, s, d);
      std::copy_n(src + s, run, dst + d);
    }
    return;
  }
  for (std::size_t i = 0; i < items; ++i) {
    std::int64_t s = 0, d = 0;
    strided_copy_offsets(p, i, s, d);
    dst[d] = src[s];
  }
}

void LayoutOpsImpl::strided_reduce(ReduceOp op, StridedReduceParams p, const float* x, float* y) const {
  validate(p);
  const std::size_t outputs = extent_count(p.outer_ndim, p.outer_dims);
  if (outputs == 0) return;
  require(x, to_string(op), "x");
  require(y, to_string(op), "y");
  for (std::size_t o = 0; o < outputs; ++o) y[o] = strided_reduce_value(op, p, x, o);
}

void LayoutOpsImpl::max_pool_forward(MaxPoolParams p, const float* x, float* y) const {
  const MaxPoolGeometry g = max_pool_geometry(p);
  require(x, "max_pool_forward", "x");
  require(y, "max_pool_forward", "y");
  const std::size_t outputs =
      static_cast<std::size_t>(p.batch) * g.out_height * g.out_width * static_cast<std::size_t>(p.channels);
  for (std::size_t o = 0; o < outputs; ++o) y[o] = max_pool_value(p, g, x, o);
}

void LayoutOpsImpl::max_pool_backward(MaxPoolParams p, const float* x, const float* dy, float* dx) const {
  const MaxPoolGeometry g = max_pool_geometry(p);
  require(x, "max_pool_backward", "x");
  require(dy, "max_pool_backward", "dy");
  require(dx, "max_pool_backward", "dx");
  const std::size_t inputs =
      static_cast<std::size_t>(p.batch) * p.height * p.width * static_cast<std::size_t>(p.channels);
  for (std::size_t i = 0; i < inputs; ++i) dx[i] = max_pool_grad_value(p, g, x, dy, i);
}

}  // namespace PMAPCC_CPU_NS
