// MetricOps: the op family of evaluation, what the ensemble's eval and report steps compute from the
// members' probabilities: their sum and mean over members, hit counts, the running per-member sums of a
// batch's pieces, the calibration statistics and the per-row predictions. One CPU implementation
// (kernels/cpu_metrics.cpp, compiled once outside the ISA variants) and one CUDA one
// (kernels/cuda/metrics.cu); both are plain loops in the same order (the calibration rows' arithmetic is
// kernels/calibration.h), so every CPU variant and the CUDA kernels run on the host give the same bits.
// Pointers are in the memory of the backend's device, as everywhere in kernels/backend.h; shapes and
// CalibrationParams are kernels/ops.h's.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

class MetricOps {
 public:
  virtual ~MetricOps() = default;

  // out (n) = x_0 + x_1 + ... + x_{count-1} over count blocks of x (count, n), added in member order as
  // floats; with accumulate, out + x_0 + ... (a later group of members). out must not overlap x.
  virtual void sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) const = 0;

  // x[i] = x[i] / divisor for n elements (the ensemble mean from a sum of members' probabilities).
  virtual void divide(std::size_t n, float* x, float divisor) const = 0;

  // *hits += the rows r of scores (rows, classes) whose argmax (first index on ties) equals labels[r].
  virtual void argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels,
                           std::int32_t* hits) const = 0;

  // For each of count members: loss_sum[m] += double(loss[m]) * rows; hits[m] += correct[m] (the running
  // sums of an evaluation over pieces of a batch).
  virtual void accumulate_metrics(int count, const float* loss, const std::int32_t* correct, double rows,
                                  double* loss_sum, std::int32_t* hits) const = 0;

  // out[m] = float(sums[m] / divisor) for count members.
  virtual void mean_from_sums(int count, const double* sums, double divisor, float* out) const = 0;

  // Bytes of workspace calibration_sums needs (CPU: 0).
  virtual std::size_t calibration_workspace_bytes(CalibrationParams p) const = 0;

  // sums (predictors, kCalibrationSlots) f64 += the calibration sums (see CalibrationParams) of probs
  // (predictors, rows, classes) against labels (rows), each slot's sum over the rows taken first, in row
  // order, then added. A label outside [0, classes): the CPU raises ValueError, CUDA leaves the row out.
  virtual void calibration_sums(CalibrationParams p, const float* probs, const std::int32_t* labels, double* sums,
                                void* workspace) const = 0;

  // Per row of probs (rows, classes): the predicted class (argmax, first index on ties), its probability
  // and the predictive entropy -sum_c p log p (computed in double). Each output optional (nullptr).
  virtual void predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                           float* entropy) const = 0;
};

}  // namespace pmap::kernels
