// CPU layer ops (kernels/layer_ops.h), the oracle of the CUDA kernels: kernels/layer_math.h's arithmetic,
// the same operations in the same order, run row by row over the channels (which vectorizes); the sums
// with one double accumulator per channel, which adds each channel's values in the same order as the CUDA
// kernels' per-channel loops. Compiled without FMA contraction, so every ISA variant gives the same bits.
#include <pmap/error.h>

#include <string>
#include <vector>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/cpu/ops.h>
#include <pmapcc/kernels/layer_math.h>

namespace PMAPCC_CPU_NS {

namespace {

// Per-channel double sums over the rows of one member's (rows, c) block, W channels at a time from channel
// k0: the accumulators stay in registers (the compiler keeps a fixed-width array there and vectorizes it),
// and each channel still adds its values row by row, so the bits are those of one loop per channel.
// Terms: kSquares adds x and x*x; otherwise dy and dy*x_hat (batch_norm_backward_sums).
template <int W, bool kSquares>
void channel_sums(std::int64_t rows, std::size_t c, std::size_t k0, const float* x, const float* dy,
                  const float* mean, const float* inv, double* s, double* s2) {
  double a[W] = {}, b[W] = {};
  float mk[W] = {}, ik[W] = {};
  if constexpr (!kSquares)
    for (int j = 0; j < W; ++j) mk[j] = mean[k0 + j], ik[j] = inv[k0 + j];
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * c + k0;
    if constexpr (kSquares) {
      for (int j = 0; j < W; ++j) {
        const double v = xr[j];
        a[j] += v;
        b[j] += v * v;
      }
    } else {
      const float* dr = dy + static_cast<std::size_t>(r) * c + k0;
      for (int j = 0; j < W; ++j) {
        const float x_hat = (xr[j] - mk[j]) * ik[j];
        a[j] += static_cast<double>(dr[j]);
        b[j] += static_cast<double>(dr[j] * x_hat);
      }
    }
  }
  for (int j = 0; j < W; ++j) s[k0 + j] = a[j], s2[k0 + j] = b[j];
}

// channel_sums over all c channels: blocks of 8, then 4, then single channels.
template <bool kSquares>
void all_channel_sums(std::int64_t rows, std::size_t c, const float* x, const float* dy, const float* mean,
                      const float* inv, double* s, double* s2) {
  std::size_t k = 0;
  for (; k + 8 <= c; k += 8) channel_sums<8, kSquares>(rows, c, k, x, dy, mean, inv, s, s2);
  for (; k + 4 <= c; k += 4) channel_sums<4, kSquares>(rows, c, k, x, dy, mean, inv, s, s2);
  for (; k < c; ++k) channel_sums<1, kSquares>(rows, c, k, x, dy, mean, inv, s, s2);
}

}  // namespace

void LayerOpsImpl::batch_norm_sums(BatchNormParams p, const float* x, double* sums) const {
  validate(p);
  detail::require(x, "batch_norm_sums", "x");
  detail::require(sums, "batch_norm_sums", "sums");
  const auto c = static_cast<std::size_t>(p.channels);
  for (int m = 0; m < p.members; ++m) {
    double* s = sums + static_cast<std::size_t>(m) * 2 * c;
    const float* xm = x + static_cast<std::size_t>(m) * static_cast<std::size_t>(p.rows) * c;
    all_channel_sums<true>(p.rows, c, xm, nullptr, nullptr, nullptr, s, s + c);
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

namespace {

// batch_norm_element's arithmetic (kernels/layer_math.h) row by row, the channel's values hoisted, so the
// compiler vectorizes over the channels; the same operations in the same order give the same bits.
template <bool kGamma, bool kBeta, bool kRelu>
void apply_rows(const BatchNormParams& p, const float* x, const float* stats, const float* gamma, const float* beta,
                float* y) {
  const auto c = static_cast<std::size_t>(p.channels);
  for (int m = 0; m < p.members; ++m) {
    const float* mean = stats + static_cast<std::size_t>(m) * 2 * c;
    const float* inv = mean + c;
    const float* g = kGamma ? gamma + static_cast<std::size_t>(m) * c : nullptr;
    const float* b = kBeta ? beta + static_cast<std::size_t>(m) * c : nullptr;
    const std::size_t base = static_cast<std::size_t>(m) * static_cast<std::size_t>(p.rows) * c;
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const float* xr = x + base + static_cast<std::size_t>(r) * c;
      float* yr = y + base + static_cast<std::size_t>(r) * c;
      for (std::size_t k = 0; k < c; ++k) {
        float v = (xr[k] - mean[k]) * inv[k];
        if constexpr (kGamma) v = v * g[k];
        if constexpr (kBeta) v = v + b[k];
        if constexpr (kRelu) v = v < 0.0f ? 0.0f : v;
        yr[k] = v;
      }
    }
  }
}

template <bool kGamma, bool kBeta>
void apply_rows(const BatchNormParams& p, const float* x, const float* stats, const float* gamma, const float* beta,
                float* y) {
  if (p.relu)
    apply_rows<kGamma, kBeta, true>(p, x, stats, gamma, beta, y);
  else
    apply_rows<kGamma, kBeta, false>(p, x, stats, gamma, beta, y);
}

}  // namespace

void LayerOpsImpl::batch_norm_apply(BatchNormParams p, const float* x, const float* stats, const float* gamma,
                                    const float* beta, float* y) const {
  validate(p);
  detail::require(x, "batch_norm_apply", "x");
  detail::require(stats, "batch_norm_apply", "stats");
  detail::require(y, "batch_norm_apply", "y");
  if (gamma != nullptr && beta != nullptr)
    apply_rows<true, true>(p, x, stats, gamma, beta, y);
  else if (gamma != nullptr)
    apply_rows<true, false>(p, x, stats, gamma, beta, y);
  else if (beta != nullptr)
    apply_rows<false, true>(p, x, stats, gamma, beta, y);
  else
    apply_rows<false, false>(p, x, stats, gamma, beta, y);
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
    const std::size_t base = static_cast<std::size_t>(m) * static_cast<std::size_t>(p.rows) * c;
    all_channel_sums<false>(p.rows, c, x + base, dy + base, mean, inv, s, s2);
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
  // batch_norm_dx's arithmetic row by row, its per-channel values computed once as it computes them.
  const auto c = static_cast<std::size_t>(p.channels);
  std::vector<float> scale(c), mean_dy(c), mean_dy_xhat(c);
  for (int m = 0; m < p.members; ++m) {
    const std::size_t at = static_cast<std::size_t>(m) * 2 * c;
    const float* mean = stats + at;
    const float* inv = mean + c;
    for (std::size_t k = 0; k < c; ++k) {
      scale[k] = gamma != nullptr ? gamma[static_cast<std::size_t>(m) * c + k] * inv[k] : inv[k];
      mean_dy[k] = static_cast<float>(sums[at + k] / count);
      mean_dy_xhat[k] = static_cast<float>(sums[at + c + k] / count);
    }
    const std::size_t base = static_cast<std::size_t>(m) * static_cast<std::size_t>(p.rows) * c;
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const std::size_t row = base + static_cast<std::size_t>(r) * c;
      for (std::size_t k = 0; k < c; ++k) {
        const float x_hat = (x[row + k] - mean[k]) * inv[k];
        dx[row + k] = scale[k] * (dy[row + k] - mean_dy[k] - x_hat * mean_dy_xhat[k]);
      }
    }
  }
}

void LayerOpsImpl::dropout(DropoutParams p, const std::uint32_t* keys, const std::int64_t* step, const float* x,
                           float* y) const {
  validate(p);
  detail::require(keys, "dropout", "keys");
  detail::require(step, "dropout", "step");
  detail::require(x, "dropout", "x");
  detail::require(y, "dropout", "y");
  // dropout_element's arithmetic, row by row: one Philox block gives the bits of 4 consecutive features
  // (feature f takes word f % 4 of block f / 4), so each block is drawn once, not once per element.
  const std::int64_t t = *step;
  const auto features = static_cast<std::size_t>(p.features);
  const auto offset = static_cast<std::size_t>(p.feature_offset);
  for (std::size_t m = 0; m < static_cast<std::size_t>(p.members); ++m) {
    const DropoutKeep keep = dropout_keep(dropout_rate(p, m));  // once per member, not per element
    const std::uint32_t k0 = keys[2 * m], k1 = keys[2 * m + 1];
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const std::size_t row = (m * static_cast<std::size_t>(p.rows) + static_cast<std::size_t>(r)) * features;
      const auto example = static_cast<std::uint32_t>(p.example_offset + r);
      ::pmap::detail::Philox4 bits{};
      for (std::size_t i = 0; i < features; ++i) {
        const std::size_t f = i + offset;
        if (i == 0 || f % 4 == 0) {
          const ::pmap::detail::Philox4 counter{
              {example, static_cast<std::uint32_t>(f / 4), static_cast<std::uint32_t>(t), p.stream}};
          bits = ::pmap::detail::philox4x32_10(counter, k0, k1);
        }
        y[row + i] = bits.v[f % 4] >= keep.threshold ? x[row + i] * keep.scale : 0.0f;
      }
    }
  }
}

void LayerOpsImpl::scale_shift(std::size_t n, const float* x, float scale, float offset, float* y) const {
  detail::require(x, "scale_shift", "x");
  detail::require(y, "scale_shift", "y");
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * scale + offset;
}

}  // namespace PMAPCC_CPU_NS
