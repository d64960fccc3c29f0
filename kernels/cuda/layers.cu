// CUDA layer ops (kernels/layer_ops.h): one item per element for apply, backward, dropout and rescaling; one
// per (member, channel) for the sums and statistics, looping over the rows in the CPU's order, so a host run
// checks them bit for bit. The arithmetic is kernels/layer_math.h's, shared with the CPU ops; no FMA
// contraction (-fmad=false). The step counter and the members' keys are read on the device. The per-channel
// sums are correct but serial over the rows: a block reduction is the next step for large batches on a GPU.
#include <pmap/error.h>

#include <string>

#include <pmapcc/kernels/cuda/backend.h>
#include <pmapcc/kernels/layer_math.h>

namespace pmap::kernels::gpu {
namespace {

struct BnSums {
  BatchNormParams p;
  const float* x;
  double* sums;
  PMAPCC_HD void operator()(std::size_t mc) const {
    const auto c = static_cast<std::size_t>(p.channels);
    const std::size_t m = mc / c, k = mc % c;
    double s = 0.0, s2 = 0.0;
    const float* xm = x + m * static_cast<std::size_t>(p.rows) * c + k;
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const double v = xm[static_cast<std::size_t>(r) * c];
      s += v;
      s2 += v * v;
    }
    sums[m * 2 * c + k] = s;
    sums[m * 2 * c + c + k] = s2;
  }
};

struct BnStats {
  BatchNormParams p;
  const double* sums;
  double count;
  float* moving_mean;
  float* moving_variance;
  float* stats;
  PMAPCC_HD void operator()(std::size_t mc) const {
    batch_norm_channel_stats(p, sums, count, moving_mean, moving_variance, stats, mc);
  }
};

struct BnApply {
  BatchNormParams p;
  const float* x;
  const float* stats;
  const float* gamma;
  const float* beta;
  float* y;
  PMAPCC_HD void operator()(std::size_t i) const { y[i] = batch_norm_element(p, stats, gamma, beta, x[i], i); }
};

struct BnBackwardSums {
  BatchNormParams p;
  const float* x;
  const float* dy;
  const float* stats;
  double* sums;
  float* dgamma;
  float* dbeta;
  PMAPCC_HD void operator()(std::size_t mc) const {
    const auto c = static_cast<std::size_t>(p.channels);
    const std::size_t m = mc / c, k = mc % c;
    const float mean = stats[m * 2 * c + k], inv = stats[m * 2 * c + c + k];
    double s = 0.0, s2 = 0.0;
    const std::size_t base = m * static_cast<std::size_t>(p.rows) * c + k;
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const std::size_t i = base + static_cast<std::size_t>(r) * c;
      const float x_hat = (x[i] - mean) * inv;
      s += static_cast<double>(dy[i]);
      s2 += static_cast<double>(dy[i] * x_hat);
    }
    sums[m * 2 * c + k] = s;
    sums[m * 2 * c + c + k] = s2;
    if (dbeta != nullptr) dbeta[mc] = static_cast<float>(s);
    if (dgamma != nullptr) dgamma[mc] = static_cast<float>(s2);
  }
};

struct BnBackward {
  BatchNormParams p;
  const float* x;
  const float* dy;
  const float* stats;
  const double* sums;
  double count;
  const float* gamma;
  float* dx;
  PMAPCC_HD void operator()(std::size_t i) const {
    dx[i] = batch_norm_dx(p, stats, sums, count, gamma, x[i], dy[i], i);
  }
};

struct Dropout {
  DropoutParams p;
  const std::uint32_t* keys;
  const std::int64_t* step;
  const float* x;
  float* y;
  PMAPCC_HD void operator()(std::size_t i) const {
    const std::size_t m = i / (static_cast<std::size_t>(p.rows) * static_cast<std::size_t>(p.features));
    y[i] = dropout_element(p, dropout_keep(dropout_rate(p, m)), keys, *step, x[i], i);
  }
};

struct ScaleShift {
  const float* x;
  float scale;
  float offset;
  float* y;
  PMAPCC_HD void operator()(std::size_t i) const { y[i] = x[i] * scale + offset; }
};

std::size_t channels_of(const BatchNormParams& p) {
  return static_cast<std::size_t>(p.members) * static_cast<std::size_t>(p.channels);
}
std::size_t elements_of(const BatchNormParams& p) { return channels_of(p) * static_cast<std::size_t>(p.rows); }

}  // namespace

void CudaLayerOps::batch_norm_sums(BatchNormParams p, const float* x, double* sums) const {
  validate(p);
  require(x, "batch_norm_sums", "x");
  require(sums, "batch_norm_sums", "sums");
  ex_.launch(BnSums{p, x, sums}, channels_of(p));
}

void CudaLayerOps::batch_norm_statistics(BatchNormParams p, const double* sums, double count, float* moving_mean,
                                         float* moving_variance, float* stats) const {
  validate(p);
  require(moving_mean, "batch_norm_statistics", "moving_mean");
  require(moving_variance, "batch_norm_statistics", "moving_variance");
  require(stats, "batch_norm_statistics", "stats");
  if (sums != nullptr && !(count >= 1)) throw ValueError("batch_norm_statistics: count must be >= 1");
  ex_.launch(BnStats{p, sums, count, moving_mean, moving_variance, stats}, channels_of(p));
}

void CudaLayerOps::batch_norm_apply(BatchNormParams p, const float* x, const float* stats, const float* gamma,
                                    const float* beta, float* y) const {
  validate(p);
  require(x, "batch_norm_apply", "x");
  require(stats, "batch_norm_apply", "stats");
  require(y, "batch_norm_apply", "y");
  ex_.launch(BnApply{p, x, stats, gamma, beta, y}, elements_of(p));
}

void CudaLayerOps::batch_norm_backward_sums(BatchNormParams p, const float* x, const float* dy, const float* stats,
                                            double* sums, float* dgamma, float* dbeta) const {
  validate(p);
  require(x, "batch_norm_backward_sums", "x");
  require(dy, "batch_norm_backward_sums", "dy");
  require(stats, "batch_norm_backward_sums", "stats");
  require(sums, "batch_norm_backward_sums", "sums");
  ex_.launch(BnBackwardSums{p, x, dy, stats, sums, dgamma, dbeta}, channels_of(p));
}

void CudaLayerOps::batch_norm_backward(BatchNormParams p, const float* x, const float* dy, const float* stats,
                                       const double* sums, double count, const float* gamma, float* dx) const {
  validate(p);
  require(x, "batch_norm_backward", "x");
  require(dy, "batch_norm_backward", "dy");
  require(stats, "batch_norm_backward", "stats");
  require(sums, "batch_norm_backward", "sums");
  require(dx, "batch_norm_backward", "dx");
  if (!(count >= 1)) throw ValueError("batch_norm_backward: count must be >= 1");
  ex_.launch(BnBackward{p, x, dy, stats, sums, count, gamma, dx}, elements_of(p));
}

void CudaLayerOps::dropout(DropoutParams p, const std::uint32_t* keys, const std::int64_t* step, const float* x,
                           float* y) const {
  validate(p);
  require(keys, "dropout", "keys");
  require(step, "dropout", "step");
  require(x, "dropout", "x");
  require(y, "dropout", "y");
  const std::size_t n =
      static_cast<std::size_t>(p.members) * static_cast<std::size_t>(p.rows) * static_cast<std::size_t>(p.features);
  ex_.launch(Dropout{p, keys, step, x, y}, n);
}

void CudaLayerOps::scale_shift(std::size_t n, const float* x, float scale, float offset, float* y) const {
  require(x, "scale_shift", "x");
  require(y, "scale_shift", "y");
  if (n > 0) ex_.launch(ScaleShift{x, scale, offset, y}, n);
}

}  // namespace pmap::kernels::gpu
