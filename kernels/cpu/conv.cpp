// CPU conv2d forward and backward: im2col a chunk of images, then GEMMs against HWIO weights seen as
// (KH*KW*Cin, Cout) matrices. A shared input is im2col'ed once per chunk for all members. In bf16 the
// forward's im2col writes bf16 rows, and the backward's the pairs of dw's transposed patches, that the bf16
// GEMM reads without packing them again.
#include <algorithm>
#include <cstdint>

#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/cpu/conv_direct.h>
#include <pmapcc/kernels/cpu/gemm.h>
#include <pmapcc/kernels/cpu/im2col.h>
#include <pmapcc/kernels/ops.h>

namespace PMAPCC_CPU_NS {
namespace {

using detail::ConvPlan;
using detail::GemmOperand;
using detail::Index;

// Buffers of one call, carved from its workspace.
struct Buffers {
  float* pack;      // GEMM packing space, plan.pack_floats
  float* col;       // patches of a chunk
  float* dcol;      // patch gradients of a chunk (backward only)
  float* padded;    // direct path: one zero-padded image
  double* db_sum;   // direct path: Cout sums
  float* rounded;   // direct path in bf16: rounded w and dy
};

Buffers carve(const ConvPlan& plan, void* workspace, bool backward) {
  detail::Scratch scratch(workspace);
  Buffers buffers{};
  buffers.pack = scratch.take(plan.pack_floats);
  const std::size_t patches = backward ? plan.bwd_floats / 2 : plan.fwd_floats;
  buffers.col = scratch.take(patches);
  if (backward) buffers.dcol = scratch.take(patches);
  if (plan.direct) {
    buffers.db_sum = reinterpret_cast<double*>(scratch.take(2 * static_cast<std::size_t>(plan.p.out_channels)));
    buffers.padded = scratch.take(plan.padded_floats);
    if (plan.rounded_floats > 0) buffers.rounded = scratch.take(plan.rounded_floats);
  }
  return buffers;
}

// One chunk of images: [first, first + images) of the batch.
struct Chunk {
  int first;
  int images;
};

template <class Fn>
void for_each_chunk(int batch, int per_chunk, Fn&& fn) {
  for (int first = 0; first < batch; first += per_chunk) fn(Chunk{first, std::min(per_chunk, batch - first)});
}

// The chunk's patch matrix (images*OH*OW, KH*KW*Cin): x itself for a 1x1 conv, else im2col'ed into col.
const float* chunk_patches(const ConvPlan& plan, const float* x, int images, float* col) {
  if (plan.identity) return x;
  detail::im2col(plan, x, images, col);
  return col;
}

// y (M, N, OH, OW, Cout), chunk by chunk; per member the bias, then one GEMM adds patches @ w_m.
void forward(const ConvPlan& plan, const float* x, const float* w, const float* b, float* y, Buffers buf) {
  const Conv2dParams& p = plan.p;
  const Index cout = p.out_channels;
  for_each_chunk(p.batch, plan.fwd_images, [&](Chunk c) {
    const Index rows = c.images * plan.out_pixels;
    const float* patches = nullptr;
    auto* rounded = reinterpret_cast<std::uint16_t*>(buf.col);  // plan.rounded_patches: the patches' bf16 rows
    for (int m = 0; m < p.members; ++m) {
      if (m == 0 || !p.shared_input) {
        const float* chunk_x = x + ((p.shared_input ? 0 : Index{m} * p.batch) + c.first) * plan.in_image;
        if (plan.rounded_patches) {
          detail::im2col_rounded(plan, chunk_x, c.images, rounded);
        } else {
          patches = chunk_patches(plan, chunk_x, c.images, buf.col);
        }
      }
      float* out = y + (Index{m} * p.batch + c.first) * plan.out_image;
      detail::fill_rows(b == nullptr ? nullptr : b + m * cout, rows, cout, out);
      const float* wm = w + m * plan.patch * cout;
      if (plan.rounded_patches) {  // rounded once while gathered, instead of gathered, then rounded while packed
        bf16::gemm(rows, cout, plan.patch, bf16::RoundedRows{rounded, bf16::rounded_stride(plan.patch)}, {wm}, out,
                   true, buf.pack, plan.pack_floats * sizeof(float));
      } else {
        detail::gemm(rows, cout, plan.patch, {patches}, {wm}, out, true, buf.pack, plan.pack_floats, p.precision);
      }
      if (p.relu) detail::relu_in_place(out, rows * cout);
    }
  });
}

// dw and dx chunk by chunk, member by member. dw_m sums its chunks in order, so it does not depend on M.
// With a shared input the chunk's patches serve every member, and the members' patch gradients are summed
// before one col2im.
void backward(const ConvPlan& plan, const float* x, const float* w, const float* dy, float* dx, float* dw,
              Buffers buf) {
  const Conv2dParams& p = plan.p;
  const Index cout = p.out_channels;
  for_each_chunk(p.batch, plan.bwd_images, [&](Chunk c) {
    const Index rows = c.images * plan.out_pixels;
    const float* patches = nullptr;
    for (int m = 0; m < p.members; ++m) {
      const Index image0 = (p.shared_input ? 0 : Index{m} * p.batch) + c.first;
      const float* dym = dy + (Index{m} * p.batch + c.first) * plan.out_image;
      const float* wm = w == nullptr ? nullptr : w + m * plan.patch * cout;
      if (dw != nullptr && plan.paired_patches) {  // bf16: the patches rounded into pairs while gathered
        const auto* pairs = reinterpret_cast<const std::uint32_t*>(buf.col);
        if (m == 0 || !p.shared_input)
          pairs = detail::im2col_paired(plan, x + image0 * plan.in_image, c.images, buf.col);
        bf16::gemm(plan.patch, cout, rows, bf16::PairedTranspose{pairs, plan.patch}, {dym}, dw + m * plan.patch * cout,
                   c.first > 0, buf.pack, plan.pack_floats * sizeof(float));
      } else if (dw != nullptr) {
        if (m == 0 || !p.shared_input)
          patches = chunk_patches(plan, x + image0 * plan.in_image, c.images, buf.col);
        // dw_m (patch, Cout) (+)= patches^T @ dy_m
        detail::gemm(plan.patch, cout, rows, GemmOperand{patches, true}, {dym}, dw + m * plan.patch * cout,
                     c.first > 0, buf.pack, plan.pack_floats, p.precision);
      }
      if (dx == nullptr) continue;
      // patch gradients (rows, patch) = dy_m @ w_m^T, summed over members for a shared input
      float* dx_chunk = dx + image0 * plan.in_image;
      detail::gemm(rows, plan.patch, cout, {dym}, GemmOperand{wm, true}, plan.identity ? dx_chunk : buf.dcol,
                   p.shared_input && m > 0, buf.pack, plan.pack_floats, p.precision);
      const bool last = !p.shared_input || m == p.members - 1;
      if (!plan.identity && last) {  // the chunk's dx is zeroed here, while it is about to be in cache anyway
        std::fill_n(dx_chunk, c.images * plan.in_image, 0.0f);
        detail::col2im_add(plan, buf.dcol, c.images, dx_chunk);
      }
    }
  });
}

}  // namespace

std::size_t ConvOpsImpl::conv2d_workspace_bytes(Conv2dParams p) const {
  return detail::conv_workspace_bytes(detail::make_conv_plan(p));
}

void ConvOpsImpl::conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y,
                         void* workspace) const {
  detail::require(x, "conv2d_forward", "x");
  detail::require(w, "conv2d_forward", "w");
  detail::require(y, "conv2d_forward", "y");
  const ConvPlan plan = detail::make_conv_plan(p);
  detail::Workspace space(workspace, detail::conv_workspace_bytes(plan));
  const Buffers buffers = carve(plan, space.get(), false);
  if (plan.direct) {
    detail::direct_forward(plan, x, w, b, y, buffers.padded, buffers.rounded);
  } else {
    forward(plan, x, w, b, y, buffers);
  }
}

void ConvOpsImpl::conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                          float* db, void* workspace) const {
  detail::require(dy, "conv2d_backward", "dy");
  if (dw != nullptr) detail::require(x, "conv2d_backward", "x (needed for dw)");
  if (dx != nullptr) detail::require(w, "conv2d_backward", "w (needed for dx)");
  const ConvPlan plan = detail::make_conv_plan(p);
  const Index cout = p.out_channels;
  detail::Workspace space(workspace, detail::conv_workspace_bytes(plan));
  const Buffers buffers = carve(plan, space.get(), true);
  const bool direct_dw = plan.direct && dw != nullptr;
  if (direct_dw) detail::direct_weights(plan, x, dy, dw, db, buffers.padded, buffers.db_sum, buffers.rounded);
  if (db != nullptr && !direct_dw) {
    for (int m = 0; m < p.members; ++m) {
      const float* dym = dy + Index{m} * p.batch * plan.out_image;
      detail::column_sums(dym, p.batch * plan.out_pixels, cout, db + m * cout);
    }
  }
  if (dx == nullptr && (dw == nullptr || direct_dw)) return;
  backward(plan, x, w, dy, dx, direct_dw ? nullptr : dw, buffers);
}

}  // namespace PMAPCC_CPU_NS
