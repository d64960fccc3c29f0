// The CPU's evaluation ops (kernels/metric_ops.h): plain loops compiled once, outside the ISA variants and
// without FMA contraction, so every variant gives the same bits; one instance serves every variant.
#include <pmapcc/kernels/cpu_backend.h>

#include <string>

#include <pmap/error.h>

#include <pmapcc/kernels/calibration.h>

namespace pmap::kernels {
namespace {

class CpuMetricOps final : public MetricOps {
 public:
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/metric_ops.def>
};

void CpuMetricOps::sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) const {
  require(x, "sum_members", "x");
  require(out, "sum_members", "out");
  if (count < 1) throw ValueError("sum_members: count must be >= 1, got " + std::to_string(count));
  for (std::size_t i = 0; i < n; ++i) out[i] = accumulate ? out[i] + x[i] : x[i];
  for (int j = 1; j < count; ++j) {
    const float* xj = x + static_cast<std::size_t>(j) * n;
    for (std::size_t i = 0; i < n; ++i) out[i] = out[i] + xj[i];
  }
}

void CpuMetricOps::divide(std::size_t n, float* x, float divisor) const {
  require(x, "divide", "x");
  for (std::size_t i = 0; i < n; ++i) x[i] /= divisor;
}

void CpuMetricOps::argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels,
                               std::int32_t* hits) const {
  require(scores, "argmax_hits", "scores");
  require(labels, "argmax_hits", "labels");
  require(hits, "argmax_hits", "hits");
  validate_argmax_hits(rows, classes);
  for (int r = 0; r < rows; ++r) {
    const float* s = scores + static_cast<std::size_t>(r) * classes;
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (s[c] > s[best]) best = c;
    *hits += best == labels[r] ? 1 : 0;
  }
}

void CpuMetricOps::calibration_sums(CalibrationParams p, const float* probs, const std::int32_t* labels, double* sums,
                                    void*) const {
  require(probs, "calibration_sums", "probs");
  require(labels, "calibration_sums", "labels");
  require(sums, "calibration_sums", "sums");
  validate(p);
  for (int r = 0; r < p.rows; ++r)
    if (labels[r] < 0 || labels[r] >= p.classes)
      throw ValueError("calibration_sums: label " + std::to_string(labels[r]) + " at row " + std::to_string(r) +
                       " is outside [0, " + std::to_string(p.classes) + ")");
  for (int q = 0; q < p.predictors; ++q) {
    double partial[kCalibrationSlots] = {};
    for (int r = 0; r < p.rows; ++r) {
      const float* row = probs + (static_cast<std::size_t>(q) * p.rows + r) * p.classes;
      const RowCalibration c = row_calibration(row, p.classes, labels[r]);
      for (int s = 0; s < 4; ++s) partial[s] += row_slot(c, s);
      double* bin = partial + 4 + 3 * c.bin;
      bin[0] += 1.0;
      bin[1] += c.confidence;
      bin[2] += c.hit;
    }
    double* out = sums + static_cast<std::size_t>(q) * kCalibrationSlots;
    for (int s = 0; s < kCalibrationSlots; ++s) out[s] += partial[s];
  }
}

void CpuMetricOps::predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                               float* entropy) const {
  require(probs, "predictions", "probs");
  validate_argmax_hits(rows, classes);
  for (int r = 0; r < rows; ++r) {
    const float* row = probs + static_cast<std::size_t>(r) * classes;
    const int pred = predicted_class(row, classes);
    if (predicted != nullptr) predicted[r] = pred;
    if (probability != nullptr) probability[r] = row[pred];
    if (entropy != nullptr) entropy[r] = static_cast<float>(row_entropy(row, classes));
  }
}

std::size_t CpuMetricOps::calibration_workspace_bytes(CalibrationParams p) const {
  validate(p);
  return 0;
}

}  // namespace

const MetricOps& CpuBackend::metrics() const {
  static const CpuMetricOps ops;
  return ops;
}

}  // namespace pmap::kernels
