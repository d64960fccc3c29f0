// The CPU reductions of the ensemble step (kernels/ops.h): member sums of probabilities, their mean,
// argmax hit counts and the running metric sums of an evaluation. Plain loops outside the ISA variants
// (kernels/cpu/), compiled without FMA contraction, so every build rounds them alike.
#include <string>

#include <pmap/error.h>

#include "kernels/calibration.h"
#include "kernels/ops.h"

namespace pmap::kernels::cpu {
namespace {

void require(const void* ptr, const char* op, const char* arg) {
  if (ptr == nullptr) throw ValueError(std::string(op) + ": " + arg + " is null");
}

}  // namespace

void sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) {
  require(x, "sum_members", "x");
  require(out, "sum_members", "out");
  if (count < 1) throw ValueError("sum_members: count must be >= 1, got " + std::to_string(count));
  for (std::size_t i = 0; i < n; ++i) out[i] = accumulate ? out[i] + x[i] : x[i];
  for (int j = 1; j < count; ++j) {
    const float* xj = x + static_cast<std::size_t>(j) * n;
    for (std::size_t i = 0; i < n; ++i) out[i] = out[i] + xj[i];
  }
}

void divide(std::size_t n, float* x, float divisor) {
  require(x, "divide", "x");
  for (std::size_t i = 0; i < n; ++i) x[i] /= divisor;
}

void argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels, std::int32_t* hits) {
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

void accumulate_metrics(int count, const float* loss, const std::int32_t* correct, double rows, double* loss_sum,
                        std::int32_t* hits) {
  require(loss, "accumulate_metrics", "loss");
  require(correct, "accumulate_metrics", "correct");
  require(loss_sum, "accumulate_metrics", "loss_sum");
  require(hits, "accumulate_metrics", "hits");
  for (int m = 0; m < count; ++m) {
    loss_sum[m] += static_cast<double>(loss[m]) * rows;
    hits[m] += correct[m];
  }
}

void mean_from_sums(int count, const double* sums, double divisor, float* out) {
  require(sums, "mean_from_sums", "sums");
  require(out, "mean_from_sums", "out");
  for (int m = 0; m < count; ++m) out[m] = static_cast<float>(sums[m] / divisor);
}

void calibration_sums(CalibrationParams p, const float* probs, const std::int32_t* labels, double* sums) {
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

void predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                 float* entropy) {
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

}  // namespace pmap::kernels::cpu
