// train_step and eval_step: forward, loss, backward, [pmean of gradients], SGD; and the ensemble's
// probability averaging across the mesh axis.
#include "ensemble/step.h"

#include <pmap/collectives.h>
#include <pmap/error.h>

#include <algorithm>
#include <vector>

namespace pmap::ensemble {
namespace {

std::int64_t classes_of(const Sequential& m) { return product(m.output_shape()); }

// The rows of the batch this device works on: all of them (ensemble), or its block (data parallel).
HostBatch local_block(const HostBatch& b, const StepOptions& opt, std::int64_t example_size) {
  if (!opt.data_parallel) return b;
  const int n = axis_size(opt.axis), r = axis_index(opt.axis);
  if (b.batch % n != 0)
    throw ShapeError("data-parallel batch of " + std::to_string(b.batch) + " does not split over " +
                     std::to_string(n) + " devices");
  const int rows = b.batch / n;
  return HostBatch{b.images + static_cast<std::int64_t>(r) * rows * example_size, b.labels + r * rows, rows};
}

// The steps read the batch and the ensemble probabilities through host pointers. Staging them into device
// buffers for CUDA devices is written but not merged with the eval-in-pieces step (see the CUDA issue),
// so CUDA training is refused here rather than handing host pointers to GPU kernels.
void require_cpu(const Device& d) {
  if (!d.is_cpu())
    throw NotAvailable("training on CUDA devices (" + d.str() + ") is not wired into the train/eval step in this "
                       "version: use --backend cpu");
}

}  // namespace

int default_member_group(const Device& device, int members) { return device.is_cpu() ? 1 : members; }

DeviceWork::DeviceWork(const Sequential& model, Device device, int members, int max_rows, int max_eval_batch,
                       int member_group)
    : runner(model, device, members, max_rows,
             member_group == 0 ? default_member_group(device, members) : member_group),
      grads(Shape{members * model.params_per_member()}, DType::f32, device),
      dlogits(Shape{runner.group(), max_rows, classes_of(model)}, DType::f32, device),
      probs(Shape{members, max_eval_batch, classes_of(model)}, DType::f32, device),
      mean_probs(Shape{max_eval_batch, classes_of(model)}, DType::f32, device),
      loss(static_cast<std::size_t>(members)),
      correct(static_cast<std::size_t>(members)),
      eval_loss_sum(static_cast<std::size_t>(members)),
      eval_hits(static_cast<std::size_t>(members)) {}

StepResult train_step(TrainState& state, DeviceWork& work, const HostBatch& batch, const StepOptions& opt) {
  require_cpu(work.runner.device());
  const auto& be = kernels::backend_for(work.runner.device().kind);
  const int members = work.runner.members(), group = work.runner.group();
  const HostBatch b = local_block(batch, opt, product(work.runner.model().input_shape()));
  const float* params = state.params.data<float>();
  for (int first = 0; first < members; first += group) {
    const int count = std::min(group, members - first);
    const float* logits = work.runner.forward(b.images, b.batch, params, first, count);
    kernels::SoftmaxXentParams xp{count, b.batch, static_cast<int>(classes_of(work.runner.model())), true};
    be.softmax_cross_entropy(xp, logits, b.labels, work.loss.data() + first, work.dlogits.data<float>(), nullptr,
                             work.correct.data() + first);
    work.runner.backward(b.images, params, work.dlogits.data<float>(), work.grads.data<float>());
  }
  if (opt.data_parallel) pmean_inplace(work.grads, opt.axis);
  be.sgd_momentum_update(opt.sgd, static_cast<std::size_t>(state.params.size()), state.params.data<float>(),
                         state.momentum.data<float>(), work.grads.data<float>());
  ++state.step;
  return StepResult{work.loss, work.correct, 0};
}

namespace {

// Per-member probabilities (members, b.batch, K) into work.probs, and mean loss and hit counts into
// work.loss / work.correct, running the batch through the model in pieces of at most max_batch rows.
void eval_probs(const TrainState& state, DeviceWork& work, const HostBatch& b) {
  const auto& be = kernels::backend_for(work.runner.device().kind);
  const int members = work.runner.members(), group = work.runner.group(), piece_max = work.runner.max_batch();
  const std::int64_t k = classes_of(work.runner.model()), example = product(work.runner.model().input_shape());
  std::fill(work.eval_loss_sum.begin(), work.eval_loss_sum.end(), 0.0);
  std::fill(work.eval_hits.begin(), work.eval_hits.end(), 0);
  for (int first = 0; first < b.batch; first += piece_max) {
    const int n = std::min(piece_max, b.batch - first);
    for (int m0 = 0; m0 < members; m0 += group) {
      const int count = std::min(group, members - m0);
      const float* logits = work.runner.forward(b.images + first * example, n, state.params.data<float>(), m0, count);
      kernels::SoftmaxXentParams xp{count, n, static_cast<int>(k), true};
      float* piece = work.dlogits.data<float>();  // (count, n, K)
      be.softmax_cross_entropy(xp, logits, b.labels + first, work.loss.data() + m0, nullptr, piece,
                               work.correct.data() + m0);
      for (int j = 0; j < count; ++j) {
        const auto m = static_cast<std::size_t>(m0 + j);
        work.eval_loss_sum[m] += static_cast<double>(work.loss[m]) * n;
        work.eval_hits[m] += work.correct[m];
        const auto row0 = static_cast<std::int64_t>(m) * b.batch + first;
        std::copy_n(piece + static_cast<std::int64_t>(j) * n * k, n * k, work.probs.data<float>() + row0 * k);
      }
    }
  }
  for (std::size_t m = 0; m < static_cast<std::size_t>(members); ++m) {
    work.loss[m] = static_cast<float>(work.eval_loss_sum[m] / b.batch);
    work.correct[m] = work.eval_hits[m];
  }
}

}  // namespace

StepResult eval_step(const TrainState& state, DeviceWork& work, const HostBatch& b, const StepOptions& opt) {
  require_cpu(work.runner.device());
  const int members = work.runner.members();
  const int k = static_cast<int>(classes_of(work.runner.model()));
  if (b.batch > work.mean_probs.shape()[0])
    throw ShapeError("eval_step: batch " + std::to_string(b.batch) + " exceeds the eval batch of " +
                     std::to_string(work.mean_probs.shape()[0]));
  eval_probs(state, work, b);
  const float* probs = work.probs.data<float>();
  // Ensemble: sum this device's members' probabilities in member order, then psum over the devices
  // (device order) and divide by the number of members.
  const std::size_t rows = static_cast<std::size_t>(b.batch) * static_cast<std::size_t>(k);
  Array& mean = work.mean_probs;
  float* m = mean.data<float>();
  std::copy(probs, probs + rows, m);
  for (int j = 1; j < members; ++j)
    for (std::size_t i = 0; i < rows; ++i) m[i] += probs[static_cast<std::size_t>(j) * rows + i];
  std::int64_t ens_correct = 0;
  if (!opt.data_parallel) {
    psum_inplace(mean, opt.axis);  // whole buffer: its shape is fixed, rows past the batch are ignored
    for (std::size_t i = 0; i < rows; ++i) m[i] /= static_cast<float>(opt.total_members);
  }
  for (int n = 0; n < b.batch; ++n) {
    const float* row = m + static_cast<std::size_t>(n) * static_cast<std::size_t>(k);
    int best = 0;
    for (int c = 1; c < k; ++c)
      if (row[c] > row[best]) best = c;
    ens_correct += best == b.labels[n];
  }
  return StepResult{work.loss, work.correct, ens_correct};
}

}  // namespace pmap::ensemble
