// Trainer: trains an ensemble of models (or one data-parallel model) over a mesh of devices, an epoch
// at a time, and evaluates members and ensemble on the test set. Keys: key(seed) splits into an init
// key and a data key; member g starts from split(init_key, members)[g] (so it does not depend on the
// number of devices); epoch e visits the training set in permutation(fold_in(data_key, e)).
//
// Several processes (mpirun/srun, after distributed::initialize()): the mesh spans every process's
// devices (config.devices of them per process), each process trains the members on its own devices,
// and per-step and per-member results are all-gathered over the mesh, so every process holds the same
// metrics, equal bit for bit to one process with as many devices. Every process must make the same
// calls (run_epoch, evaluate, params, momentum, save_checkpoint, load_checkpoint) in the same order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <pmap/feed.h>
#include <pmap/pmap.h>
#include <pmap/random.h>

#include <pmapcc/ensemble/data.h>
#include <pmapcc/ensemble/layout.h>
#include <pmapcc/ensemble/metrics.h>
#include <pmapcc/ensemble/model.h>
#include <pmapcc/ensemble/step.h>
#include <pmapcc/io/json.h>

namespace pmap::ensemble {

// ensemble: members spread over the "ensemble" axis, each seeing the whole batch. data_parallel: one model
// replicated over the "data" axis, the batch split over it. model_parallel: one model on a ("data",
// "model") mesh, its weights split over "model" by a LayoutMap, the batch split over "data".
enum class Mode { ensemble, data_parallel, model_parallel };

// What a checkpoint holds, for setting up its evaluation: its members, epochs and recorded configuration.
struct CheckpointSummary {
  int members = 0;
  int epochs_done = 0;
  io::Json config;
};
CheckpointSummary inspect_checkpoint(const std::filesystem::path& path);

// What a final evaluation adds: the ensemble of the first k members for k = 1..M, and per-image results.
struct EnsembleReport {
  std::vector<SizePoint> size_curve;
  Predictions predictions;
};
std::string_view to_string(Mode m);
Mode parse_mode(std::string_view text);  // "ensemble" | "data-parallel" | "model-parallel"; ValueError otherwise

struct TrainConfig {
  DeviceKind backend = DeviceKind::cpu;
  int devices = 0;   // 0: the default device count (PMAPCC_CPU_DEVICES or cores; all GPUs); per process.
                     // Trainer::config().devices is the mesh's total over every process.
  int members = 0;   // 0: one per device along the "ensemble" axis (ensemble), 1 (data or model parallel)
  Mode mode = Mode::ensemble;
  // --mesh AxM: a 2-D mesh of A devices along the mode's axis ("ensemble"; "data" in both parallel modes)
  // by M along "model", each member's weights split over the M devices of its row by `layout`. 0, 0 (not
  // given): A = every device and M = 1; model-parallel mode: A = 1 and M = every device. A x M must be the
  // mesh's device count; the Trainer fills both in.
  int mesh_axis = 0, mesh_model = 0;
  // Which weights are split over "model", and how (layout.h): used in model-parallel mode and whenever
  // mesh_model > 1. The program puts its --layout entries before these defaults.
  LayoutMap layout = reference_cnn_layout();
  int epochs = 10;
  int batch_size = 128;
  float learning_rate = 0.1f;
  float momentum = 0.9f;
  std::uint64_t seed = 0;
  std::int64_t train_limit = -1;  // first N training examples (-1: all)
  std::int64_t test_limit = -1;
  int eval_batch = 1000;
  bool pin_threads = false;  // pin device worker i to core i (MeshOptions::pin_threads; CPU devices)
  int member_group = 0;      // members a device runs at once (0: default_member_group); speed and memory only
  // Train steps between gathers of the per-step losses (0: 1 on CPU devices, which keeps the processes of
  // a multi-process mesh in step; 16 on GPUs, where each gather waits for the GPU). Changes no result.
  int report_every = 0;
  // Run the CUDA backend's kernels on the host (CPU devices only): the check of the CUDA code where there
  // is no GPU (kernels::cuda_backend_on_host). Slow; results agree with the CPU ops to ~1e-6.
  bool cuda_kernels_on_host = false;
  // Capture each device's train step in a graph and replay it (backends that capture: CUDA); false runs
  // every step's kernels one by one (for comparison). Changes no result.
  bool graphs = true;
  int processes = 1;         // set by the Trainer: processes the mesh spans
  std::string dataset = "mnist";  // the data's name, for the outputs: mnist | fashion-mnist

  // Whether the members' weights are split over a "model" axis (model-parallel mode, or mesh_model > 1).
  bool splits_weights() const { return mode == Mode::model_parallel || mesh_model > 1; }

  // Every field, for metrics and checkpoints ("layout" only when splits_weights()). lr and momentum as
  // given: the shortest decimal that reads back to the same float (0.1, not 0.10000000149011612).
  io::Json to_json() const;
};

// What run_epoch reports after each training step.
struct StepReport {
  int step = 0;                    // 1-based, within the epoch
  int steps = 0;                   // the epoch's steps
  double loss = 0;                 // this step's loss: the mean over members (data parallel: over the replicas' blocks)
  double running_loss = 0;         // the mean of the epoch's step losses so far
  double images_per_second = 0;    // model-images per second so far
};
using StepCallback = std::function<void(const StepReport&)>;

class Trainer {
 public:
  // Validates the config against the data (raises ValueError naming the flag), builds the mesh and
  // initializes every member.
  Trainer(TrainConfig config, const Dataset& train, const Dataset& test);
  ~Trainer();

  const TrainConfig& config() const { return config_; }
  const Sequential& model() const { return *model_; }
  // Where each weight lives when splits_weights() (nullptr otherwise).
  const ShardingPlan* plan() const { return plan_.get(); }
  const Mesh& mesh() const { return mesh_; }
  int members_per_device() const { return members_per_device_; }
  int member_group() const;  // the members a device runs at once
  int total_members() const { return total_members_; }
  int epochs_done() const { return epochs_done_; }
  int steps_per_epoch() const;
  // Rows of each device's per-step log: report_every, at most an epoch's steps.
  int log_rows() const;
  const std::vector<EpochMetrics>& history() const { return history_; }

  // Trains the next epoch, evaluates, appends to history() and returns the epoch's metrics.
  EpochMetrics run_epoch(const StepCallback& on_step = {});
  // Per-member test loss, accuracy and calibration and the ensemble's accuracy and calibration, into m
  // (epoch and timings untouched). Computed on the devices, from the probabilities accuracy comes from.
  void evaluate(EpochMetrics& m);
  // As evaluate (the same bits into m), and also the ensemble-size curve and every test image's results.
  EnsembleReport evaluate_report(EpochMetrics& m);

  // Whether this process writes the run's files: the one that owns the mesh's first device (every
  // process when the mesh does not span processes).
  bool is_main_process() const;

  // Every member's parameters (momentum), in host memory, stacked as a checkpoint holds them
  // (ensemble/member_layout.h, M = total_members()). On every process (collective).
  std::vector<float> params() const;
  std::vector<float> momentum() const;
  std::int64_t step() const;

  // Checkpoints (safetensors): everything needed to continue exactly. load_checkpoint checks that the
  // file was written for the same model, members, seed, batch size and optimizer settings. Across
  // processes both are collective: save_checkpoint gathers every member and only the main process
  // writes; every process reads the file in load_checkpoint (a path all of them can see).
  void save_checkpoint(const std::filesystem::path& path) const;
  void load_checkpoint(const std::filesystem::path& path);
  // Evaluation of a saved ensemble: this trainer's members (config().members of them) become the
  // checkpoint's members `subset` (indices into its members, in that order; empty: all of them, which must
  // then be as many), momentum zero. Checks the model's tensors, not the recipe. DataError for a file
  // that does not fit, ValueError for a subset that does not.
  void load_members(const std::filesystem::path& path, const std::vector<int>& subset);

 private:
  // The devices' step buffers, the feeds and the backend's handles (allocated once, here).
  void make_device_work();
  void make_plan();  // plan_ and local_ from config.layout; ValueError for a weight split over the first axis
  void init_members();
  void evaluate_into(EpochMetrics& m, EnsembleReport* report);
  void check_processes_agree() const;  // ValueError unless every process has the same config and data
  // The members' `field` (params or momentum) stacked, gathered from every device (weights split over
  // "model" put back together); and the reverse: each device's members (its blocks of their weights) from
  // stacked params and momentum, at `step`.
  std::vector<float> stacked(Array TrainState::*field) const;
  void restore(const std::vector<float>& params, const std::vector<float>& momentum, std::int64_t step);
  // The model a device runs: the local model when weights are split, else the model.
  const Sequential& device_model() const { return local_.model ? *local_.model : *model_; }
  // Fills a feed's next host batch with examples order[begin, begin + size) of data.
  void fill_batch(Feed<Batch>& feed, const std::vector<std::uint32_t>& order, std::int64_t begin, int size,
                  const Dataset& data, bool own_rows_only);

  TrainConfig config_;
  const Dataset& train_;
  const Dataset& test_;
  std::unique_ptr<Sequential> model_;
  Mesh mesh_;
  std::unique_ptr<ShardingPlan> plan_;  // splits_weights(): each weight's blocks
  LocalModel local_;                    // splits_weights(): the model a device runs, and its layers' splits
  std::vector<int> mesh_index_;  // mesh position of each local device
  int members_per_device_ = 1;
  int total_members_ = 1;
  Key init_key_{}, data_key_{};
  StepOptions options_;
  Sharded<TrainState> states_;
  std::vector<std::unique_ptr<DeviceWork>> work_;
  Sharded<DeviceWork*> work_ptrs_;
  std::unique_ptr<Feed<Batch>> train_feed_;  // batches of config.batch_size (sharded in data parallel)
  std::unique_ptr<Feed<Batch>> eval_feed_;   // batches of eval_batch, replicated
  std::vector<std::unique_ptr<ReportWork>> report_work_;  // per local device, made by the first report
  int epochs_done_ = 0;
  std::vector<EpochMetrics> history_;
};

}  // namespace pmap::ensemble
