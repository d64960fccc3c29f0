// What training reports. The records (EpochMetrics, Calibration, ...) are plain data defined with their file
// format in io/metrics.h; the training layer computes them, from the sums its kernels accumulate.
#pragma once

#include <vector>

#include <pmapcc/io/metrics.h>

namespace pmap::train {

using io::Calibration;
using io::EpochMetrics;
using io::Predictions;
using io::ReliabilityBin;
using io::SizePoint;

// The calibration of a predictor from its sums over the test set (kernels::CalibrationParams's slots:
// kernels::kCalibrationSlots doubles). NaN everywhere when there are no rows.
Calibration calibration_from_sums(const std::vector<double>& slots);
// The accuracy the same sums give: hits / rows.
double accuracy_from_sums(const std::vector<double>& slots);

}  // namespace pmap::train
