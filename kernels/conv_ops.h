// ConvOps: the op family of the layers over images (M, N, H, W, C), channels last: convolution and average
// pooling. One implementation per CPU ISA variant (kernels/cpu/conv.cpp, pool.cpp) and one CUDA one
// (kernels/cuda/conv.cu, pool.cu). Pointers are in the memory of the backend's device and ops are ordered
// as kernels/backend.h says; shapes and parameter structs are kernels/ops.h's.
#pragma once

#include <cstddef>

#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

class ConvOps {
 public:
  virtual ~ConvOps() = default;

  // Bytes of scratch memory conv2d_forward and conv2d_backward need for these params (one buffer serves
  // both; any alignment; contents need not be initialised and are garbage afterwards). CPU: a few MiB (a
  // few images im2col'ed at a time, plus the GEMMs' packing space); CUDA: the patch matrices of the whole
  // batch, twice for the backward, and the bias-gradient partial sums.
  virtual std::size_t conv2d_workspace_bytes(Conv2dParams p) const = 0;

  // y = conv(x, w) + b, cross-correlation as in Flax/XLA (and max(., 0) with p.relu).
  //   x (M, N, H, W, Cin), or (N, H, W, Cin) with shared_input
  //   w (M, KH, KW, Cin, Cout)   b (M, Cout), or nullptr for no bias
  //   y (M, N, OH, OW, Cout), written
  // workspace: conv2d_workspace_bytes(p) bytes, and then the op does not allocate; or nullptr, and the op
  // allocates it for the call (CPU) or takes the thread's growing scratch (CUDA: not during a capture).
  virtual void conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y,
                              void* workspace) const = 0;

  // Gradients of conv2d_forward given dy = dL/dy (M, N, OH, OW, Cout):
  //   dx (M, N, H, W, Cin), or (N, H, W, Cin) summed over members with shared_input; nullptr: not computed
  //   dw (M, KH, KW, Cin, Cout)   db (M, Cout), nullptr: not computed
  // x and w as given to the forward. workspace as for conv2d_forward.
  virtual void conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db, void* workspace) const = 0;

  // y (M, N, OH, OW, C) = window means of x (M, N, H, W, C). Not in place.
  virtual void avg_pool_forward(AvgPoolParams p, const float* x, float* y) const = 0;

  // dx (M, N, H, W, C) from dy (M, N, OH, OW, C): each dy spread evenly over its window; inputs outside
  // every window (odd edges) get 0. dx is written whole. Not in place.
  virtual void avg_pool_backward(AvgPoolParams p, const float* dy, float* dx) const = 0;

  // The gradient through a ReLU and then avg_pool, in one pass: given r = relu(x) (M, N, H, W, C), the
  // pool's input, and dy (M, N, OH, OW, C), dx = avg_pool_backward's dx where r > 0, else 0. In place
  // allowed and intended (dx == r: the gradient replaces the activation); dx must not overlap dy.
  virtual void avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx) const = 0;
};

}  // namespace pmap::kernels
