// TrainConfig: everything a training run is set up from (the program's flags), its checks against the
// data and the device count, and its JSON (recorded in metrics and checkpoints).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <pmap/device.h>

#include <pmapcc/ensemble/data.h>
#include <pmapcc/ensemble/layout.h>
#include <pmapcc/ensemble/optimizer.h>
#include <pmapcc/io/json.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::ensemble {

// ensemble: members spread over the "ensemble" axis, each seeing the whole batch. data_parallel: one model
// replicated over the "data" axis, the batch split over it. model_parallel: one model on a ("data",
// "model") mesh, its weights split over "model" by a LayoutMap, the batch split over "data".
enum class Mode { ensemble, data_parallel, model_parallel };

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
  // The model: a name of make_model's registry (--model), or the name of the model a Trainer was given.
  std::string model = "flax-cnn";
  std::vector<std::string> architecture;  // set by the Trainer: its model's Sequential::architecture()
  int epochs = 10;
  int batch_size = 128;
  // The optimizer, its learning rates (one per member for a hyper-parameter ensemble), schedule, weight
  // decay and clipping (ensemble/optimizer.h). A cosine schedule's decay_steps 0 becomes the run's steps
  // after warmup (epochs x steps per epoch); the Trainer fills it in.
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
  // --precision: of the conv and dense products (kernels::Precision): fp32, or bf16 mixed precision (bf16
  // operands, fp32 sums; parameters, gradients and optimizer state stay fp32). bf16 needs CPU devices with
  // AVX512_BF16 and the avx512 kernels; the Trainer refuses it elsewhere.
  kernels::Precision precision = kernels::Precision::fp32;
  int processes = 1;         // set by the Trainer: processes the mesh spans
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

}  // namespace pmap::ensemble
