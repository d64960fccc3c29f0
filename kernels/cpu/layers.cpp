// CPU layer ops (kernels/layer_ops.h): loops over kernels/layer_math.h's per-element functions, the oracle of
// the CUDA kernels. The sums run row by row with one double accumulator per channel, which adds each
// channel's values in the same order as the CUDA kernels' per-channel loops. Compiled without FMA
// contraction, so every ISA variant gives the same bits.
#include <pmap/error.h>

#include <string>
#include <vector>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/cpu/ops.h>
#include <pmapcc/kernels/layer_math.h>

namespace PMAPCC_CPU_NS {
namespace {

std::size_t elements(const BatchNormParams& p) {
  return static_cast<std::size_t>(p.members) * static_cast<std::size_t>(p.rows) * static_cast<std::size_t>(p.channels);
}

}  // namespace

void LayerOpsImpl::batch_norm_sums(BatchNormParams p, const float* x, double* sums) const {
  validate(p);
  detail::require(x, "batch_norm_sums", "x");
  detail::require(sums, "batch_norm_sums", "sums");
  const auto c = static_cast<std::size_t>(p.channels);
  for (int m = 0; m < p.members; ++m) {
    double* s = sums + static_cast<std::size_t>(m) * 2 * c;
    double* s2 = s + c;
    for (std::size_t k = 0; k < c; ++k) s[k] = s2[k] = 0.0;
    const float* xm = x + static_cast<std::size_t>(m) * static_cast<std::size_t>(p.rows) * c;
    for (std::int64_t r = 0; r < p.rows; ++r, xm += c)
      for (std::size_t k = 0; k < c; ++k) {
        const double v = xm[k];
        s[k] += v;
        s2[k] += v * v;
      }
  }
}

void LayerOpsImpl::batch_norm_statistics(BatchNormParams p, const double* sums, double count, float* moving_mean,
                                         float* moving_variance, float* stats) const {
  validate(p);
  detail::require(moving_mean, "batch_norm_statistics", "moving_mean");
  detail::require(moving_variance, "batch_norm_statistics", "moving_variance");
  detail::require(stats, "batch_norm_statistics", "stats");
  if (sums != nullptr && !(count >= 1)) throw ValueError("batch_norm_statistics: count must be >= 1");
  const std::size_t n = static_cast<std::size_t>(p.members) * static_cast<std::size_t>(p.channels);
  for (std::size_t mc = 0; mc < n; ++mc)
    batch_norm_channel_stats(p, sums, count, moving_mean, moving_variance, stats, mc);
}

void LayerOpsImpl::batch_norm_apply(BatchNormParams p, const float* x, const float* stats, const float* gamma,
                                    const float* beta, float* y) const {
  validate(p);
  detail::require(x, "batch_norm_apply", "x");
  detail::require(stats, "batch_norm_apply", "stats");
  detail::require(y, "batch_norm_apply", "y");
  const std::size_t n = elements(p);
  for (std::size_t i = 0; i < n; ++i) y[i] = batch_norm_element(p, stats, gamma, beta, x[i], i);
}

void LayerOpsImpl::batch_norm_backward_sums(BatchNormParams p, const float* x, const float* dy, const float* stats,
                                            double* sums, float* dgamma, float* dbeta) const {
  validate(p);
  detail::require(x, "batch_norm_backward_sums", "x");
  detail::require(dy, "batch_norm_backward_sums", "dy");
  detail::require(stats, "batch_norm_backward_sums", "stats");
  detail::require(sums, "batch_norm_backward_sums", "sums");
  const auto c = static_cast<std::size_t>(p.channels);
  for (int m = 0; m < p.members; ++m) {
    double* s = sums + static_cast<std::size_t>(m) * 2 * c;
    double* s2 = s + c;
    const float* mean = stats + static_cast<std::size_t>(m) * 2 * c;
    const float* inv = mean + c;
    for (std::size_t k = 0; k < c; ++k) s[k] = s2[k] = 0.0;
    const std::size_t base = static_cast<std::size_t>(m) * static_cast<std::size_t>(p.rows) * c;
    for (std::int64_t r = 0; r < p.rows; ++r)
      for (std::size_t k = 0; k < c; ++k) {
        const std::size_t i = base + static_cast<std::size_t>(r) * c + k;
        const float x_hat = (x[i] - mean[k]) * inv[k];
        s[k] += static_cast<double>(dy[i]);
        s2[k] += static_cast<double>(dy[i] * x_hat);
      }
    for (std::size_t k = 0; k < c; ++k) {
      if (dbeta != nullptr) dbeta[static_cast<std::size_t>(m) * c + k] = static_cast<float>(s[k]);
      if (dgamma != nullptr) dgamma[static_cast<std::size_t>(m) * c + k] = static_cast<float>(s2[k]);
    }
  }
}

void LayerOpsImpl::batch_norm_backward(BatchNormParams p, const float* x, const float* dy, const float* stats,
                                       const double* sums, double count, const float* gamma, float* dx) const {
  validate(p);
  detail::require(x, "batch_norm_backward", "x");
  detail::require(dy, "batch_norm_backward", "dy");
  detail::require(stats, "batch_norm_backward", "stats");
  detail::require(sums, "batch_norm_backward", "sums");
  detail::require(dx, "batch_norm_backward", "dx");
  if (!(count >= 1)) throw ValueError("batch_norm_backward: count must be >= 1");
  const std::size_t n = elements(p);
  for (std::size_t i = 0; i < n; ++i) dx[i] = batch_norm_dx(p, stats, sums, count, gamma, x[i], dy[i], i);
}

void LayerOpsImpl::dropout(DropoutParams p, const std::uint32_t* keys, const std::int64_t* step, const float* x,
                           float* y) const {
  validate(p);
  detail::require(keys, "dropout", "keys");
  detail::require(step, "dropout", "step");
  detail::require(x, "dropout", "x");
  detail::require(y, "dropout", "y");
  const std::uint32_t threshold = dropout_threshold(p.rate);
  const float scale = 1.0f / (1.0f - p.rate);
  const std::int64_t t = *step;
  const std::size_t n = static_cast<std::size_t>(p.members) * static_cast<std::size_t>(p.rows) *
                        static_cast<std::size_t>(p.features);
  for (std::size_t i = 0; i < n; ++i) y[i] = dropout_element(p, threshold, scale, keys, t, x[i], i);
}

void LayerOpsImpl::scale_shift(std::size_t n, const float* x, float scale, float offset, float* y) const {
  detail::require(x, "scale_shift", "x");
  detail::require(y, "scale_shift", "y");
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * scale + offset;
}

}  // namespace PMAPCC_CPU_NS
