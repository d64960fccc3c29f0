// The arithmetic of LayerOps (kernels/layer_ops.h), shared by the CPU ops and the CUDA kernels (PMAPCC_HD) so
// both give the same bits: one function per output element, channel or member. Compiled without FMA
// contraction on both sides.
#pragma once

#include <math.h>  // sqrt, floor: glibc on the host, CUDA's on the device

#include <cstddef>
#include <cstdint>

#include <pmap/detail/launch.h>
#include <pmap/detail/philox.h>

#include <pmapcc/kernels/layer_ops.h>

namespace pmap::kernels {

// Training statistics of channel c of member m from the sums; updates the moving statistics.
PMAPCC_HD inline void batch_norm_channel_stats(const BatchNormParams& p, const double* sums, double count,
                                               float* moving_mean, float* moving_variance, float* stats,
                                               std::size_t mc) {
  const std::size_t m = mc / static_cast<std::size_t>(p.channels), c = mc % static_cast<std::size_t>(p.channels);
  const std::size_t at = m * 2 * static_cast<std::size_t>(p.channels) + c;
  float* mean_out = stats + at;
  float* inv_out = mean_out + p.channels;
  if (sums == nullptr) {  // inference: the moving statistics
    *mean_out = moving_mean[mc];
    *inv_out = static_cast<float>(1.0 / sqrt(static_cast<double>(moving_variance[mc]) + p.epsilon));
    return;
  }
  const double mean = sums[at] / count;
  double var = sums[at + static_cast<std::size_t>(p.channels)] / count - mean * mean;
  if (var < 0) var = 0;
  *mean_out = static_cast<float>(mean);
  *inv_out = static_cast<float>(1.0 / sqrt(var + p.epsilon));
  const float keep = p.momentum, take = 1.0f - p.momentum;
  moving_mean[mc] = moving_mean[mc] * keep + static_cast<float>(mean) * take;
  moving_variance[mc] = moving_variance[mc] * keep + static_cast<float>(var) * take;
}

// Element i of (M, R, C): its member and channel.
struct BnIndex {
  std::size_t m, c;
};
PMAPCC_HD inline BnIndex bn_index(const BatchNormParams& p, std::size_t i) {
  const auto channels = static_cast<std::size_t>(p.channels);
  return BnIndex{i / (static_cast<std::size_t>(p.rows) * channels), i % channels};
}

PMAPCC_HD inline float batch_norm_element(const BatchNormParams& p, const float* stats, const float* gamma,
                                          const float* beta, float x, std::size_t i) {
  const BnIndex k = bn_index(p, i);
  const std::size_t at = k.m * 2 * static_cast<std::size_t>(p.channels) + k.c;
  const std::size_t mc = k.m * static_cast<std::size_t>(p.channels) + k.c;
  float y = (x - stats[at]) * stats[at + static_cast<std::size_t>(p.channels)];
  if (gamma != nullptr) y = y * gamma[mc];
  if (beta != nullptr) y = y + beta[mc];
  return p.relu && y < 0.0f ? 0.0f : y;
}

PMAPCC_HD inline float batch_norm_dx(const BatchNormParams& p, const float* stats, const double* sums, double count,
                                     const float* gamma, float x, float dy, std::size_t i) {
  const BnIndex k = bn_index(p, i);
  const std::size_t at = k.m * 2 * static_cast<std::size_t>(p.channels) + k.c;
  const std::size_t mc = k.m * static_cast<std::size_t>(p.channels) + k.c;
  const float mean = stats[at], inv = stats[at + static_cast<std::size_t>(p.channels)];
  const float mean_dy = static_cast<float>(sums[at] / count);
  const float mean_dy_xhat = static_cast<float>(sums[at + static_cast<std::size_t>(p.channels)] / count);
  const float x_hat = (x - mean) * inv;
  const float scale = gamma != nullptr ? gamma[mc] * inv : inv;
  return scale * (dy - mean_dy - x_hat * mean_dy_xhat);
}

// Dropout's keep threshold and scale for `rate` (layer_ops.h), in exact double arithmetic and one float
// division, so host and device agree.
struct DropoutKeep {
  std::uint32_t threshold;
  float scale;
};
PMAPCC_HD inline DropoutKeep dropout_keep(float rate) {
  const double t = floor(static_cast<double>(rate) * 4294967296.0 + 0.5);
  return DropoutKeep{t >= 4294967295.0 ? 4294967295u : static_cast<std::uint32_t>(t), 1.0f / (1.0f - rate)};
}

// Member m's rate.
PMAPCC_HD inline float dropout_rate(const DropoutParams& p, std::size_t m) {
  return p.rates != nullptr ? p.rates[m] : p.rate;
}

// Dropout of element i of (M, N, F) (layer_ops.h's DropoutParams), given its member's dropout_keep.
PMAPCC_HD inline float dropout_element(const DropoutParams& p, DropoutKeep keep, const std::uint32_t* keys,
                                       std::int64_t step, float x, std::size_t i) {
  const auto features = static_cast<std::size_t>(p.features);
  const std::size_t row = i / features, f = i % features + static_cast<std::size_t>(p.feature_offset);
  const std::size_t m = row / static_cast<std::size_t>(p.rows);
  const std::int64_t example = p.example_offset + static_cast<std::int64_t>(row % static_cast<std::size_t>(p.rows));
  const detail::Philox4 counter{{static_cast<std::uint32_t>(example), static_cast<std::uint32_t>(f / 4),
                                 static_cast<std::uint32_t>(step), p.stream}};
  const detail::Philox4 bits = detail::philox4x32_10(counter, keys[2 * m], keys[2 * m + 1]);
  return bits.v[f % 4] >= keep.threshold ? x * keep.scale : 0.0f;
}

}  // namespace pmap::kernels
