// Trainer: trains an ensemble of models (or one data-parallel model) over a mesh of devices, an epoch
// at a time, and evaluates members and ensemble on the test set. Keys: key(seed) splits into an init
// key and a data key; member g starts from split(init_key, members)[g] (so it does not depend on the
// number of devices); epoch e visits the training set in permutation(fold_in(data_key, e)).
//
// Several processes (mpirun/srun, after distributed::initialize()): the mesh spans every process's
// devices (config.devices of them per process), each process trains the members on its own devices,
// and per-step and per-member results are all-gathered over the mesh, so every process holds the same
// metrics, equal bit for bit to one process with as many devices. Every process must make the same
// calls (run_epoch, evaluate, params, optimizer_state, save_checkpoint, load_checkpoint) in the same order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <pmap/feed.h>
#include <pmap/pmap.h>
#include <pmap/random.h>

#include <pmapcc/ensemble/config.h>
#include <pmapcc/ensemble/data.h>
#include <pmapcc/ensemble/evaluation.h>
#include <pmapcc/ensemble/layout.h>
#include <pmapcc/ensemble/metrics.h>
#include <pmapcc/ensemble/model.h>
#include <pmapcc/ensemble/placement.h>
#include <pmapcc/ensemble/step.h>
#include <pmapcc/io/json.h>

namespace pmap::ensemble {


// What a checkpoint holds, for setting up its evaluation: its members, epochs and recorded configuration, and
// its format (the runner's "pmapcc.ensemble.v2" or "v1", train::Trainer's "pmapcc.train.v1").
struct CheckpointSummary {
  int members = 0;
  int epochs_done = 0;
  io::Json config;
  std::string format;
};
CheckpointSummary inspect_checkpoint(const std::filesystem::path& path);

// What run_epoch reports after each training step.
struct StepReport {
  int step = 0;                    // 1-based, within the epoch
  int steps = 0;                   // the epoch's steps
  double loss = 0;                 // this step's loss: the mean over members (data parallel: over the replicas' blocks)
  double running_loss = 0;         // the mean of the epoch's step losses so far
  double running_accuracy = 0;     // the fraction of the epoch's training examples so far classified right
                                   // (over every member)
  double images_per_second = 0;    // model-images per second so far
};
using StepCallback = std::function<void(const StepReport&)>;

// Early stopping, per member (TrainConfig::patience): its best validation NLL so far and the epoch it was
// reached at, the epochs since, and the epoch it stopped after (0: still training).
struct MemberStopping {
  int best_epoch = 0;  // 0: no epoch evaluated yet
  double best_nll = 0;
  int wait = 0;
  int stopped_epoch = 0;
};

class Trainer {
 public:
  // Validates the config against the data (raises ValueError naming the flag), builds the mesh and
  // initializes every member of the model config.model names (make_model).
  Trainer(TrainConfig config, const Dataset& train, const Dataset& test);
  // The same for a model of the caller's (config.model becomes its name). ValueError when its input shape
  // is not the data's images (H, W, 1) or its outputs are not the data's classes.
  Trainer(TrainConfig config, std::unique_ptr<Sequential> model, const Dataset& train, const Dataset& test);
  ~Trainer();

  const TrainConfig& config() const { return config_; }
  const Sequential& model() const { return *model_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  // Where each weight lives when splits_weights() (nullptr otherwise).
  const ShardingPlan* plan() const { return placement_->plan(); }
  const Mesh& mesh() const { return mesh_; }
  int members_per_device() const { return placement_->members_per_device(); }
  int member_group() const;  // the members a device runs at once
  int total_members() const { return placement_->total_members(); }
  int epochs_done() const { return epochs_done_; }
  int steps_per_epoch() const;
  // Rows of each device's per-step log: report_every, at most an epoch's steps.
  int log_rows() const;
  const std::vector<EpochMetrics>& history() const { return history_; }

  // Trains the next epoch, evaluates (on the validation set when config().validation_split holds one out,
  // else on the test set: EpochMetrics::evaluated_on), appends to history() and returns the epoch's metrics.
  // on_step is called after each training step (in order, every step), on_evaluate once the steps are done
  // and the evaluation starts.
  //
  // Early stopping (config().patience > 0): after each epoch, a member whose validation NLL is below its best
  // so far becomes its best (its parameters and model state are kept on the host); one that has not improved
  // for `patience` epochs stops. A stopped member gets its best parameters back at once and after every later
  // epoch: it still runs in the devices' batched steps (the members of a device share their kernels), but what
  // it learns there is discarded, so it is evaluated, saved and exported with its best epoch's parameters.
  // When the run ends (its last epoch, or every member stopped), every member gets its best parameters back.
  EpochMetrics run_epoch(const StepCallback& on_step = {}, const std::function<void()>& on_evaluate = {});
  // Early stopping's state per member (empty when it is off).
  const std::vector<MemberStopping>& early_stopping() const { return stopping_; }
  // Whether early stopping has stopped every member: the run is over.
  bool all_stopped() const;
  // The training and validation examples the run uses: the training set, less the validation set when one is
  // held out (config().validation_split); the validation set is empty otherwise.
  const Dataset& train_data() const { return train_; }
  const Dataset& validation_data() const { return validation_; }
  // Per-member test loss, accuracy and calibration and the ensemble's accuracy and calibration, into m
  // (epoch and timings untouched). Computed on the devices, from the probabilities accuracy comes from.
  // Always the test set.
  void evaluate(EpochMetrics& m);
  // As evaluate (the same bits into m), and also the ensemble-size curve and every test image's results.
  EnsembleReport evaluate_report(EpochMetrics& m);

  // Whether this process writes the run's files: the one that owns the mesh's first device (every
  // process when the mesh does not span processes).
  bool is_main_process() const;

  // Every member's parameters (the optimizer's state slot `slot`, one of optimizer().slots()), in host
  // memory, stacked as a checkpoint holds them (ensemble/member_layout.h, M = total_members()). On every
  // process (collective). ValueError for a slot the optimizer does not have.
  std::vector<float> params() const;
  std::vector<float> optimizer_state(const std::string& slot) const;
  // The model state (BatchNorm's moving statistics), stacked the same way in the model's state layout
  // (Sequential::state_layout()); empty for a model without state.
  std::vector<float> model_state() const;
  std::int64_t step() const;  // the updates made (read from the first local device)

  // Checkpoints (safetensors): everything needed to continue exactly. load_checkpoint checks that the
  // file was written for the same model, members, seed, batch size and optimizer settings. Across
  // processes both are collective: save_checkpoint gathers every member and only the main process
  // writes; every process reads the file in load_checkpoint (a path all of them can see). load_checkpoint
  // also continues a train::Trainer file that carries a program's configuration, history and training
  // examples (mnist_ensemble's): its optimizer leaves trace, mu and nu are the momentum, m and v here.
  void save_checkpoint(const std::filesystem::path& path) const;
  void load_checkpoint(const std::filesystem::path& path);
  // Evaluation of a saved ensemble: this trainer's members (config().members of them) become the
  // checkpoint's members `subset` (indices into its members, in that order; empty: all of them, which must
  // then be as many), the optimizer's state zero. Checks the model's tensors, not the recipe. DataError for a file
  // that does not fit, ValueError for a subset that does not.
  void load_members(const std::filesystem::path& path, const std::vector<int>& subset);

 private:
  // The devices' step buffers, the feeds and the backend's handles (allocated once, here).
  void make_device_work();
  void init_members();
  // The schedule's kernel parameters, a cosine decay over the run's steps after warmup filled in
  // (config_.optimizer.schedule.decay_steps); ValueError when nothing is left to decay over.
  kernels::ScheduleParams schedule_params();
  // The members' variable `name` stacked, and the reverse, at `step` (Placement::stacked, restore).
  std::vector<float> stacked(const std::string& name) const { return placement_->stacked(states_, name); }
  void restore(const std::vector<float>& params, const std::vector<float>& state,
               const std::map<std::string, std::vector<float>>& opt, std::int64_t step) {
    placement_->restore(states_, params, state, opt, step);
  }
  // Zeros for every optimizer slot, as restore takes them.
  std::map<std::string, std::vector<float>> zero_optimizer_state() const;
  // Early stopping after an epoch evaluated into m: the members' best epochs and stops.
  void update_early_stopping(const EpochMetrics& m);
  // Puts the kept best parameters and model state of the members `which` back on the devices.
  void restore_best(const std::vector<int>& which);
  // The members early stopping has stopped.
  std::vector<int> stopped_members() const;
  // Fills the training feed's next host batch with examples order[begin, begin + batch size) (the rows this
  // process fills: Placement::own_rows).
  void fill_train_batch(const std::vector<std::uint32_t>& order, std::int64_t begin);

  TrainConfig config_;
  Dataset held_train_, validation_;  // the training set split, when a validation set is held out
  const Dataset& train_;             // the caller's training set, or held_train_
  const Dataset& test_;
  std::unique_ptr<Sequential> model_;
  std::unique_ptr<Optimizer> optimizer_;
  Mesh mesh_;
  std::unique_ptr<Placement> placement_;  // the members' places: which device, which blocks of the weights
  Key init_key_{}, data_key_{};
  StepOptions options_;
  Sharded<TrainState> states_;
  std::vector<std::unique_ptr<DeviceWork>> work_;
  Sharded<DeviceWork*> work_ptrs_;
  std::unique_ptr<Feed<Batch>> train_feed_;  // batches of config.batch_size (sharded in data parallel)
  std::unique_ptr<Evaluator> evaluator_;     // the test set's feed and the report's buffers
  std::unique_ptr<Evaluator> validator_;     // the validation set's, when one is held out
  std::vector<MemberStopping> stopping_;     // per member, when early stopping is on
  std::vector<float> best_params_, best_state_;  // stacked as params(): each member's at its best epoch
  int epochs_done_ = 0;
  std::vector<EpochMetrics> history_;
};

}  // namespace pmap::ensemble
