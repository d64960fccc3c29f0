// Command-line options of the mnist_ensemble program: parsing with one-line errors, and --help text.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <pmap/error.h>

#include "examples/mnist_ensemble/config.h"

namespace pmap::ensemble {

// A bad command line: the program prints what() on one line and exits with status 2.
class UsageError : public ValueError {
 public:
  explicit UsageError(const std::string& m) : ValueError(m) {}
};

struct CliOptions {
  TrainConfig train;
  std::filesystem::path data = "data/mnist";  // --data, else data/<--dataset>
  std::filesystem::path metrics_json, metrics_csv, plot, save, resume;
  std::filesystem::path evaluate;  // a checkpoint to evaluate instead of training
  std::filesystem::path predict;   // per-image predictions CSV
  std::filesystem::path export_onnx;  // --export-onnx: the ensemble (or one member) as an ONNX model
  int export_member = -1;             // --export-member: that member alone (-1: the ensemble)
  std::vector<int> members_subset;  // with --evaluate: the checkpoint's members to evaluate
  std::vector<std::string> layouts;  // --layout NAME=SPEC, as given (train.layout holds them, then the defaults)
  int cpu_threads = -1;  // --cpu-threads: threads per CPU device (0: auto; -1: not given)
  std::string progress = "auto";
  bool summary = false;     // --summary: print the model's table (training prints it anyway)
  bool no_summary = false;  // --no-summary: training does not print it at the start
  bool help = false;
  bool version = false;  // --version
};

// The display name of a --dataset value: "MNIST", "Fashion-MNIST".
std::string dataset_title(const std::string& dataset);

// Parses argv[1..argc). Accepts "--flag value" and "--flag=value". Throws UsageError naming the flag.
CliOptions parse_cli(const std::vector<std::string>& args);
// The grouped --help text, with defaults.
std::string cli_help(const std::string& program);

// Whether this build can write ONNX models (--export-onnx; PMAPCC_WITH_ONNX found ONNX and Protobuf).
bool onnx_export_built();

// Checks, before anything runs, that every output path asked for (--save, --metrics-json, --metrics-csv,
// --plot, --predict, --export-onnx) can be written: its directory exists and is writable, the path is not a directory,
// and no two outputs share a path. Throws UsageError naming the flag and the path.
void check_output_paths(const CliOptions& o);

}  // namespace pmap::ensemble
