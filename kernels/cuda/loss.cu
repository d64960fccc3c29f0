// CUDA softmax cross-entropy on integer labels: one block per member, one warp per row (sample); the
// row's max, log-sum-exp and probabilities in double as on the CPU, the loss and hit counts reduced in
// a fixed order on the device.
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops.h"

namespace pmap::kernels::gpu {
namespace {

constexpr int kWarps = 8;
constexpr unsigned kFullMask = 0xffffffffu;

struct XentArgs {
  SoftmaxXentParams p;
  const float* logits;
  const std::int32_t* labels;
  float* loss;
  float* dlogits;
  float* probs;
  std::int32_t* correct;
  std::int32_t* bad_labels;
};

// The row's largest logit and its first index (jnp.argmax), across the warp.
__device__ void row_max(const float* z, int k, float& best, int& index) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  best = -INFINITY;
  index = k;  // "none yet"; any real entry wins
  for (int j = lane; j < k; j += 32) {
    if (index == k || z[j] > best) best = z[j], index = j;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullMask, best, offset);
    const int other_index = __shfl_xor_sync(kFullMask, index, offset);
    const bool take = other_index < k && (index == k || other > best || (other == best && other_index < index));
    if (take) best = other, index = other_index;
  }
}

__device__ double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// One row: writes probs / dlogits, and returns (on every lane) its loss and hit, 0 for a bad label.
__device__ void row_xent(const XentArgs& a, std::size_t row, int label, double inv_batch, double& loss, int& hit) {
  const int k = a.p.classes;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const float* z = a.logits + row * k;
  float max;
  int argmax;
  row_max(z, k, max, argmax);
  double sum_exp = 0.0;
  for (int j = lane; j < k; j += 32) sum_exp += exp(static_cast<double>(z[j]) - max);
  const double log_sum = log(warp_sum(sum_exp));
  const bool valid = label >= 0 && label < k;
  loss = valid ? log_sum - (static_cast<double>(z[label]) - max) : 0.0;
  hit = valid && argmax == label ? 1 : 0;
  for (int j = lane; j < k; j += 32) {
    const double prob = exp(static_cast<double>(z[j]) - max - log_sum);
    if (a.probs != nullptr) a.probs[row * k + j] = static_cast<float>(prob);
    if (a.dlogits != nullptr) {
      const double target = j == label ? 1.0 : 0.0;
      a.dlogits[row * k + j] = valid ? static_cast<float>((prob - target) * inv_batch) : 0.0f;
    }
  }
}

// Block m: member m's rows, warp w taking rows w, w + kWarps, ...; sums in warp order.
__global__ void xent_kernel(XentArgs a) {
  __shared__ double warp_loss[kWarps];
  __shared__ int warp_hits[kWarps];
  const int m = static_cast<int>(blockIdx.x);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const double inv_batch = 1.0 / a.p.batch;
  const std::int32_t* labels =
      a.labels == nullptr ? nullptr : a.labels + (a.p.shared_labels ? 0 : static_cast<std::size_t>(m) * a.p.batch);
  double loss_sum = 0.0;
  int hits = 0;
  for (int n = warp; n < a.p.batch; n += kWarps) {
    const int label = labels == nullptr ? -1 : labels[n];
    if (labels != nullptr && (label < 0 || label >= a.p.classes) && lane == 0 && a.bad_labels != nullptr)
      atomicAdd(a.bad_labels, 1);
    double loss;
    int hit;
    row_xent(a, static_cast<std::size_t>(m) * a.p.batch + n, label, inv_batch, loss, hit);
    loss_sum += loss;
    hits += hit;
  }
  if (lane == 0) warp_loss[warp] = loss_sum, warp_hits[warp] = hits;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0.0;
  int total_hits = 0;
  for (int w = 0; w < kWarps; ++w) total += warp_loss[w], total_hits += warp_hits[w];
  if (a.loss != nullptr) a.loss[m] = static_cast<float>(total * inv_batch);
  if (a.correct != nullptr) a.correct[m] = total_hits;
}

}  // namespace

void softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels, float* loss,
                           float* dlogits, float* probs, std::int32_t* correct, std::int32_t* bad_labels) {
  const char* op = "softmax_cross_entropy";
  require(logits, op, "logits");
  validate(p);
  if (loss != nullptr || dlogits != nullptr || correct != nullptr)
    require(labels, op, "labels (needed for loss, dlogits and correct)");
  const XentArgs args{p, logits, labels, loss, dlogits, probs, correct, bad_labels};
  xent_kernel<<<static_cast<unsigned>(p.members), kWarps * 32, 0, current_stream()>>>(args);
  PMAPCC_CHECK_LAUNCH();
}

}  // namespace pmap::kernels::gpu
