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

struct DeviceWork {
  DeviceWork(const Sequential& model, Device device, int members, int max_batch);
  ModelRunner runner;
  Array grads;    // (members * P)
  Array dlogits;  // (members, max_batch, K)
  Array probs;    // (members, max_batch, K)
  Array mean_probs;  // (max_batch, K) in host memory: the ensemble's probabilities
  Array images;      // (max_batch, *input) on the device: the batch staged from the host (CUDA devices)
  Array labels;      // (max_batch) i32, likewise
  std::vector<float> host_probs;       // CUDA devices: probs copied to the host for the ensemble mean
  std::vector<float> loss;             // per member, last step
  std::vector<std::int32_t> correct;   // per member, last step
  std::int64_t ensemble_correct = 0;   // last eval step
};

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
