// CUDA softmax cross-entropy on integer labels in two launches: one item per row (sample) computes its
// max, log-sum-exp, probabilities and gradient in double as the CPU op does, and leaves its loss and hit
// in the workspace; then one item per member sums its rows in row order (the CPU's order, so a host run
// gives the CPU op's bits).
#include <math.h>  // exp, log: glibc on the host, CUDA's on the device

#include <cstdint>

#include <pmapcc/kernels/cuda/backend.h>

namespace pmap::kernels::gpu {
namespace {

constexpr std::size_t kAlign = 256;

std::size_t rows_of(const SoftmaxXentParams& p) { return static_cast<std::size_t>(p.members) * p.batch; }

// Per row: its loss term (0 without a valid label) and hit: 1 argmax == label, 0 not, -1 a bad label.
struct RowResults {
  double* loss;
  std::int32_t* hit;
};

std::size_t workspace_bytes(const SoftmaxXentParams& p) {
  validate(p);
  return rows_of(p) * (sizeof(double) + sizeof(std::int32_t)) + kAlign;
}

RowResults carve(const Exec& ex, const SoftmaxXentParams& p, void* workspace) {
  if (workspace == nullptr) workspace = ex.scratch(workspace_bytes(p));
  const auto base = (reinterpret_cast<std::uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign;
  auto* loss = reinterpret_cast<double*>(base);
  return RowResults{loss, reinterpret_cast<std::int32_t*>(loss + rows_of(p))};
}

struct XentRows {
  SoftmaxXentParams p;
  const float* logits;
  const std::int32_t* labels;
  float* dlogits;
  float* probs;
  RowResults rows;
  PMAPCC_HD void operator()(std::size_t row) const {
    const int k = p.classes;
    const std::size_t m = row / static_cast<std::size_t>(p.batch), n = row % static_cast<std::size_t>(p.batch);
    const float* z = logits + row * k;
    float max = z[0];
    int argmax = 0;
    for (int j = 1; j < k; ++j) {
      if (z[j] > max) max = z[j], argmax = j;  // the first index on ties, as jnp.argmax
    }
    double sum_exp = 0.0;
    for (int j = 0; j < k; ++j) sum_exp += ::exp(static_cast<double>(z[j]) - max);
    const double log_sum = ::log(sum_exp);
    const int label = labels == nullptr ? -1 : labels[(p.shared_labels ? 0 : m * p.batch) + n];
    const bool valid = labels != nullptr && label >= 0 && label < k;
    rows.loss[row] = valid ? log_sum - (static_cast<double>(z[label]) - max) : 0.0;
    rows.hit[row] = labels == nullptr ? 0 : (!valid ? -1 : (argmax == label ? 1 : 0));
    const double inv_batch = 1.0 / p.batch;
    for (int j = 0; j < k; ++j) {
      const double prob = ::exp(static_cast<double>(z[j]) - max - log_sum);
      if (probs != nullptr) probs[row * k + j] = static_cast<float>(prob);
      if (dlogits != nullptr) {
        const double target = j == label ? 1.0 : 0.0;
        dlogits[row * k + j] = valid ? static_cast<float>((prob - target) * inv_batch) : 0.0f;
      }
    }
  }
};

// Per member: the mean loss and the hit count over its rows, in row order. A bad label is counted once:
// with shared labels only member 0 counts them.
struct XentMembers {
  SoftmaxXentParams p;
  RowResults rows;
  float* loss;
  std::int32_t* correct;
  std::int32_t* bad_labels;
  PMAPCC_HD void operator()(std::size_t m) const {
    double sum = 0.0;
    int hits = 0, bad = 0;
    for (std::size_t r = m * p.batch; r < (m + 1) * p.batch; ++r) {
      sum += rows.loss[r];
      hits += rows.hit[r] == 1 ? 1 : 0;
      bad += rows.hit[r] < 0 ? 1 : 0;
    }
    if (loss != nullptr) loss[m] = static_cast<float>(sum * (1.0 / p.batch));
    if (correct != nullptr) correct[m] = hits;
    if (bad_labels != nullptr && bad != 0 && (!p.shared_labels || m == 0)) detail::atomic_add(bad_labels, bad);
  }
};

}  // namespace

std::size_t CudaLossOps::softmax_cross_entropy_workspace_bytes(SoftmaxXentParams p) const { return workspace_bytes(p); }

void CudaLossOps::softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels,
                                        float* loss, float* dlogits, float* probs, std::int32_t* correct,
                                        std::int32_t* bad_labels, void* workspace) const {
  const Exec& ex = ex_;
  const char* op = "softmax_cross_entropy";
  require(logits, op, "logits");
  validate(p);
  if (loss != nullptr || dlogits != nullptr || correct != nullptr)
    require(labels, op, "labels (needed for loss, dlogits and correct)");
  const RowResults rows = carve(ex, p, workspace);
  ex.launch(XentRows{p, logits, labels, dlogits, probs, rows}, rows_of(p));
  if (loss != nullptr || correct != nullptr || bad_labels != nullptr)
    ex.launch(XentMembers{p, rows, loss, correct, bad_labels}, static_cast<std::size_t>(p.members));
}

}  // namespace pmap::kernels::gpu
