// CUDA versions of the ensemble's reductions (kernels/ops.h, "reductions of the ensemble step"): the sum
// of members' probabilities, the division to a mean, argmax hit counts and the per-member metric sums.
// One item per element, row or member, in the CPU ops' order, so host runs give the CPU's bits.
#include "kernels/cuda/ops.h"

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

struct AccumulateMetrics {
  const float* loss;
  const std::int32_t* correct;
  double rows;
  double* loss_sum;
  std::int32_t* hits;
  PMAPCC_HD void operator()(std::size_t m) const {
    loss_sum[m] += static_cast<double>(loss[m]) * rows;
    hits[m] += correct[m];
  }
};

struct MeanFromSums {
  const double* sums;
  double divisor;
  float* out;
  PMAPCC_HD void operator()(std::size_t m) const { out[m] = static_cast<float>(sums[m] / divisor); }
};

}  // namespace

void sum_members(const Exec& ex, int count, std::size_t n, const float* x, float* out, bool accumulate) {
  require(x, "sum_members", "x");
  require(out, "sum_members", "out");
  if (count < 1) throw ValueError("sum_members: count must be >= 1, got " + std::to_string(count));
  ex.launch(SumMembers{count, n, x, out, accumulate}, n);
}

void divide(const Exec& ex, std::size_t n, float* x, float divisor) {
  require(x, "divide", "x");
  ex.launch(Divide{x, divisor}, n);
}

void argmax_hits(const Exec& ex, int rows, int classes, const float* scores, const std::int32_t* labels,
                 std::int32_t* hits) {
  require(scores, "argmax_hits", "scores");
  require(labels, "argmax_hits", "labels");
  require(hits, "argmax_hits", "hits");
  validate_argmax_hits(rows, classes);
  ex.launch(ArgmaxHits{classes, scores, labels, hits}, static_cast<std::size_t>(rows));
}

void accumulate_metrics(const Exec& ex, int count, const float* loss, const std::int32_t* correct, double rows,
                        double* loss_sum, std::int32_t* hits) {
  require(loss, "accumulate_metrics", "loss");
  require(correct, "accumulate_metrics", "correct");
  require(loss_sum, "accumulate_metrics", "loss_sum");
  require(hits, "accumulate_metrics", "hits");
  ex.launch(AccumulateMetrics{loss, correct, rows, loss_sum, hits}, static_cast<std::size_t>(count < 0 ? 0 : count));
}

void mean_from_sums(const Exec& ex, int count, const double* sums, double divisor, float* out) {
  require(sums, "mean_from_sums", "sums");
  require(out, "mean_from_sums", "out");
  ex.launch(MeanFromSums{sums, divisor, out}, static_cast<std::size_t>(count < 0 ? 0 : count));
}

}  // namespace pmap::kernels::gpu
