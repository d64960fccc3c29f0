// MetricOps: the op family of evaluation, what the ensemble's eval and report steps compute from the
// members' probabilities: their sum and mean over members, hit counts, the calibration statistics and the per-row predictions. One CPU implementation
// (kernels/cpu/shared/cpu_metrics.cpp, compiled once outside the ISA variants) and one CUDA one
// (kernels/cuda/metrics.cu); both are plain loops in the same order (the calibration rows' arithmetic is
// kernels/calibration.h), so every CPU variant and the CUDA kernels run on the host give the same bits.
// Pointers are in the memory of the backend's device, as everywhere in kernels/backend.h; shapes and
// CalibrationParams are kernels/ops.h's.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmapcc/kernels/op_list.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

class MetricOps {
 public:
  virtual ~MetricOps() = default;

  // The ops, each with its contract: kernels/metric_ops.def.
#define PMAPCC_OP PMAPCC_OP_VIRTUAL
#include <pmapcc/kernels/metric_ops.def>
};

}  // namespace pmap::kernels
