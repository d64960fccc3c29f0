// The per-device train and eval steps that Trainer pmaps over the mesh, and DeviceWork, the buffers one
// device needs for them (allocated once). Ensemble mode: every member on every device sees the whole
// (broadcast) batch; the ensemble prediction is pmean(softmax(logits)) over the members. Data-parallel
// mode: one model per device, each device takes its block of the batch, gradients are pmean-ed so the
// replicas stay bitwise identical.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <pmap/array.h>

#include "ensemble/runner.h"
#include "ensemble/train_state.h"

namespace pmap::ensemble {

// A batch in host memory: images (batch, *input) f32, labels (batch) i32.
struct HostBatch {
  const float* images = nullptr;
  const std::int32_t* labels = nullptr;
  int batch = 0;
};

struct StepOptions {
  kernels::SgdParams sgd;
  bool data_parallel = false;
  std::string axis = "ensemble";  // the mesh axis the members (or replicas) are spread over
  int total_members = 1;          // members over all devices (ensemble mode)
};

// Activations are held for at most max_rows examples (a training step's rows on this device) of a group
// of members at a time; eval_step runs a larger eval batch through them in pieces of max_rows. The steps
// run the members group by group; the group size changes no result, only speed and memory.
// member_group 0 picks default_member_group(device, members).
struct DeviceWork {
  DeviceWork(const Sequential& model, Device device, int members, int max_rows, int max_eval_batch,
             int member_group = 0);
  ModelRunner runner;
  Array grads;    // (members * P)
  Array dlogits;  // (group, max_rows, K); eval: one piece's probabilities for a group
  Array probs;    // (members, max_eval_batch, K)
  Array mean_probs;  // (max_eval_batch, K): the ensemble's probabilities
  std::vector<float> loss;             // per member, last step
  std::vector<std::int32_t> correct;   // per member, last step
  std::vector<double> eval_loss_sum;   // per member: eval_step's sums over its pieces
  std::vector<std::int32_t> eval_hits;
  std::int64_t ensemble_correct = 0;   // last eval step
};

// One member at a time on a CPU device (as fast as all at once, measured with `bench_train paired`, and
// one member's activations in memory instead of M), all members at once on a GPU (one launch per layer
// for all of them).
int default_member_group(const Device& device, int members);

// What a step reports, per device: its members' losses and correct counts.
struct StepResult {
  std::vector<float> loss;
  std::vector<std::int32_t> correct;
  std::int64_t ensemble_correct = 0;
};

// One SGD step for this device's members on `batch` (data parallel: on this device's block of it).
StepResult train_step(TrainState& state, DeviceWork& work, const HostBatch& batch, const StepOptions& opt);
// Forward only: per-member test loss and correct counts, and (ensemble mode) the ensemble's correct
// count from the probabilities averaged over every member of the mesh.
StepResult eval_step(const TrainState& state, DeviceWork& work, const HostBatch& batch, const StepOptions& opt);

}  // namespace pmap::ensemble
