// The program's configuration: its flags as one TrainConfig (mode, mesh and --layout, model, optimizer and
// schedule, data, outputs), their checks against the data and the device count, and their JSON (recorded in
// metrics and checkpoints); the models it builds by name with the recipe each comes with; and what a
// checkpoint file holds, for setting up its evaluation. The library knows none of these: the program reads
// them into train::Trainer's options (recipe.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pmap/device.h>

#include <pmapcc/io/json.h>
#include <pmapcc/kernels/ops.h>
#include <pmapcc/kernels/optimizer_ops.h>
#include <pmapcc/train/data.h>
#include <pmapcc/train/metrics.h>

namespace pmap::ensemble {

using io::Calibration;
using io::EpochMetrics;
using io::Predictions;
using io::ReliabilityBin;
using io::SizePoint;
using train::Dataset;
using train::gather_batch;
using train::load_idx_pair;
using train::load_mnist;
using train::Split;
using train::split_validation;
using train::steps_per_epoch;

// What a final evaluation adds to an epoch's metrics: the ensemble of the first k members for k = 1..M, and
// every test image's results (train::Evaluation's size_curve and predictions).
struct EnsembleReport {
  std::vector<SizePoint> size_curve;
  Predictions predictions;
};

// --layout: Keras's LayoutMap and JAX's PartitionSpec, by the weights' names as checkpoints name them
// ("Conv_0/kernel", "Dense_1/bias").

// One tensor's layout: for each leading dimension, the mesh axis it is split over, or none. Dimensions
// past the end are not split; an empty spec is the replicated layout.
struct PartitionSpec {
  std::vector<std::optional<std::string>> dims;

  bool replicated() const;  // no dimension split
  // "(None, 'model')", as Keras and JAX print layouts; "()" for the replicated one.
  std::string str() const;
  // "None,model", "(None, 'model')", "model", "()" (spaces and quotes optional; "none" or "None" for none).
  // Throws ValueError naming the text and what is wrong (an empty entry, a malformed axis name).
  static PartitionSpec parse(std::string_view text);

  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;
};

// Weight-name patterns to layouts. A pattern is an ECMAScript regular expression that must match the
// whole name; patterns are tried in the order they were added and the first match wins; a weight that
// no pattern matches is replicated (Keras's LayoutMap, with full matches). A layer's output is named
// "<layer>/output" ("Dense_0/output", as Keras's "d2/output"): its layout says where split features are
// gathered (recipe_sharding). Lookups compile the patterns again (a layout is resolved once, for a handful of
// weights), which keeps <regex> out of this header.
class LayoutMap {
 public:
  struct Entry {
    std::string pattern;
    PartitionSpec spec;
    bool must_match = false;  // a user's rule: one that matches no weight or layer output is refused
  };

  // Throws ValueError naming the pattern when it is not a valid regular expression. must_match: the rule is
  // the user's (a default rule may match nothing in a model it does not fit).
  void add(std::string pattern, PartitionSpec spec, bool must_match = false);
  // The layout of weight `name`, and which entry gave it (nullopt: none matched, replicated).
  PartitionSpec layout_of(std::string_view name, std::optional<std::size_t>* entry = nullptr) const;
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

// The reference CNN's default model-parallel layout (Megatron's pattern over the "model" axis): Dense_0,
// 97 % of the weights, column-parallel (kernel (None, 'model'), bias ('model',)), Dense_1 row-parallel
// (kernel ('model', None)), everything else replicated.
LayoutMap reference_cnn_layout();

// A learning-rate schedule (kernels::ScheduleParams), as the program's --lr-schedule writes it:
//   constant                    the base rate
//   cosine[:ALPHA]              cosine decay to ALPHA x the base rate (default 0) over decay_steps
//   exponential:RATE:STEPS      the base rate x RATE^(step / STEPS)
//   piecewise:S1=F1,S2=F2,...   the base rate x Fi from step Si on (S increasing; x1 before S1)
// and warmup_steps of linear warmup from 0 before any of them (--warmup-steps).
struct Schedule {
  kernels::ScheduleKind kind = kernels::ScheduleKind::constant;
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 0;                         // cosine: 0 means the rest of the run (resolved_config)
  double decay_rate = 1.0;                              // exponential
  double alpha = 0.0;                                   // cosine
  std::vector<std::pair<std::int64_t, double>> pieces;  // piecewise: (from step, factor)

  std::string str() const;                 // the --lr-schedule text that parses back to this (without warmup)
  kernels::ScheduleParams params() const;  // ValueError naming --lr-schedule when it cannot be run
};
// ValueError naming --lr-schedule and what is wrong (an unknown kind, a bad number, zero or negative steps).
Schedule parse_schedule(std::string_view text);

// The optimizers --optimizer names: "sgd", "adam", "adamw".
std::vector<std::string> optimizer_names();

// Everything an optimizer is built from. Keras's defaults: adam/adamw beta_1 0.9, beta_2 0.999, epsilon 1e-7;
// adamw's weight decay 0.004.
struct OptimizerConfig {
  std::string name = "sgd";                // sgd | adam | adamw (optimizer_names())
  std::vector<float> learning_rate;        // empty: the optimizer's default (sgd 0.1; adam, adamw 0.001); else
                                           // one for every member, or one per member (a hyper-parameter ensemble)
  float momentum = 0.9f;                   // sgd
  bool nesterov = false;                   // sgd
  double beta_1 = 0.9, beta_2 = 0.999;     // adam, adamw
  float epsilon = 1e-7f;                   // adam, adamw
  std::vector<float> weight_decay;         // empty: the optimizer's default; else one, or one per member
  float clip_norm = 0.0f;                  // > 0: clip each member's gradients to this global norm
  Schedule schedule;

  // "sgd lr 0.1, momentum 0.9", "adamw lr 0.001, weight decay 0.004, clip norm 1, cosine after 100 warmup
  // steps": what the program's header prints.
  std::string str() const;
  // The weight decay of global member g (learning_rate likewise): the default, one value for all, or the
  // member's own (ValueError naming the flag when the list has no value for it).
  float weight_decay_of(int member) const;
  float learning_rate_of(int member) const;
  // Every member's learning rate (weight decay): one value when all share it, else one per member.
  std::vector<float> learning_rates(int members) const;
  std::vector<float> weight_decays(int members) const;
  // The copies of the parameters the optimizer keeps: SGD's momentum (1), Adam's two moments (2).
  int slots() const { return name == "sgd" ? 1 : 2; }
  // ValueError naming the flag (--optimizer, --lr, --momentum, --weight-decay, --clip-norm, --lr-schedule,
  // --warmup-steps) for a value out of range, or per-member lists that are not `members` long.
  void check(int members) const;
};

// The models the program can build by name (--model): train::model_names(), "flax-cnn" and "keras-convnet".
std::vector<std::string> model_names();
// The training recipe a model comes with, which the program uses where its flags leave it open: flax-cnn
// the Flax example's (SGD, momentum 0.9, lr 0.1, batch 128), keras-convnet the Keras guides' (Adam 1e-3,
// batch 64). ValueError naming --model for an unknown name.
struct ModelRecipe {
  std::string optimizer;
  int batch_size;
};
ModelRecipe model_recipe(const std::string& name);
// ensemble: members spread over the "ensemble" axis, each seeing the whole batch. data_parallel: one model
// replicated over the "data" axis, the batch split over it. model_parallel: one model on a ("data",
// "model") mesh, its weights split over "model" by a LayoutMap, the batch split over "data".
enum class Mode { ensemble, data_parallel, model_parallel };

std::string_view to_string(Mode m);
Mode parse_mode(std::string_view text);  // "ensemble" | "data-parallel" | "model-parallel"; ValueError otherwise

struct TrainConfig {
  DeviceKind backend = DeviceKind::cpu;
  int devices = 0;   // 0: the default device count (PMAPCC_CPU_DEVICES or cores; all GPUs); per process.
                     // resolved_config's is the mesh's total over every process.
  int members = 0;   // 0: one per device along the "ensemble" axis (ensemble), 1 (data or model parallel)
  Mode mode = Mode::ensemble;
  // --mesh AxM: a 2-D mesh of A devices along the mode's axis ("ensemble"; "data" in both parallel modes)
  // by M along "model", each member's weights split over the M devices of its row by `layout`. 0, 0 (not
  // given): A = every device and M = 1; model-parallel mode: A = 1 and M = every device. A x M must be the
  // mesh's device count; resolved_config fills both in.
  int mesh_axis = 0, mesh_model = 0;
  // Which weights are split over "model", and how (LayoutMap): used in model-parallel mode and whenever
  // mesh_model > 1. The program puts its --layout entries before these defaults.
  LayoutMap layout = reference_cnn_layout();
  // The model: a name of model_names() (--model).
  std::string model = "flax-cnn";
  std::vector<std::string> architecture;  // set by resolved_config: train::Model::architecture()
  int epochs = 10;
  int batch_size = 128;
  // The optimizer, its learning rates (one per member for a hyper-parameter ensemble), schedule, weight
  // decay and clipping (OptimizerConfig). A cosine schedule's decay_steps 0 becomes the run's steps
  // after warmup (epochs x steps per epoch); resolved_config fills it in.
  OptimizerConfig optimizer;
  // Dropout rates (--dropout): empty, the model's own; one value, every member's; one per member, each
  // member's own (a hyper-parameter ensemble). Each replaces the rate of every Dropout layer of the model.
  std::vector<float> dropout;
  std::uint64_t seed = 0;
  // --validation-split F: the fraction of the training set (after train_limit) held out as a validation set,
  // drawn with the data key (split_validation in data.h); 0: none. With one, every epoch is evaluated on it
  // and the test set only once, at the end (Trainer::evaluate).
  double validation_split = 0;
  // --early-stopping-patience N (0: off; needs validation_split): a member whose validation NLL has not
  // improved for N epochs stops, with its best epoch's parameters, while the others go on (Trainer).
  int patience = 0;
  std::int64_t train_limit = -1;  // first N training examples (-1: all)
  std::int64_t test_limit = -1;
  int eval_batch = 1000;
  bool pin_threads = false;  // pin device worker i to core i (MeshOptions::pin_threads; CPU devices)
  int member_group = 0;      // members per vmap on a device (0: StepOptions::member_batch's default); speed, memory
  // Train steps between gathers of the per-step losses (0: 1 on CPU devices, which keeps the processes of
  // a multi-process mesh in step; 16 on GPUs, where each gather waits for the GPU). Changes no result.
  int report_every = 0;
  // Run the CUDA backend's kernels on the host (CPU devices only): the check of the CUDA code where there
  // is no GPU (kernels::cuda_backend_on_host). Slow; results agree with the CPU ops to ~1e-6.
  bool cuda_kernels_on_host = false;
  // Capture each device's train step in a graph and replay it (backends that capture: CUDA); false runs
  // every step's kernels one by one (for comparison). Changes no result.
  bool graphs = true;
  // --precision: of the conv and dense products (kernels::Precision): fp32, or bf16 mixed precision (bf16
  // operands, fp32 sums; parameters, gradients and optimizer state stay fp32). bf16 needs CPU devices with
  // AVX512_BF16 and the avx512 kernels; the Trainer refuses it elsewhere.
  kernels::Precision precision = kernels::Precision::fp32;
  int processes = 1;         // set by resolved_config: processes the mesh spans
  std::string dataset = "mnist";  // the data's name, for the outputs: mnist | fashion-mnist

  // Whether the members' weights are split over a "model" axis (model-parallel mode, or mesh_model > 1).
  bool splits_weights() const { return mode == Mode::model_parallel || mesh_model > 1; }

  // Every field, for metrics and checkpoints ("layout" only when splits_weights(); the optimizer's fields
  // that it uses). Floats as given: the shortest decimal that reads back to the same float (0.1, not
  // 0.10000000149011612); a per-member list as an array.
  io::Json to_json() const;
  std::string mesh_text() const;  // --mesh as given: "AxM" ("0x0" when not given)
  // ValueError naming the flag for a setting that cannot run on `devices` devices along the mode's axis
  // with this data (`along`: the devices along the mode's axis).
  void check(int along, const Dataset& train, const Dataset& test) const;
};


// What a checkpoint holds, for setting up its evaluation: its members, epochs and recorded configuration, and
// its format (the runner's "pmapcc.ensemble.v2" or "v1", train::Trainer's "pmapcc.train.v1").
struct CheckpointSummary {
  int members = 0;
  int epochs_done = 0;
  io::Json config;
  std::string format;
};
CheckpointSummary inspect_checkpoint(const std::filesystem::path& path);

}  // namespace pmap::ensemble
