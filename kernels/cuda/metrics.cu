// The CUDA evaluation ops (kernels/metric_ops.h): the sum of members' probabilities, the division to a
// mean, argmax hit counts, the calibration sums and the predictions.
// One item per element, row or member, in the CPU ops' order, so host runs give the CPU's bits.
#include <cstdint>

#include <pmapcc/kernels/calibration.h>
#include <pmapcc/kernels/cuda/backend.h>

namespace pmap::kernels::gpu {
namespace {

struct SumMembers {
  int count;
  std::size_t n;
  const float* x;
  float* out;
  bool accumulate;
  PMAPCC_HD void operator()(std::size_t i) const {
    float acc = accumulate ? out[i] + x[i] : x[i];
    for (int j = 1; j < count; ++j) acc = acc + x[static_cast<std::size_t>(j) * n + i];
    out[i] = acc;
  }
};

struct Divide {
  float* x;
  float divisor;
  PMAPCC_HD void operator()(std::size_t i) const { x[i] = x[i] / divisor; }
};

// Per row: 1 into *hits when its argmax (first index on ties) is its label.
struct ArgmaxHits {
  int classes;
  const float* scores;
  const std::int32_t* labels;
  std::int32_t* hits;
  PMAPCC_HD void operator()(std::size_t row) const {
    const float* s = scores + row * classes;
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (s[c] > s[best]) best = c;
    if (best == labels[row]) detail::atomic_add(hits, 1);
  }
};

// Item (predictor, row): the row's statistics into the workspace; bin -1 marks a label out of range (the
// row then adds nothing).
struct CalibrationRows {
  CalibrationParams p;
  const float* probs;
  const std::int32_t* labels;
  RowCalibration* rows;
  PMAPCC_HD void operator()(std::size_t i) const {
    const std::size_t r = i % static_cast<std::size_t>(p.rows);
    const int label = labels[r];
    if (label < 0 || label >= p.classes) {
      rows[i] = RowCalibration{};
      rows[i].bin = -1;
      return;
    }
    rows[i] = row_calibration(probs + i * p.classes, p.classes, label);
  }
};

// Item (predictor, s), s < 4 + bins: slot s's sum over the predictor's rows in row order (s >= 4: bin
// s - 4's count, confidence sum and hits), added to sums.
struct CalibrationSlotSums {
  CalibrationParams p;
  const RowCalibration* rows;
  double* sums;
  PMAPCC_HD void operator()(std::size_t i) const {
    constexpr int kItems = 4 + kCalibrationBins;
    const std::size_t q = i / kItems;
    const int s = static_cast<int>(i % kItems);
    const RowCalibration* rq = rows + q * static_cast<std::size_t>(p.rows);
    double* out = sums + q * kCalibrationSlots;
    if (s < 4) {
      double sum = 0;
      for (int r = 0; r < p.rows; ++r)
        if (rq[r].bin >= 0) sum += row_slot(rq[r], s);
      out[s] += sum;
      return;
    }
    const int b = s - 4;
    double count = 0, confidence = 0, hits = 0;
    for (int r = 0; r < p.rows; ++r) {
      if (rq[r].bin != b) continue;
      count += 1.0;
      confidence += rq[r].confidence;
      hits += rq[r].hit;
    }
    out[4 + 3 * b] += count;
    out[5 + 3 * b] += confidence;
    out[6 + 3 * b] += hits;
  }
};

struct Predictions {
  int classes;
  const float* probs;
  std::int32_t* predicted;
  float* probability;
  float* entropy;
  PMAPCC_HD void operator()(std::size_t r) const {
    const float* row = probs + r * classes;
    const int pred = predicted_class(row, classes);
    if (predicted != nullptr) predicted[r] = pred;
    if (probability != nullptr) probability[r] = row[pred];
    if (entropy != nullptr) entropy[r] = static_cast<float>(row_entropy(row, classes));
  }
};

}  // namespace

std::size_t CudaMetricOps::calibration_workspace_bytes(CalibrationParams p) const {
  validate(p);
  return static_cast<std::size_t>(p.predictors) * static_cast<std::size_t>(p.rows) * sizeof(RowCalibration) + 256;
}

void CudaMetricOps::calibration_sums(CalibrationParams p, const float* probs, const std::int32_t* labels, double* sums,
                                     void* workspace) const {
  const Exec& ex = ex_;
  require(probs, "calibration_sums", "probs");
  require(labels, "calibration_sums", "labels");
  require(sums, "calibration_sums", "sums");
  validate(p);
  if (workspace == nullptr) workspace = ex.scratch(calibration_workspace_bytes(p));
  auto* rows = reinterpret_cast<RowCalibration*>((reinterpret_cast<std::uintptr_t>(workspace) + 255) / 256 * 256);
  const std::size_t items = static_cast<std::size_t>(p.predictors) * static_cast<std::size_t>(p.rows);
  ex.launch(CalibrationRows{p, probs, labels, rows}, items);
  ex.launch(CalibrationSlotSums{p, rows, sums}, static_cast<std::size_t>(p.predictors) * (4 + kCalibrationBins));
}

void CudaMetricOps::predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                                float* entropy) const {
  const Exec& ex = ex_;
  require(probs, "predictions", "probs");
  validate_argmax_hits(rows, classes);
  ex.launch(Predictions{classes, probs, predicted, probability, entropy}, static_cast<std::size_t>(rows));
}

void CudaMetricOps::sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) const {
  const Exec& ex = ex_;
  require(x, "sum_members", "x");
  require(out, "sum_members", "out");
  if (count < 1) throw ValueError("sum_members: count must be >= 1, got " + std::to_string(count));
  ex.launch(SumMembers{count, n, x, out, accumulate}, n);
}

void CudaMetricOps::divide(std::size_t n, float* x, float divisor) const {
  const Exec& ex = ex_;
  require(x, "divide", "x");
  ex.launch(Divide{x, divisor}, n);
}

void CudaMetricOps::argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels,
                                std::int32_t* hits) const {
  const Exec& ex = ex_;
  require(scores, "argmax_hits", "scores");
  require(labels, "argmax_hits", "labels");
  require(hits, "argmax_hits", "hits");
  validate_argmax_hits(rows, classes);
  ex.launch(ArgmaxHits{classes, scores, labels, hits}, static_cast<std::size_t>(rows));
}

}  // namespace pmap::kernels::gpu
