// Calibration and accuracy from the sums the evaluation kernels accumulate.
#include <pmapcc/train/metrics.h>

#include <cmath>
#include <limits>

#include <pmapcc/kernels/ops.h>

namespace pmap::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

Calibration calibration_from_sums(const std::vector<double>& slots) {
  Calibration c;
  double rows = 0, gap = 0;
  for (int b = 0; b < kernels::kCalibrationBins; ++b) {
    const double count = slots.at(4 + 3 * static_cast<std::size_t>(b)), confidence = slots.at(5 + 3 * b),
                 hits = slots.at(6 + 3 * b);
    rows += count;
    gap += std::abs(hits - confidence);
    c.bins.push_back({count, count > 0 ? confidence / count : kNaN, count > 0 ? hits / count : kNaN});
  }
  c.nll = rows > 0 ? slots.at(0) / rows : kNaN;
  c.brier = rows > 0 ? slots.at(1) / rows : kNaN;
  c.entropy = rows > 0 ? slots.at(2) / rows : kNaN;
  c.ece = rows > 0 ? gap / rows : kNaN;
  return c;
}

double accuracy_from_sums(const std::vector<double>& slots) {
  double rows = 0;
  for (int b = 0; b < kernels::kCalibrationBins; ++b) rows += slots.at(4 + 3 * static_cast<std::size_t>(b));
  return rows > 0 ? slots.at(3) / rows : kNaN;
}

}  // namespace pmap::train
