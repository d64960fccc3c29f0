// CUDA conv2d forward and backward: im2col of the whole batch (once for a shared input), then strided-
// batched GEMMs against HWIO weights seen as (KH*KW*Cin, Cout) matrices, one batch entry per member, and
// the bias-and-ReLU epilogue; dx by a gather col2im (no atomics: deterministic). Every kernel is one item
// per output element (im2col: per patch entry; col2im: per input pixel and channel). bf16: each GEMM's
// operands are rounded into the workspace first (see Gemm in exec.h).
#include <algorithm>
#include <cstdint>

#include <pmapcc/kernels/cuda/backend.h>
#include <pmapcc/kernels/cuda/linear.h>

namespace pmap::kernels::gpu {
namespace {

// Sizes derived once per call; small, passed to kernels by value.
struct ConvPlan {
  Conv2dParams p;
  ConvGeometry g;
  int patch = 0;                // K = KH*KW*Cin
  std::size_t pixels = 0;       // P = N*OH*OW output pixels per member
  std::size_t in_image = 0;     // H*W*Cin
  int col_members = 1;          // patch matrices built: 1 with a shared input, else M
  bool identity = false;        // 1x1, stride 1, no padding: the patch matrix is x itself
  std::size_t col_floats = 0;   // floats of one set of patch matrices (none for identity)
  std::size_t partials = 0;     // doubles for the bias-gradient chunks
  std::size_t bf16_bytes = 0;   // the bf16 GEMMs' rounded operands (the largest of the three GEMMs)
};

Gemm forward_gemm(const ConvPlan& plan);
Gemm dw_gemm(const ConvPlan& plan);
Gemm dx_gemm(const ConvPlan& plan);

ConvPlan make_plan(const Conv2dParams& p) {
  ConvPlan plan;
  plan.p = p;
  plan.g = conv2d_geometry(p);  // validates p
  plan.patch = p.kernel_h * p.kernel_w * p.in_channels;
  plan.pixels = static_cast<std::size_t>(p.batch) * plan.g.out_height * plan.g.out_width;
  plan.in_image = static_cast<std::size_t>(p.height) * p.width * p.in_channels;
  plan.col_members = p.shared_input ? 1 : p.members;
  plan.identity = p.kernel_h == 1 && p.kernel_w == 1 && p.stride_h == 1 && p.stride_w == 1 && plan.g.pad_top == 0 &&
                  plan.g.pad_left == 0 && plan.g.out_height == p.height && plan.g.out_width == p.width;
  plan.col_floats = plan.identity ? 0 : plan.col_members * plan.pixels * static_cast<std::size_t>(plan.patch);
  plan.partials = column_sum_partials(p.members, plan.pixels, p.out_channels);
  plan.bf16_bytes = std::max({bf16_operand_bytes(forward_gemm(plan)), bf16_operand_bytes(dw_gemm(plan)),
                              bf16_operand_bytes(dx_gemm(plan))});
  return plan;
}

// The workspace carved into patches, patch gradients, bias partial sums and the bf16 GEMMs' operands.
struct ConvBuffers {
  float* col = nullptr;
  float* dcol = nullptr;
  double* partial = nullptr;
  void* bf16 = nullptr;
};

std::size_t workspace_bytes(const ConvPlan& plan) {
  const std::size_t cols = align_up(plan.col_floats * sizeof(float));
  return 2 * cols + align_up(plan.partials * sizeof(double)) + plan.bf16_bytes + kWorkspaceAlign;
}

ConvBuffers carve(const Exec& ex, const ConvPlan& plan, void* workspace) {
  if (workspace == nullptr) workspace = ex.scratch(workspace_bytes(plan));
  const std::uintptr_t base = align_up(workspace);
  ConvBuffers b;
  const std::size_t cols = align_up(plan.col_floats * sizeof(float));
  const std::size_t partials = align_up(plan.partials * sizeof(double));
  b.col = reinterpret_cast<float*>(base);
  b.dcol = reinterpret_cast<float*>(base + cols);
  b.partial = plan.partials == 0 ? nullptr : reinterpret_cast<double*>(base + 2 * cols);
  b.bf16 = plan.bf16_bytes == 0 ? nullptr : reinterpret_cast<void*>(base + 2 * cols + partials);
  return b;
}

// col (images*OH*OW, K) = patches of x (images, H, W, Cin); a patch row is (ky, kx, c); padding reads 0.
struct Im2col {
  ConvPlan plan;
  const float* x;
  float* col;
  PMAPCC_HD void operator()(std::size_t i) const {
    const Conv2dParams& p = plan.p;
    const std::size_t row = i / static_cast<std::size_t>(plan.patch);
    const int kk = static_cast<int>(i % static_cast<std::size_t>(plan.patch));
    const std::size_t per_image = static_cast<std::size_t>(plan.g.out_height) * plan.g.out_width;
    const std::size_t pix = row % per_image, image = row / per_image;
    const int oy = static_cast<int>(pix / plan.g.out_width), ox = static_cast<int>(pix % plan.g.out_width);
    const int ky = kk / (p.kernel_w * p.in_channels), rest = kk % (p.kernel_w * p.in_channels);
    const int kx = rest / p.in_channels, c = rest % p.in_channels;
    const int iy = oy * p.stride_h - plan.g.pad_top + ky, ix = ox * p.stride_w - plan.g.pad_left + kx;
    const bool inside = iy >= 0 && iy < p.height && ix >= 0 && ix < p.width;
    col[i] = inside ? x[image * plan.in_image + (static_cast<std::size_t>(iy) * p.width + ix) * p.in_channels + c]
                    : 0.0f;
  }
};

// dx (images, H, W, Cin) = the patch gradients dcol (images*OH*OW, K) gathered back: each input pixel sums
// the patch entries that read it, in the CPU's order (output pixels ascending).
struct Col2im {
  ConvPlan plan;
  const float* dcol;
  float* dx;
  PMAPCC_HD void operator()(std::size_t i) const {
    const Conv2dParams& p = plan.p;
    const ConvGeometry& g = plan.g;
    const int c = static_cast<int>(i % p.in_channels);
    std::size_t t = i / p.in_channels;
    const int ix = static_cast<int>(t % p.width);
    t /= p.width;
    const int iy = static_cast<int>(t % p.height);
    const std::size_t image = t / p.height;
    float acc = 0.0f;
    for (int ky = p.kernel_h - 1; ky >= 0; --ky) {
      const int ty = iy + g.pad_top - ky;
      if (ty < 0 || ty % p.stride_h != 0 || ty / p.stride_h >= g.out_height) continue;
      const int oy = ty / p.stride_h;
      for (int kx = p.kernel_w - 1; kx >= 0; --kx) {
        const int tx = ix + g.pad_left - kx;
        if (tx < 0 || tx % p.stride_w != 0 || tx / p.stride_w >= g.out_width) continue;
        const int ox = tx / p.stride_w;
        const std::size_t row = (image * g.out_height + oy) * g.out_width + ox;
        acc += dcol[row * plan.patch + (ky * p.kernel_w + kx) * p.in_channels + c];
      }
    }
    dx[i] = acc;
  }
};

// The patch matrices of all col_members: x itself for identity, else im2col'ed into col.
const float* patches(const Exec& ex, const ConvPlan& plan, const float* x, float* col) {
  if (plan.identity) return x;
  ex.launch(Im2col{plan, x, col}, plan.col_floats);
  return col;
}

// Per member: (P, K) x (K, Cout). A shared patch matrix has batch stride 0.
Gemm member_gemm(const ConvPlan& plan) {
  Gemm g;
  g.batch = plan.p.members;
  g.stride_a = plan.col_members == 1 ? 0 : static_cast<long long>(plan.pixels) * plan.patch;
  g.bf16 = plan.p.precision == Precision::bf16;
  return g;
}

// y_m (P, Cout) = patches_m (P, K) @ w_m (K, Cout).
Gemm forward_gemm(const ConvPlan& plan) {
  Gemm g = member_gemm(plan);
  g.m = static_cast<int>(plan.pixels), g.n = plan.p.out_channels, g.k = plan.patch;
  g.stride_b = static_cast<long long>(plan.patch) * plan.p.out_channels;
  g.stride_c = static_cast<long long>(plan.pixels) * plan.p.out_channels;
  return g;
}

// dw_m (K, Cout) = patches_m^T (K, P) @ dy_m (P, Cout).
Gemm dw_gemm(const ConvPlan& plan) {
  Gemm g = member_gemm(plan);
  g.trans_a = true;
  g.m = plan.patch, g.n = plan.p.out_channels, g.k = static_cast<int>(plan.pixels);
  g.stride_b = static_cast<long long>(plan.pixels) * plan.p.out_channels;
  g.stride_c = static_cast<long long>(plan.patch) * plan.p.out_channels;
  return g;
}

// dcol_m (P, K) = dy_m (P, Cout) @ w_m^T: batched over members, or (shared input) one member's GEMM, called
// per member with the sums accumulated in C.
Gemm dx_gemm(const ConvPlan& plan) {
  const Conv2dParams& p = plan.p;
  Gemm g;
  g.trans_b = true;
  g.bf16 = p.precision == Precision::bf16;
  g.m = static_cast<int>(plan.pixels), g.n = plan.patch, g.k = p.out_channels;
  if (p.shared_input) return g;
  g.batch = p.members, g.stride_a = static_cast<long long>(plan.pixels) * p.out_channels;
  g.stride_b = static_cast<long long>(plan.patch) * p.out_channels;
  g.stride_c = static_cast<long long>(plan.pixels) * plan.patch;
  return g;
}

void backward_dx(const Exec& ex, const ConvPlan& plan, const float* w, const float* dy, float* dx, float* dcol,
                 void* bf16) {
  const Conv2dParams& p = plan.p;
  const long long w_size = static_cast<long long>(plan.patch) * p.out_channels;
  const long long y_size = static_cast<long long>(plan.pixels) * p.out_channels;
  // An identity conv writes dx directly.
  float* target = plan.identity ? dx : dcol;
  Gemm g = dx_gemm(plan);
  if (p.shared_input) {  // members' patch gradients summed in member order, then one col2im
    for (int m = 0; m < p.members; ++m) {
      g.beta = m == 0 ? 0.0f : 1.0f;
      product(ex, g, dy + m * y_size, w + m * w_size, target, bf16);
    }
  } else {
    product(ex, g, dy, w, target, bf16);
  }
  if (plan.identity) return;
  ex.launch(Col2im{plan, dcol, dx}, static_cast<std::size_t>(plan.col_members) * p.batch * plan.in_image);
}

}  // namespace

std::size_t CudaConvOps::conv2d_workspace_bytes(Conv2dParams p) const { return workspace_bytes(make_plan(p)); }

void CudaConvOps::conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y,
                                 void* workspace) const {
  const Exec& ex = ex_;
  require(x, "conv2d_forward", "x");
  require(w, "conv2d_forward", "w");
  require(y, "conv2d_forward", "y");
  const ConvPlan plan = make_plan(p);
  const ConvBuffers buf = carve(ex, plan, workspace);
  product(ex, forward_gemm(plan), patches(ex, plan, x, buf.col), w, y, buf.bf16);
  bias_relu(ex, p.members, plan.pixels, p.out_channels, b, p.relu, y);
}

void CudaConvOps::conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                                  float* db, void* workspace) const {
  const Exec& ex = ex_;
  require(dy, "conv2d_backward", "dy");
  if (dw != nullptr) require(x, "conv2d_backward", "x (needed for dw)");
  if (dx != nullptr) require(w, "conv2d_backward", "w (needed for dx)");
  const ConvPlan plan = make_plan(p);
  const ConvBuffers buf = carve(ex, plan, workspace);
  if (db != nullptr) column_sums(ex, p.members, plan.pixels, p.out_channels, dy, db, buf.partial);
  if (dw != nullptr) product(ex, dw_gemm(plan), patches(ex, plan, x, buf.col), dy, dw, buf.bf16);
  if (dx != nullptr) backward_dx(ex, plan, w, dy, dx, buf.dcol, buf.bf16);
}

}  // namespace pmap::kernels::gpu
