// The per-device train, eval and report steps that Trainer and Evaluator pmap over the mesh, and the buffers
// one device needs for them (allocated once, on the device): TrainWork, EvalWork and ReportWork, each its own
// step's, with DeviceWork holding a device's runner, optimizer scalars, train and eval work. The same code runs on CPU and CUDA devices:
// every pointer handed to a kernel is device memory, nothing allocates and nothing waits for the device
// inside a step, and the results stay on the device until they are gathered with the runtime's tree
// collectives. On backends that capture graphs (CUDA) a train step is one graph launch.
//
// Ensemble mode: every member on every device sees the whole (replicated) batch; the ensemble prediction
// is pmean(softmax(logits)) over the members. Data-parallel mode: one model per device, each device gets
// its block of the batch (sharded), gradients are pmean-ed so the replicas stay bitwise identical.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <pmap/array.h>
#include <pmap/tree.h>

#include <pmapcc/ensemble/optimizer.h>
#include <pmapcc/ensemble/runner.h>
#include <pmapcc/ensemble/train_state.h>
#include <pmapcc/kernels/graph.h>

namespace pmap::ensemble {

// A batch on a device: images (N, H, W, C) f32, labels (N) i32.
struct Batch {
  Array images;
  Array labels;
};
PMAPCC_TREE(Batch, images, labels)

// What the train steps of a device record between reports: row r holds step r's per-member mean loss
// and correct count; bad_labels counts labels outside [0, K) that reached the loss (CUDA cannot raise
// from a kernel; the CPU ops raise at once).
struct TrainLog {
  Array loss;        // (report rows, members) f32
  Array correct;     // (report rows, members) i32
  Array bad_labels;  // (1) i32, since the TrainWork was made
};
PMAPCC_TREE(TrainLog, loss, correct, bad_labels)

// What eval_step leaves on the device for one eval batch: per member its mean loss and correct count,
// the ensemble's correct count (from the probabilities averaged over every member of the mesh), and the
// calibration sums (kernels::CalibrationParams) of each member's probabilities and, last, the ensemble's.
struct EvalResult {
  Array loss;              // (members) f32
  Array correct;           // (members) i32
  Array ensemble_correct;  // (1) i32
  Array calibration;       // (members + 1, kernels::kCalibrationSlots) f64
};
PMAPCC_TREE(EvalResult, loss, correct, ensemble_correct, calibration)

// What report_step leaves on the device for one eval batch, for all M members of the mesh: the
// calibration sums of the ensemble of the first k members (k = 1..M, the ensemble-size curve), and per
// image the ensemble's predicted class, its probability and the predictive entropy, and each member's
// predicted class (its vote).
struct ReportResult {
  Array curve;        // (M, kernels::kCalibrationSlots) f64
  Array predicted;    // (eval batch) i32
  Array probability;  // (eval batch) f32
  Array entropy;      // (eval batch) f32
  Array votes;        // (M, eval batch) i32
};
PMAPCC_TREE(ReportResult, curve, predicted, probability, entropy, votes)

struct StepOptions {
  const Optimizer* optimizer = nullptr;  // train_step's update (required there)
  UpdateOptions update;
  bool data_parallel = false;
  std::string axis = "ensemble";  // the mesh axis the members (or replicas) are spread over
  int total_members = 1;          // members over all devices (ensemble mode)
  bool member_dropout = false;    // TrainWork::dropout_rates replace the Dropout layers' rates
};

// train_step's buffers for `members` members, run `group` at a time on max_rows examples, K classes.
struct TrainWork {
  TrainWork(const kernels::Backend& backend, Device device, int members, int group, int max_rows, int classes,
            std::int64_t params_per_member, int log_rows);
  Array grads;          // (members * P)
  Array keys;           // (members, 2) u32: the members' random keys (Dropout), zero until the owner sets them
  Array dropout_rates;  // (members) f32: the members' dropout rates, when StepOptions::member_dropout (owner-set)
  Array dlogits;        // (group, max_rows, K): a group's loss gradient
  Array xent_ws;        // the loss's workspace (u8)
  Array step_loss;      // (members) f32: the last train step's (the captured graph writes here)
  Array step_correct;   // (members) i32
  TrainLog log;
  int log_fill = 0;  // rows of `log` written since the last report
};

// eval_step's buffers: an eval batch of up to max_eval_batch rows runs in pieces of max_rows through groups
// of `group` members.
struct EvalWork {
  EvalWork(const kernels::Backend& backend, Device device, int members, int group, int max_rows, int max_eval_batch,
           int classes);
  Array piece_probs;     // (group, max_rows, K): a piece's probabilities for a group of members
  Array piece_loss;      // (members) f32: a piece's mean loss per member
  Array piece_correct;   // (members) i32
  Array xent_ws;         // the loss's workspace (u8)
  Array loss_sum;        // (members) f64: the batch's loss sums over its pieces
  Array hits;            // (members) i32
  Array mean_probs;      // (max_eval_batch, K): the ensemble's probabilities
  Array member_probs;    // (members, max_eval_batch, K): each member's probabilities (eval_step's `keep`)
  Array calibration_ws;  // the calibration sums' workspace (u8)
  Array bad_labels;      // (1) i32: labels outside [0, K) that reached the loss, since the work was made
  EvalResult result;
};

// A device's work: its runner (activations for at most max_rows examples, a training step's rows on this
// device, of a group of members at a time; eval_step runs a larger eval batch through them in pieces of
// max_rows), its members' optimizer scalars, and the train and eval steps' buffers. The steps run the members
// group by group; the group size changes no result, only speed and memory.
// member_group 0 picks default_member_group(device, members). log_rows: train steps between reports.
// optimizer: the per-member scalars of this device's members' updates.
// graphs: capture the train step where the backend can (false: run it eagerly every time).
// split: model parallelism, `model` being a local model (layout.h) whose layers issue collectives; such a
// step runs eagerly (its collectives meet on the host), and is run with StepOptions::data_parallel over
// the data axis (the batch sharded over it, the gradients pmean-ed over it). precision: of the conv and
// dense products, training and evaluation alike (kernels::Precision).
struct DeviceWork {
  DeviceWork(const Sequential& model, const kernels::Backend& backend, Device device, int members, int max_rows,
             int max_eval_batch, int member_group, int log_rows, OptimizerWork optimizer, bool graphs = true,
             RunnerSplit split = {}, kernels::Precision precision = kernels::Precision::fp32);

  const kernels::Backend& backend;
  ModelRunner runner;
  OptimizerWork optimizer;
  TrainWork train;
  EvalWork eval;

  // The graphs of the train step and of the data-parallel update, one per key: train_step's key names
  // everything the captured work freezes besides this DeviceWork's own buffers (the batch's and the
  // state's device pointers, the rows, the optimizer and its by-value options), so that a call changing
  // any of them captures anew instead of replaying stale values.
  kernels::StepGraph& step_graph(const std::string& key);
  kernels::StepGraph& update_graph(const std::string& key);

 private:
  bool graphs_;         // the whole step may be captured
  bool update_graphs_;  // the data-parallel update may be captured
  std::map<std::string, std::unique_ptr<kernels::StepGraph>> step_graphs_;
  std::map<std::string, std::unique_ptr<kernels::StepGraph>> update_graph_map_;
};

// One member at a time on a CPU device (as fast as all at once, measured with `bench_train paired`, and
// one member's activations in memory instead of M), all members at once on a GPU (one launch per layer
// for all of them).
int default_member_group(const Device& device, int members);

// One optimizer step for this device's members on `batch` (data parallel: this device's block of the global
// batch); its losses and correct counts go to the next row of work.train.log.
void train_step(TrainState& state, DeviceWork& work, const Batch& batch, const StepOptions& opt);

// Forward only, on the first `rows` examples of `batch`: fills work.eval.result (a collective in ensemble
// mode: the probabilities are summed over the mesh axis); with `keep`, each member's probabilities stay in
// work.eval.member_probs for report_step.
void eval_step(const TrainState& state, DeviceWork& work, const Batch& batch, int rows, const StepOptions& opt,
               bool keep = false);

// The buffers of report_step for the `total_members` members of the mesh (made when a report is asked for),
// on the device of `eval` and for its eval batches.
struct ReportWork {
  ReportWork(const EvalWork& eval, int total_members);
  int total_members;
  Array running;  // (max_eval_batch, K): the sum of the first k members' probabilities
  Array mean;     // (max_eval_batch, K): that sum / k
  ReportResult result;
};

// After eval_step(..., keep = true) on the same batch: gathers every member's probabilities over the mesh
// axis (a collective) and fills report.result.
void report_step(DeviceWork& work, ReportWork& report, const Batch& batch, int rows, const StepOptions& opt);

}  // namespace pmap::ensemble
