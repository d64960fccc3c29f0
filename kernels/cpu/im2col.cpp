// CPU conv2d plan and the im2col / col2im transforms. A patch row is KH*KW*Cin floats in (ky, kx, c)
// order, the row order of HWIO weights, so conv is patches (P, KH*KW*Cin) @ w (KH*KW*Cin, Cout).
#include <pmapcc/kernels/cpu/im2col.h>

#include <algorithm>
#include <cstdint>

#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu/gemm.h>

namespace PMAPCC_CPU_NS::detail {
namespace {

// Target size of one chunk's buffers in floats (1 MiB): they stay in L2/L3 between im2col and the GEMM.
constexpr Index kChunkFloats = Index{1} << 18;

int images_per_chunk(Index floats_per_image, int batch) {
  const Index fit = kChunkFloats / std::max<Index>(floats_per_image, 1);
  return static_cast<int>(std::clamp<Index>(fit, 1, batch));
}

}  // namespace

ConvPlan make_conv_plan(const Conv2dParams& p) {
  require_precision(p.precision, "conv2d");
  ConvPlan plan;
  plan.p = p;
  plan.g = conv2d_geometry(p);
  plan.patch = Index{p.kernel_h} * p.kernel_w * p.in_channels;
  plan.out_pixels = Index{plan.g.out_height} * plan.g.out_width;
  plan.in_image = Index{p.height} * p.width * p.in_channels;
  plan.out_image = plan.out_pixels * p.out_channels;
  plan.identity = p.kernel_h == 1 && p.kernel_w == 1 && p.stride_h == 1 && p.stride_w == 1 &&
                  plan.g.pad_top == 0 && plan.g.pad_left == 0 && plan.g.out_height == p.height &&
                  plan.g.out_width == p.width;

  // A forward chunk holds its patches and its output, so that the bias, GEMM and ReLU stay in cache.
  const Index fwd_row = plan.identity ? 0 : plan.patch;
  plan.fwd_images = images_per_chunk(plan.out_pixels * (fwd_row + p.out_channels), p.batch);
  plan.fwd_floats = static_cast<std::size_t>(plan.out_pixels * plan.fwd_images * fwd_row);
  plan.rounded_patches = p.precision == Precision::bf16 && !plan.identity && plan.patch > kDirectMaxPatch;
  if (plan.rounded_patches)
    plan.fwd_floats = std::max(plan.fwd_floats, rounded_patch_floats(plan, plan.fwd_images));

  plan.bwd_images = images_per_chunk(plan.out_pixels * plan.patch * 2, p.batch);
  plan.bwd_floats = static_cast<std::size_t>(plan.out_pixels * plan.bwd_images * plan.patch * 2);
  // The AMX path keeps dw on float patches: it runs a weight gradient as its transposed product, which packs
  // the patches as rows rather than reading pairs.
  plan.paired_patches = plan.rounded_patches && bf16::active_path() != bf16::Path::amx;
  if (plan.paired_patches)  // the patches' pairs, and the patch gradients beside them in as much space
    plan.bwd_floats = std::max(plan.bwd_floats, 2 * paired_patch_floats(plan, plan.bwd_images));

  plan.direct = !plan.identity && plan.patch <= kDirectMaxPatch;
  if (plan.direct) {
    plan.padded_h = Index{std::max(p.height, (plan.g.out_height - 1) * p.stride_h + p.kernel_h)};
    plan.padded_w = Index{std::max(p.width, (plan.g.out_width - 1) * p.stride_w + p.kernel_w)};
    plan.padded_h = std::max(plan.padded_h, Index{p.height} + plan.g.pad_top);
    plan.padded_w = std::max(plan.padded_w, Index{p.width} + plan.g.pad_left);
    plan.padded_floats = static_cast<std::size_t>(plan.padded_h * plan.padded_w * p.in_channels);
    if (p.precision == Precision::bf16)
      plan.rounded_floats = static_cast<std::size_t>(plan.patch * p.out_channels + plan.out_image);
    plan.direct_floats = plan.padded_floats + plan.rounded_floats + 2 * static_cast<std::size_t>(p.out_channels);
  }

  // Every GEMM shape the passes run: full chunks and the batch's ragged last chunk.
  const Index cout = p.out_channels;
  for (int images : {plan.fwd_images, p.batch % plan.fwd_images}) {
    if (images == 0) continue;
    const Index rows = images * plan.out_pixels;
    plan.pack_floats = std::max(plan.pack_floats, gemm_pack_floats(rows, cout, plan.patch, p.precision));
  }
  for (int images : {plan.bwd_images, p.batch % plan.bwd_images}) {
    if (images == 0) continue;
    const Index rows = images * plan.out_pixels;
    plan.pack_floats = std::max(plan.pack_floats, gemm_pack_floats(plan.patch, cout, rows, p.precision));  // dw
    plan.pack_floats = std::max(plan.pack_floats, gemm_pack_floats(rows, plan.patch, cout, p.precision));  // dx
  }
  return plan;
}

std::size_t conv_workspace_bytes(const ConvPlan& plan) {
  const std::size_t patches = std::max(plan.fwd_floats, plan.bwd_floats);
  return (plan.pack_floats + patches + plan.direct_floats) * sizeof(float) + 6 * Scratch::kAlign;
}

namespace {

// A run of a patch row: copied (rounded to bf16 bits for rounded rows) or zero.
void copy_run(const float* from, Index n, float* to) { std::copy_n(from, n, to); }
void copy_run(const float* from, Index n, std::uint16_t* to) {
  bf16::round_bits_into(from, static_cast<std::size_t>(n), to);
}
template <typename T>
void zero_run(T* to, Index n) {
  std::fill_n(to, n, T{0});
}

// Output pixel (oy, ox)'s patch of one image (H, W, Cin) into out[0, KH*KW*Cin); padding reads as 0.
template <typename T>
void patch_row(const ConvPlan& plan, const float* image, int oy, int ox, T* out) {
  const Conv2dParams& p = plan.p;
  const Index c = p.in_channels;
  const Index span = Index{p.kernel_w} * c;  // one kernel row of a patch: contiguous in x when inside
  const int ix0 = ox * p.stride_w - plan.g.pad_left;
  const bool inside_w = ix0 >= 0 && ix0 + p.kernel_w <= p.width;
  for (int ky = 0; ky < p.kernel_h; ++ky, out += span) {
    const int iy = oy * p.stride_h - plan.g.pad_top + ky;
    if (iy < 0 || iy >= p.height) {
      zero_run(out, span);
      continue;
    }
    const float* row = image + (Index{iy} * p.width) * c;
    if (inside_w) {
      copy_run(row + Index{ix0} * c, span, out);
      continue;
    }
    for (int kx = 0; kx < p.kernel_w; ++kx) {
      const int ix = ix0 + kx;
      if (ix < 0 || ix >= p.width) {
        zero_run(out + kx * c, c);
      } else {
        copy_run(row + Index{ix} * c, c, out + kx * c);
      }
    }
  }
}

}  // namespace

void im2col(const ConvPlan& plan, const float* x, int images, float* col) {
  for (int n = 0; n < images; ++n) {
    const float* image = x + n * plan.in_image;
    for (int oy = 0; oy < plan.g.out_height; ++oy)
      for (int ox = 0; ox < plan.g.out_width; ++ox, col += plan.patch) patch_row(plan, image, oy, ox, col);
  }
}

void im2col_rounded(const ConvPlan& plan, const float* x, int images, std::uint16_t* bits) {
  const Index stride = bf16::rounded_stride(plan.patch);
  const Index rows = Index{images} * plan.out_pixels;
  std::uint16_t* out = bits;
  for (int n = 0; n < images; ++n) {
    const float* image = x + n * plan.in_image;
    for (int oy = 0; oy < plan.g.out_height; ++oy) {
      for (int ox = 0; ox < plan.g.out_width; ++ox, out += stride) {
        patch_row(plan, image, oy, ox, out);
        zero_run(out + plan.patch, stride - plan.patch);
      }
    }
  }
  zero_run(out, (bf16::rounded_rows(rows) - rows) * stride);
}

std::size_t rounded_patch_floats(const ConvPlan& plan, int images) {
  const Index bits = bf16::rounded_rows(Index{images} * plan.out_pixels) * bf16::rounded_stride(plan.patch);
  return static_cast<std::size_t>((bits + 1) / 2);
}

const std::uint32_t* im2col_paired(const ConvPlan& plan, const float* x, int images, float* space) {
  const Index rows = Index{images} * plan.out_pixels;
  auto* pairs = reinterpret_cast<std::uint32_t*>(space);
  float* scratch = space + (rows + 1) / 2 * plan.patch;  // after the pairs: two patch rows
  float* rows2[2] = {scratch, scratch + plan.patch};
  Index row = 0;  // the chunk's patch row, image by image, pixel by pixel
  for (int n = 0; n < images; ++n) {
    const float* image = x + n * plan.in_image;
    for (int oy = 0; oy < plan.g.out_height; ++oy) {
      for (int ox = 0; ox < plan.g.out_width; ++ox, ++row) {
        patch_row(plan, image, oy, ox, rows2[row % 2]);
        if (row % 2 == 1 || row == rows - 1)
          bf16::pair_rows_into(rows2[0], row % 2 == 1 ? rows2[1] : nullptr, static_cast<std::size_t>(plan.patch),
                               pairs + row / 2 * plan.patch);
      }
    }
  }
  return pairs;
}

std::size_t paired_patch_floats(const ConvPlan& plan, int images) {
  const Index pair_rows = (Index{images} * plan.out_pixels + 1) / 2;
  return static_cast<std::size_t>((pair_rows + 2) * plan.patch);
}

void col2im_add(const ConvPlan& plan, const float* dcol, int images, float* dx) {
  const Conv2dParams& p = plan.p;
  const Index c = p.in_channels;
  const Index span = Index{p.kernel_w} * c;
  const float* in = dcol;
  for (int n = 0; n < images; ++n) {
    float* image = dx + n * plan.in_image;
    for (int oy = 0; oy < plan.g.out_height; ++oy) {
      for (int ox = 0; ox < plan.g.out_width; ++ox) {
        const int ix0 = ox * p.stride_w - plan.g.pad_left;
        for (int ky = 0; ky < p.kernel_h; ++ky, in += span) {
          const int iy = oy * p.stride_h - plan.g.pad_top + ky;
          if (iy < 0 || iy >= p.height) continue;
          float* row = image + (Index{iy} * p.width) * c;
          const int kx_begin = std::max(0, -ix0);
          const int kx_end = std::min(p.kernel_w, p.width - ix0);
          for (Index j = Index{kx_begin} * c; j < Index{kx_end} * c; ++j) row[Index{ix0} * c + j] += in[j];
        }
      }
    }
  }
}

}  // namespace PMAPCC_CPU_NS::detail
