// What the training examples (flax_ensemble, keras_data_parallel, resnet_ensemble) share outside their
// stories: the program's data flags (--data --train-limit --test-limit --epochs --devices --members --seed
// --metrics-json, as mnist_ensemble spells them) and the per-epoch report with mnist_ensemble's `final` keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <pmap/array.h>
#include <pmap/mesh.h>
#include <pmapcc/core/jit.h>
#include <pmapcc/kernels/ops.h>

namespace examples {

// The Trainer's dropout stream: a member's dropout key is fold_in(its key, kDropoutStream).
inline constexpr std::uint32_t kDropoutStream = 0x64726f70;

struct Flags {
  std::string program;   // names the program in messages and in the metrics file
  std::string axis;      // the mesh axis --devices lays out ("ensemble", "data")
  std::string data, backend = "cpu", metrics_json;
  std::int64_t train_limit = -1, test_limit = -1;
  int epochs = 10, devices = 0, members = 0, batch = 128;
  std::uint64_t seed = 0;
  float lr = 0.1f;
  float momentum = -1.0f;  // SGD's momentum: a --momentum flag with this default when >= 0
  bool can_save = false;   // a --save flag: the trained parameters written there
  std::string save;
  int cpu_threads = -1;    // --cpu-threads: -1 not given, 0 auto, else the count
  bool has_precision = false;  // a --precision flag (fp32 | bf16): the products' arithmetic, into `precision`
  pmap::kernels::Precision precision = pmap::kernels::Precision::fp32;
};

// One epoch's figures; train_accuracy < 0: not measured (left out of the line and the file).
struct EpochReport {
  int epoch = 0;
  double train_loss = 0, train_accuracy = -1;
  std::vector<double> member_test_accuracy;
  double ensemble_test_accuracy = 0, model_images_per_second = 0, seconds = 0;
};

// Fills f from the command line (f's values are the defaults). --help prints the usage and exits 0; a bad
// flag prints CLI11's message naming it and exits 2 (before the program has started anything).
void parse(Flags& f, int argc, char** argv, const std::string& description);

// --cpu-threads, as mnist_ensemble applies it (kernels/cpu_backend.h's cpu::set_threads): on CPU devices,
// auto (0) gives each of the mesh's local devices its share of the cores; without the flag a set
// PMAPCC_CPU_THREADS stands, else auto. The thread count never changes a result's bits, only the speed.
void share_cores(const Flags& f, const pmap::Mesh& mesh);

// Prints an epoch's line and keeps it; finish() prints each member's test accuracy and writes
// --metrics-json ({"program", "config", "epochs": [...], "final": the last epoch}) atomically.
class Metrics {
 public:
  explicit Metrics(const Flags& f) : f_(f) {}
  void epoch(const EpochReport& r);
  void finish() const;  // IoError naming --metrics-json when the file cannot be written

 private:
  const Flags& f_;
  nlohmann::json epochs_ = nlohmann::json::array();
};

// One line of what a jitted step counted: "jit NAME: T trace(s), R replays (D left the plan), arenas X MB;
// the latest call allocated A arrays besides its N results" (the CLI tests read it).
void print_jit(const char* name, const pmap::JitStats& s);

// Writes every member's parameters to `path` as mnist_ensemble's checkpoints name them ("params/<tensor>",
// the members stacked in device order), so the two programs' models can be compared: leaves[d] are device
// d's (members, ...) tensors, in the order of `names`. IoError naming --save when it cannot be written.
void save_params(const std::string& path, const std::vector<std::string>& names,
                 const std::vector<std::vector<const pmap::Array*>>& leaves);

}  // namespace examples
