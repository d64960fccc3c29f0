// Internal to the CPU conv2d: the plan (derived sizes, how many images per im2col chunk, workspace) and the
// im2col / col2im transforms between NHWC images and the (pixels, KH*KW*Cin) patch matrix.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/ops.h>

namespace PMAPCC_CPU_NS::detail {

struct ConvPlan {
  Conv2dParams p;
  ConvGeometry g;
  Index patch = 0;              // KH*KW*Cin: one row of the patch matrix, one column block of w
  Index out_pixels = 0;         // OH*OW per image
  Index in_image = 0;           // H*W*Cin floats per input image
  Index out_image = 0;          // OH*OW*Cout floats per output image
  bool identity = false;        // 1x1 kernel, stride 1, no padding: the patch matrix is x itself
  bool rounded_patches = false;  // bf16 GEMM path: the forward's patches are bf16 rows (im2col_rounded)
  bool paired_patches = false;   // bf16 on the vector or fma path: dw's patches are bf16 pairs (im2col_paired)
  int fwd_images = 1;           // images per forward chunk
  int bwd_images = 1;           // images per backward chunk (never depends on members: dw sums over chunks)
  std::size_t pack_floats = 0;  // GEMM packing space: the most any of the op's GEMMs needs
  std::size_t fwd_floats = 0;   // patch floats of the forward (none for identity)
  std::size_t bwd_floats = 0;   // patch floats of the backward: patches + patch gradients
  // Direct path (conv_direct.cpp) for a small patch (the first layer: KH*KW*Cin = 9), where a GEMM of depth
  // 9 runs far below its peak: the forward and dw/db loop over taps on a zero-padded copy of each image. In
  // bf16 it multiplies bf16-rounded copies of x, w and dy: the products of bf16 values are exact in fp32, so
  // these are the bf16 products, summed in fp32, without a depth-9 GEMM padded to the bf16 GEMM's 32.
  bool direct = false;
  Index padded_h = 0;           // H + padding, rows of the padded copy
  Index padded_w = 0;           // W + padding
  std::size_t padded_floats = 0;  // the padded image
  std::size_t rounded_floats = 0;  // bf16 only: one member's rounded w and one image's rounded dy
  std::size_t direct_floats = 0;  // workspace of the direct path: the above + Cout double sums
};

// The direct path is taken for patches of at most this many values.
inline constexpr Index kDirectMaxPatch = 16;

// Validates p (pmap::ValueError) and derives the plan.
ConvPlan make_conv_plan(const Conv2dParams& p);

// Workspace bytes for the plan: packing space + the larger pass's patches, with room to align each buffer.
std::size_t conv_workspace_bytes(const ConvPlan& plan);

// col (images*OH*OW, KH*KW*Cin) = the patches of x (images, H, W, Cin); padding reads as 0.
void im2col(const ConvPlan& plan, const float* x, int images, float* col);

// The same patches as bf16 rows for bf16::gemm (bf16::RoundedRows): row r at bits + r * stride with stride =
// bf16::rounded_stride(KH*KW*Cin), zeros past the patch and in the rows up to bf16::rounded_rows(rows).
void im2col_rounded(const ConvPlan& plan, const float* x, int images, std::uint16_t* bits);
// Floats of space im2col_rounded needs for that many images.
std::size_t rounded_patch_floats(const ConvPlan& plan, int images);

// The same patches as the transposed left operand of dw's bf16 GEMM (bf16::PairedTranspose, stride KH*KW*Cin):
// pair p of column r is patch rows 2p and 2p + 1 at r (rounded; zero past the last row), written at the start
// of space (paired_patch_floats(plan, images) floats: the pairs, then two rows of scratch), which it returns.
const std::uint32_t* im2col_paired(const ConvPlan& plan, const float* x, int images, float* space);
std::size_t paired_patch_floats(const ConvPlan& plan, int images);

// dx (images, H, W, Cin) += the patch gradients dcol (images*OH*OW, KH*KW*Cin), scattered back.
void col2im_add(const ConvPlan& plan, const float* dcol, int images, float* dx);

}  // namespace PMAPCC_CPU_NS::detail
