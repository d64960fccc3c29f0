// CPU softmax cross-entropy on integer labels: per-member mean loss (log-sum-exp), logits gradient,
// softmax probabilities and argmax hit counts, one row (sample) at a time.
#include <pmap/error.h>

#include <cmath>
#include <string>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/ops.h>

namespace PMAPCC_CPU_NS {
namespace {

using detail::Index;

void check_labels(const SoftmaxXentParams& p, const std::int32_t* labels) {
  const Index count = Index{p.batch} * (p.shared_labels ? 1 : p.members);
  for (Index i = 0; i < count; ++i) {
    if (labels[i] < 0 || labels[i] >= p.classes) {
      throw ValueError("softmax_cross_entropy: label " + std::to_string(labels[i]) + " at index " +
                       std::to_string(i) + " is outside [0, " + std::to_string(p.classes) + ")");
    }
  }
}

// One row: its max, argmax (first on ties) and sum of exp(logit - max), the sum in double.
struct RowStats {
  float max;
  int argmax;
  double sum_exp;
};

RowStats row_stats(const float* z, int k) {
  RowStats s{z[0], 0, 0.0};
  for (int j = 1; j < k; ++j) {
    if (z[j] > s.max) {
      s.max = z[j];
      s.argmax = j;
    }
  }
  for (int j = 0; j < k; ++j) s.sum_exp += std::exp(static_cast<double>(z[j]) - s.max);
  return s;
}

}  // namespace

std::size_t LossOpsImpl::softmax_cross_entropy_workspace_bytes(SoftmaxXentParams p) const {
  validate(p);
  return 0;
}

void LossOpsImpl::softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels,
                                        float* loss, float* dlogits, float* probs, std::int32_t* correct,
                                        std::int32_t*, void*) const {
  const char* op = "softmax_cross_entropy";
  detail::require(logits, op, "logits");
  validate(p);
  if (loss != nullptr || dlogits != nullptr || correct != nullptr) {
    detail::require(labels, op, "labels (needed for loss, dlogits and correct)");
    check_labels(p, labels);
  }
  const int k = p.classes;
  const double inv_batch = 1.0 / p.batch;
  for (int m = 0; m < p.members; ++m) {
    const std::int32_t* lm =
        labels == nullptr ? nullptr : labels + (p.shared_labels ? 0 : Index{m} * p.batch);
    double loss_sum = 0.0;
    std::int32_t hits = 0;
    for (int n = 0; n < p.batch; ++n) {
      const Index row = (Index{m} * p.batch + n) * k;
      const float* z = logits + row;
      const RowStats s = row_stats(z, k);
      const double log_sum = std::log(s.sum_exp);
      if (lm != nullptr) {
        loss_sum += log_sum - (static_cast<double>(z[lm[n]]) - s.max);
        hits += s.argmax == lm[n] ? 1 : 0;
      }
      for (int j = 0; j < k; ++j) {
        const double prob = std::exp(static_cast<double>(z[j]) - s.max - log_sum);
        if (probs != nullptr) probs[row + j] = static_cast<float>(prob);
        if (dlogits != nullptr) {
          const double target = j == lm[n] ? 1.0 : 0.0;
          dlogits[row + j] = static_cast<float>((prob - target) * inv_batch);
        }
      }
    }
    if (loss != nullptr) loss[m] = static_cast<float>(loss_sum * inv_batch);
    if (correct != nullptr) correct[m] = hits;
  }
}

}  // namespace PMAPCC_CPU_NS
