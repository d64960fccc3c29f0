// Trainer: the training loop on the differentiable core. It owns a mesh's members (an ensemble, one model
// per slice of the members, or one data-parallel model), their TrainStep and the batches' feed, and trains an
// epoch at a time: Keras's fit and the Flax examples' loop, with the model, the optimizer and the loss as
// inputs (train::Model, train::Optimizer, train::Loss) and the library's options apart from any program's flags.
//
// Keys, as the program has always drawn them: key(seed) splits into an init key and a data key; member g
// starts from split(init_key, members)[g], whatever the devices; epoch e visits the examples in
// permutation(fold_in(data_key, e)), full batches only. Ensemble: device d along the axis holds members
// [d * members / devices, (d + 1) * members / devices) and sees every batch whole. Data parallel: every device
// holds the one model (the same key, so the replicas stay bitwise equal) and its block of each batch.
//
//   train::Trainer t(train::flax_cnn(), train::Optimizer(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
//                    Mesh(local_devices(DeviceKind::cpu, 2), "ensemble"), {.members = 4, .batch_size = 64});
//   for (int e = 0; e < 10; ++e) std::printf("loss %.4f\n", t.run_epoch(train_set).train_loss);
//
// Several processes (a mesh over distributed::global_devices()): every process makes the same calls with the
// same data; the per-step numbers are all-gathered over the mesh, so every process reports the same bits.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <pmap/feed.h>
#include <pmap/mesh.h>
#include <pmap/random.h>
#include <pmap/sharded.h>

#include <pmapcc/train/data.h>
#include <pmapcc/train/metrics.h>
#include <pmapcc/train/step.h>

namespace pmap::train {

struct TrainerOptions {
  int members = 1;            // the ensemble's members over the whole mesh, a multiple of its devices
                              // (data parallel: 1, the one model)
  bool data_parallel = false;  // one model; each batch split over the mesh's devices, gradients pmean'd
  int batch_size = 64;        // examples a step; data parallel: the global batch, at least one per device (any
                              // size: 128 on 3 devices are blocks of 43, 43 and 42, the step the whole batch's)
  std::uint64_t seed = 0;
  MemberHyperparams hyperparams = {};  // one value per member (TrainStep::init; data parallel: one value)
  // Steps between the reads of the per-step losses (each one gathered over the mesh and copied to the host):
  // 0 picks 1 on CPU devices and 16 on GPUs, where a read waits for the device. on_step still sees every step.
  int report_every = 0;
  int eval_batch = 128;       // examples an evaluation step (the last one of a dataset may have fewer)
  std::int64_t member_batch = 0;                            // StepOptions::member_batch
  kernels::Precision precision = kernels::Precision::fp32;  // StepOptions::precision
  // On CPU devices, the kernels that compute the Trainer's ops (null: the CPU kernels); for instance
  // kernels::cuda_backend_on_host(), the CUDA kernels run on the host, which compute as a GPU does (the
  // program's --kernels cuda-on-host; much slower). ValueError naming it on a mesh of other devices, or for
  // kernels that do not compute on host memory.
  const kernels::Backend* cpu_backend = nullptr;
  // Tensor parallelism (Megatron's, nn/parallel.h), on a mesh of two axes: the first the ensemble's or the
  // batch's (as a one-axis mesh's), the second the one the layout splits parameters over ("model"). Each device
  // holds its blocks of its members' parameters (and of their optimizer state); a model written with
  // nn::TensorParallel (flax_cnn, keras_convnet) runs each layer as the layout says. The members are spread over
  // the first axis only, and every device along the second computes the same loss and logits. params(),
  // checkpoints and set_members deal in whole tensors, so a checkpoint resumes under any layout or none. Empty:
  // nothing split (on a mesh of two axes, every device along the second holds the whole model).
  nn::Sharding sharding = {};
  bool graphs = true;  // StepOptions::graphs
};

// One batch on its way to the devices (Feed's tree).
struct Batch {
  Array images;  // (B, H, W, 1) f32 in [0, 1]
  Array labels;  // (B) i32
};
PMAPCC_TREE(Batch, images, labels)

// What run_epoch reports after each training step.
struct StepReport {
  int step = 0;                  // 1-based, within the epoch
  int steps = 0;                 // the epoch's steps
  double loss = 0;               // this step's mean loss over the members (data parallel: the global batch's)
  double running_loss = 0;       // the mean of the epoch's step losses so far
  double running_accuracy = 0;   // the fraction of the epoch's examples so far classified right, over the members
  double images_per_second = 0;  // model-images (members x examples) per second so far
};
using StepCallback = std::function<void(const StepReport&)>;

// What run_epoch returns: the epoch's training numbers.
struct EpochReport {
  int epoch = 0;                // 1-based: the epochs done with this one
  int steps = 0;
  double train_loss = 0;        // the mean of the steps' losses
  double train_accuracy = 0;    // over every member and example seen
  double seconds = 0;           // the steps' wall time
  double images_per_second = 0; // model-images per second
};

// What evaluate returns: each member's numbers and the ensemble's (the mean of every member's probabilities),
// on a dataset. Data parallel: the one model, which is also the ensemble.
struct Evaluation {
  std::int64_t examples = 0;
  double loss = 0;  // the members' mean cross-entropy: the mean of their NLLs (the probabilities floored at
                    // 1e-30), whatever Loss the Trainer trains with
  std::vector<double> member_accuracy = {};          // per member: the fraction classified right (argmax)
  std::vector<Calibration> member_calibration = {};  // per member: NLL, Brier score, entropy, ECE, bins
  double ensemble_accuracy = 0;
  Calibration ensemble_calibration = {};
  // With evaluate's size_curve: the ensemble of the first k members (mesh order) for k = 1..members (data
  // parallel: the one model), Lakshminarayanan et al.'s accuracy and NLL against the ensemble's size.
  std::vector<SizePoint> size_curve = {};
  // With evaluate's predictions: every example's label, the ensemble's predicted class, its probability and
  // the predictive entropy, and each member's predicted class (votes[member][example]).
  Predictions predictions = {};
};

// What evaluate computes besides the members' and the ensemble's numbers (each gathers every member's
// probabilities to every device).
struct EvaluateOptions {
  bool size_curve = false;
  bool predictions = false;
};

// What Trainer::load returns besides the state it restores: the file's metadata and the tensors it holds for the
// parts around the loop, on the host.
struct Checkpoint {
  std::map<std::string, std::string> metadata;
  Variables tensors;
};

// A checkpoint's members on the host, as Trainer::set_members takes them: each tensor (k, ...) holding the members
// read, in the order asked for.
struct SavedMembers {
  Variables params;
  Variables state;
  std::map<std::string, std::string> metadata;  // the file's __metadata__
  int members = 0;                              // the members the file holds
};

// The __metadata__ "format" Trainer::save writes.
inline constexpr const char* kCheckpointFormat = "pmapcc.train.v1";
// A checkpoint's format from its __metadata__, checked: kCheckpointFormat, or the runner's (ensemble::Trainer's
// "pmapcc.ensemble.v2" and "pmapcc.ensemble.v1", which load too). DataError naming `file` for metadata without a
// format or with another: a safetensors file that is not a pmapcc checkpoint.
std::string checkpoint_format(const std::map<std::string, std::string>& metadata, const std::string& file);

// Members `members` (the file's indices, each once; empty: every one) of a checkpoint that Trainer::save or the
// runner (ensemble::Trainer, formats pmapcc.ensemble.v1 and v2) wrote, for `model`: their parameters and model
// state, to evaluate or to continue as another ensemble (set_members). DataError naming the file for one that is
// not such a checkpoint, that holds another model (naming both), or a missing, misshapen or non-finite tensor of
// the model's; ValueError naming the member for an index outside the file's members or given twice. Reads the
// file on this process only (not collective).
SavedMembers read_members(const std::filesystem::path& path, const Model& model, const std::vector<int>& members = {});

class Trainer {
 public:
  // The members of `options` on `mesh` (one axis: the ensemble's or the batch's, whichever its name; or two, that
  // one then the model's: options.sharding), each initialized from its key. ValueError naming the option: members <
  // 1 or not a multiple of the devices along the first axis (data parallel: not 1), batch_size < 1 (data parallel:
  // fewer than those devices; with a sharding, not a multiple of them), eval_batch < 1, report_every < 0, a mesh of more than two axes, a sharding on a
  // mesh of one axis or that names the first axis or an axis the mesh does not have, a layout that does not fit
  // the model (a parameter it does not have, a dimension the axis does not divide, a layer that cannot run that
  // split: nn::TensorParallel's errors, found by one inference at construction), member_batch < 0 (TrainStep's),
  // hyperparams that check_hyperparams refuses (naming the member); what TrainStep::init refuses in hyperparams (a
  // hyper-parameter the optimizer or the model does not take).
  Trainer(Model model, Optimizer optimizer, Mesh mesh, TrainerOptions options = {},
          Loss loss = softmax_cross_entropy_loss);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  const Model& model() const { return step_.model(); }
  const TrainerOptions& options() const { return options_; }
  const Mesh& mesh() const { return mesh_; }
  const TrainStep& train_step() const { return step_; }
  int members_per_device() const { return per_device_; }
  int epochs_done() const { return epochs_done_; }
  // The devices' members (this process's devices, in mesh order); under options.sharding, each device's blocks of
  // their split parameters and optimizer state.
  const Sharded<TrainState>& states() const { return states_; }
  Sharded<TrainState>& states() { return states_; }

  // Trains the next epoch on `data`: its images (rows, cols) must be the model's input (H, W, 1), its labels
  // below the model's classes and at least one full batch of examples (ValueError naming the fault otherwise,
  // before any step). on_step is called after every step, in order, at the report points (report_every).
  // When a step or on_step raises, the steps taken stay taken and the epoch does not count: the next call
  // runs the same epoch's order again.
  EpochReport run_epoch(const Dataset& data, const StepCallback& on_step = {});

  // Every member and the ensemble on `data` (the members' probabilities, softmax of their logits in inference,
  // averaged over every member of the mesh on the devices), in batches of options().eval_batch; the sums are
  // taken in batch order on the host from the batches' all-gathered results, so every process holds the same
  // bits. ValueError as run_epoch for data that does not fit the model, or that has no example.
  Evaluation evaluate(const Dataset& data, const EvaluateOptions& options = {});

  // Every member's parameters (model state), on the host: each tensor (members, ...) with member g at row g
  // (data parallel: the one model, (1, ...)). Collective over the processes of the mesh.
  Variables params() const;
  Variables model_state() const;
  // The optimizer's state on the host, by name (Optimizer's names): a leaf kept per member (a non-element-wise
  // optimizer's, or an element-wise one's per-parameter leaves such as "trace/<parameter>") (members, ...),
  // member g at row g; a leaf an element-wise optimizer keeps once for a device's stacked members (its "count")
  // as the first device holds it (every device holds the same). Collective.
  Variables optimizer_state() const;
  std::int64_t step() const;  // the updates made (read from the first local device)
  // Members `members` (indices 0..members-1, data parallel: 0) take their rows of `params` and `state` (host
  // tensors (members, ...) named as params() and model_state() give them); the other members keep theirs.
  // ValueError naming the tensor or member that does not fit. Collective.
  void set_members(const Variables& params, const Variables& state, const std::vector<int>& members);

  // Checkpoints: a safetensors file holding everything a run needs to continue exactly, whatever the devices
  // (mesh size, CPU devices or GPUs) it continues on: every member's parameters "params/<tensor>", model state
  // "state/<tensor>", optimizer state "opt/<name>" (optimizer_state()) and per-member hyper-parameters
  // "hyperparams/<name>" (members) f32, with the format ("pmapcc.train.v1"), model, optimizer, mode, members,
  // seed, step, epochs done, the devices it was written from and the members' keys in __metadata__, and
  // `metadata`'s entries beside them (a program's own record, e.g. its flags as JSON; ValueError for a key
  // the Trainer writes), and `tensors` (host arrays) beside its own, for the parts around the loop (EarlyStopping's
  // best parameters; ValueError for a name under params/, state/, opt/ or hyperparams/). Collective over the
  // mesh's processes: every member is gathered, the process of the mesh's first device writes the file,
  // atomically (io::save_safetensors), and every process returns once it is written (a load may follow), or
  // raises IoError naming the path when it could not be.
  void save(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata = {},
            const Variables& tensors = {}) const;
  // Continues from a checkpoint: the next run_epoch trains the epoch after the checkpoint's, as the run that
  // wrote it would have, on this Trainer's devices. The file must come from the same model (its tensors'
  // names, shapes and dtypes), optimizer class (its settings, such as the momentum, are not recorded: keep
  // them), mode, members, seed and per-member hyper-parameters: DataError
  // naming the file and the difference otherwise (and for a file that is not a checkpoint, a missing, extra,
  // misshapen or non-finite tensor), before anything changes. The runner's checkpoints (ensemble::Trainer's,
  // formats pmapcc.ensemble.v1 and v2) load too: their optimizer slots "opt/momentum|m|v/<tensor>" (v1:
  // "momentum/<tensor>") become "trace", "mu" and "nu", an element-wise optimizer's count their step, and
  // their per-member lists (lr, weight_decay, dropout) the hyper-parameters (a value recorded as one number is
  // every member's; a list of one value repeated needs no per-member values). Collective: every process reads
  // the file (a path all of them see). Tensors outside the Trainer's own are refused unless their names start
  // with one of `others` (the parts' tensors, such as EarlyStopping's "best/"). Returns the file's __metadata__
  // and those tensors.
  Checkpoint load(const std::filesystem::path& path, const std::vector<std::string>& others = {});

 private:
  Variables gathered(Variables TrainState::*role) const;
  // Every device's rows of `role` from host tensors (members, ...) (an element-wise optimizer's shared leaves
  // whole), into the arrays the devices hold. Collective.
  void put(Variables TrainState::*role, const Variables& host);
  // Whether the optimizer keeps state leaf `name` once for a device's stacked members (not per member).
  bool shared_leaf(const std::string& name) const;
  void check_data(const Dataset& data, const char* where) const;
  // Data parallel: the rows of a device's block of the feed (ceil(batch_size / devices)), and device d's
  // examples, the global batch's [rows_of(d).offset, + count_of(d)): the first batch_size % devices devices
  // one more than the rest. An ensemble: the whole batch, {0, batch_size}.
  std::int64_t block_rows() const;
  BatchRows rows_of(int device) const;
  std::int64_t count_of(int device) const;

  // Every axis of the mesh: what the checkpoints' outcomes are summed over.
  AxisNames all_axes() const;
  // The spec of a leaf of `role` (a parameter's, or an optimizer leaf's of a parameter) under options.sharding.
  P spec_of(Variables TrainState::*role, const std::string& name) const;

  TrainStep step_;
  Mesh mesh_;
  TrainerOptions options_;
  int per_device_ = 1;
  int along_ = 1;  // devices along the first axis (the members' or the batch's)
  Key data_key_{};
  Sharded<TrainState> states_;
  std::unique_ptr<Feed<Batch>> feed_;
  std::unique_ptr<Feed<Batch>> eval_feed_;  // made by the first evaluate
  int epochs_done_ = 0;
};

}  // namespace pmap::train
