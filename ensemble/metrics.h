// The runner's names for the metrics records and their sums, which live in train/metrics.h (the runner goes
// with issue #51).
#pragma once

#include <pmapcc/train/metrics.h>

namespace pmap::ensemble {
using io::Calibration;
using io::EpochMetrics;
using io::Predictions;
using io::ReliabilityBin;
using io::SizePoint;
using train::accuracy_from_sums;
using train::calibration_from_sums;
}  // namespace pmap::ensemble
