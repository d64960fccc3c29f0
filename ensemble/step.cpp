// train_step and eval_step: forward, loss, backward, [pmean of gradients], SGD; and the ensemble's
// probability averaging across the mesh axis.
#include "ensemble/step.h"

#include <pmap/collectives.h>
#include <pmap/error.h>

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

// The batch as the device's ops read it: host pointers on a CPU device; on a CUDA device, copied into the
// buffers allocated up front (only the rows of this batch).
HostBatch on_device(const HostBatch& b, DeviceWork& work, std::int64_t example_size) {
  if (work.runner.device().is_cpu()) return b;
  const auto rows = static_cast<std::size_t>(b.batch);
  work.images.copy_prefix_from_host(b.images, rows * static_cast<std::size_t>(example_size) * sizeof(float));
  work.labels.copy_prefix_from_host(b.labels, rows * sizeof(std::int32_t));
  return HostBatch{work.images.data<float>(), work.labels.data<std::int32_t>(), b.batch};
}

// Staging buffers exist only on CUDA devices (a CPU device reads the host batch directly).
Shape staging_shape(const Sequential& model, const Device& device, int max_batch, bool images) {
  if (device.is_cpu()) return Shape{0};
  return images ? Shape{max_batch, product(model.input_shape())} : Shape{max_batch};
}

}  // namespace

DeviceWork::DeviceWork(const Sequential& model, Device device, int members, int max_batch)
    : runner(model, device, members, max_batch),
      grads(Shape{members * model.params_per_member()}, DType::f32, device),
      dlogits(Shape{members, max_batch, classes_of(model)}, DType::f32, device),
      probs(Shape{members, max_batch, classes_of(model)}, DType::f32, device),
      mean_probs(Shape{max_batch, classes_of(model)}, DType::f32, Device{}),
      images(staging_shape(model, device, max_batch, true), DType::f32, device),
      labels(staging_shape(model, device, max_batch, false), DType::i32, device),
      loss(static_cast<std::size_t>(members)),
      correct(static_cast<std::size_t>(members)) {
  if (!device.is_cpu()) host_probs.reserve(static_cast<std::size_t>(probs.size()));
}

StepResult train_step(TrainState& state, DeviceWork& work, const HostBatch& batch, const StepOptions& opt) {
  const auto& be = kernels::backend_for(work.runner.device().kind);
  const int members = work.runner.members();
  const std::int64_t example = product(work.runner.model().input_shape());
  const HostBatch b = on_device(local_block(batch, opt, example), work, example);
  const float* params = state.params.data<float>();
  const float* logits = work.runner.forward(b.images, b.batch, params);
  kernels::SoftmaxXentParams xp{members, b.batch, static_cast<int>(classes_of(work.runner.model())), true};
  be.softmax_cross_entropy(xp, logits, b.labels, work.loss.data(), work.dlogits.data<float>(), nullptr,
                           work.correct.data());
  work.runner.backward(b.images, params, work.dlogits.data<float>(), work.grads.data<float>());
  if (opt.data_parallel) pmean_inplace(work.grads, opt.axis);
  be.sgd_momentum_update(opt.sgd, static_cast<std::size_t>(state.params.size()), state.params.data<float>(),
                         state.momentum.data<float>(), work.grads.data<float>());
  ++state.step;
  return StepResult{work.loss, work.correct, 0};
}

StepResult eval_step(const TrainState& state, DeviceWork& work, const HostBatch& host_batch, const StepOptions& opt) {
  const auto& be = kernels::backend_for(work.runner.device().kind);
  const int members = work.runner.members();
  const int k = static_cast<int>(classes_of(work.runner.model()));
  const HostBatch d = on_device(host_batch, work, product(work.runner.model().input_shape()));
  const float* logits = work.runner.forward(d.images, d.batch, state.params.data<float>());
  kernels::SoftmaxXentParams xp{members, d.batch, k, true};
  be.softmax_cross_entropy(xp, logits, d.labels, work.loss.data(), nullptr, work.probs.data<float>(),
                           work.correct.data());
  // Ensemble: sum this device's members' probabilities in member order (on the host), then psum over the
  // devices (device order) and divide by the number of members.
  const std::size_t rows = static_cast<std::size_t>(d.batch) * static_cast<std::size_t>(k);
  const float* probs = work.probs.data<float>();
  if (!work.runner.device().is_cpu()) {  // only this batch's rows of every member
    work.host_probs.resize(rows * static_cast<std::size_t>(members));  // within its capacity: no allocation
    work.probs.copy_prefix_to_host(work.host_probs.data(), work.host_probs.size() * sizeof(float));
    probs = work.host_probs.data();
  }
  const HostBatch& b = host_batch;
  Array& mean = work.mean_probs;  // host memory: psum stages it for device communicators
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
