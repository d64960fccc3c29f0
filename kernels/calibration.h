// The per-row arithmetic of the calibration statistics and predictions (kernels/metric_ops.h: calibration_sums,
// predictions), written once for the CPU ops and the CUDA kernels (PMAPCC_HD), so both produce the same
// bits; what the ops add up is checked against hand-computed values in tests/test_calibration.cpp.
#pragma once

#include <math.h>  // log: glibc on the host, CUDA's on the device

#include <pmap/detail/launch.h>

#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

// One row's contributions to the slots of kernels::CalibrationParams.
struct RowCalibration {
  double nll = 0, brier = 0, entropy = 0, confidence = 0;
  int hit = 0;
  int bin = 0;
};

// The predicted class (first index of the largest probability) of a row.
PMAPCC_HD inline int predicted_class(const float* p, int classes) {
  int best = 0;
  for (int c = 1; c < classes; ++c)
    if (p[c] > p[best]) best = c;
  return best;
}

// -sum_c p[c] log p[c], in double, 0 log 0 = 0.
PMAPCC_HD inline double row_entropy(const float* p, int classes) {
  double h = 0;
  for (int c = 0; c < classes; ++c)
    if (p[c] > 0.0f) h -= static_cast<double>(p[c]) * ::log(static_cast<double>(p[c]));
  return h;
}

// The statistics of one row of probabilities p (classes) whose true class is `label` (in range).
PMAPCC_HD inline RowCalibration row_calibration(const float* p, int classes, int label) {
  RowCalibration r;
  const int pred = predicted_class(p, classes);
  const double p_label = static_cast<double>(p[label]);
  r.nll = -::log(p_label > kMinProbability ? p_label : kMinProbability);
  for (int c = 0; c < classes; ++c) {
    const double d = static_cast<double>(p[c]) - (c == label ? 1.0 : 0.0);
    r.brier += d * d;
  }
  r.entropy = row_entropy(p, classes);
  r.confidence = static_cast<double>(p[pred]);
  r.hit = pred == label ? 1 : 0;
  const int bin = static_cast<int>(r.confidence * kCalibrationBins);
  r.bin = bin < 0 ? 0 : (bin >= kCalibrationBins ? kCalibrationBins - 1 : bin);
  return r;
}

// What slot `slot` (< 4) of a row adds, and whether a row adds to bin b's three slots.
PMAPCC_HD inline double row_slot(const RowCalibration& r, int slot) {
  return slot == 0 ? r.nll : slot == 1 ? r.brier : slot == 2 ? r.entropy : static_cast<double>(r.hit);
}

}  // namespace pmap::kernels
