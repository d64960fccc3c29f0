// mnist_ensemble's command line: a table of flags, strict number parsing, grouped help.
#include "cli.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <map>

namespace pmap::ensemble {
namespace {

template <class T> T parse_number(const std::string& flag, const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc{} || p != end || text.empty()) {
    const char* kind = std::is_floating_point_v<T> ? "a number" : "an integer";
    throw UsageError(flag + ": '" + text + "' is not " + kind);
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(v)) throw UsageError(flag + ": '" + text + "' is not a finite number");
  }
  return v;
}

int positive_int(const std::string& flag, const std::string& text, int min = 1, int max = 1'000'000'000) {
  const long long v = parse_number<long long>(flag, text);
  if (v < min || v > max)
    throw UsageError(flag + ": " + text + " is out of range (" + std::to_string(min) + ".." + std::to_string(max) + ")");
  return static_cast<int>(v);
}

// Devices are worker threads (and, on GPUs, streams): as many as PMAPCC_CPU_DEVICES allows.
constexpr int kMaxDevices = 4096;

// "0,2,5": distinct member indices, in order.
std::vector<int> member_list(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    if (item.empty()) throw UsageError(flag + ": '" + text + "' has an empty entry (expected e.g. 0,2,5)");
    const int m = positive_int(flag, item, 0);
    for (int seen : out)
      if (seen == m) throw UsageError(flag + ": member " + item + " is named twice");
    out.push_back(m);
    start = comma + 1;
  }
  return out;
}

using Setter = std::function<void(CliOptions&, const std::string& flag, const std::string& value)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table{
      {"--data", [](CliOptions& o, const std::string&, const std::string& v) { o.data = v; }},
      {"--dataset", [](CliOptions& o, const std::string& f, const std::string& v) {
         if (v != "mnist" && v != "fashion-mnist") throw UsageError(f + ": '" + v + "' is not mnist or fashion-mnist");
         o.train.dataset = v;
       }},
      {"--evaluate", [](CliOptions& o, const std::string&, const std::string& v) { o.evaluate = v; }},
      {"--members-subset", [](CliOptions& o, const std::string& f, const std::string& v) {
         o.members_subset = member_list(f, v);
       }},
      {"--predict", [](CliOptions& o, const std::string&, const std::string& v) { o.predict = v; }},
      {"--backend", [](CliOptions& o, const std::string& f, const std::string& v) {
         if (v != "cpu" && v != "cuda") throw UsageError(f + ": '" + v + "' is not cpu or cuda");
         o.train.backend = parse_device_kind(v);
       }},
      {"--devices", [](CliOptions& o, const std::string& f, const std::string& v) {
         o.train.devices = positive_int(f, v, 1, kMaxDevices);
       }},
      {"--kernels", [](CliOptions& o, const std::string& f, const std::string& v) {
         if (v != "native" && v != "cuda-on-host") throw UsageError(f + ": '" + v + "' is not native or cuda-on-host");
         o.train.cuda_kernels_on_host = v == "cuda-on-host";
       }},
      {"--report-every", [](CliOptions& o, const std::string& f, const std::string& v) {
         o.train.report_every = positive_int(f, v);
       }},
      {"--members", [](CliOptions& o, const std::string& f, const std::string& v) { o.train.members = positive_int(f, v); }},
      {"--mode", [](CliOptions& o, const std::string& f, const std::string& v) {
         if (v != "ensemble" && v != "data-parallel") throw UsageError(f + ": '" + v + "' is not ensemble or data-parallel");
         o.train.mode = parse_mode(v);
       }},
      {"--epochs", [](CliOptions& o, const std::string& f, const std::string& v) { o.train.epochs = positive_int(f, v, 0); }},
      {"--batch-size", [](CliOptions& o, const std::string& f, const std::string& v) { o.train.batch_size = positive_int(f, v); }},
      {"--lr", [](CliOptions& o, const std::string& f, const std::string& v) {
         o.train.learning_rate = parse_number<float>(f, v);
         if (!(o.train.learning_rate > 0)) throw UsageError(f + ": the learning rate must be positive, got " + v);
       }},
      {"--momentum", [](CliOptions& o, const std::string& f, const std::string& v) {
         o.train.momentum = parse_number<float>(f, v);
         if (!(o.train.momentum >= 0 && o.train.momentum < 1)) throw UsageError(f + ": must be in [0, 1), got " + v);
       }},
      {"--seed", [](CliOptions& o, const std::string& f, const std::string& v) {
         o.train.seed = parse_number<std::uint64_t>(f, v);
       }},
      {"--train-limit", [](CliOptions& o, const std::string& f, const std::string& v) { o.train.train_limit = positive_int(f, v); }},
      {"--test-limit", [](CliOptions& o, const std::string& f, const std::string& v) { o.train.test_limit = positive_int(f, v); }},
      {"--metrics-json", [](CliOptions& o, const std::string&, const std::string& v) { o.metrics_json = v; }},
      {"--metrics-csv", [](CliOptions& o, const std::string&, const std::string& v) { o.metrics_csv = v; }},
      {"--plot", [](CliOptions& o, const std::string&, const std::string& v) { o.plot = v; }},
      {"--save", [](CliOptions& o, const std::string&, const std::string& v) { o.save = v; }},
      {"--resume", [](CliOptions& o, const std::string&, const std::string& v) { o.resume = v; }},
      {"--progress", [](CliOptions& o, const std::string& f, const std::string& v) {
         if (v != "auto" && v != "bar" && v != "plain" && v != "none")
           throw UsageError(f + ": '" + v + "' is not auto, bar, plain or none");
         o.progress = v;
       }},
  };
  return table;
}

}  // namespace

std::string dataset_title(const std::string& dataset) { return dataset == "fashion-mnist" ? "Fashion-MNIST" : "MNIST"; }

CliOptions parse_cli(const std::vector<std::string>& args) {
  CliOptions o;
  bool data_given = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    const auto eq = flag.find('=');
    const bool inline_value = flag.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto it = setters().find(flag);
    if (it == setters().end()) {
      if (flag.rfind("-", 0) == 0) throw UsageError("unknown flag '" + flag + "'");
      throw UsageError("unexpected argument '" + flag + "' (flags start with --)");
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
      value = args[++i];
    }
    if (value.empty()) throw UsageError(flag + " needs a non-empty value");
    it->second(o, flag, value);
    data_given = data_given || flag == "--data";
  }
  if (!data_given) o.data = "data/" + o.train.dataset;
  if (!o.members_subset.empty() && o.evaluate.empty())
    throw UsageError("--members-subset picks members of the checkpoint given with --evaluate");
  if (!o.evaluate.empty() && (!o.save.empty() || !o.resume.empty()))
    throw UsageError("--evaluate trains nothing: it takes neither --save nor --resume");
  if (!o.evaluate.empty() && !o.metrics_csv.empty())
    throw UsageError("--evaluate writes no per-epoch CSV: use --metrics-json (and --predict)");
  return o;
}

std::string cli_help(const std::string& program) {
  return "usage: " + program + " [flags]\n"
         "Trains an ensemble of MNIST CNNs (the Flax example's model and recipe), one or more members per\n"
         "device, and reports each member's and the ensemble's test accuracy and calibration (NLL, Brier\n"
         "score, expected calibration error, predictive entropy).\n"
         "\n"
         "Data:\n"
         "  --dataset D           mnist | fashion-mnist (names the data, picks the directory)  [mnist]\n"
         "  --data DIR            the IDX files (raw or .gz)              [data/<dataset>]\n"
         "  --train-limit N       use the first N training examples      [all]\n"
         "  --test-limit N        use the first N test examples          [all]\n"
         "Devices:\n"
         "  --backend cpu|cuda    device kind                            [cpu]\n"
         "  --devices N           devices in the mesh  [PMAPCC_CPU_DEVICES, else cores; all GPUs]\n"
         "                        (under mpirun/srun: per process; the mesh spans all processes;\n"
         "                        more CUDA devices than GPUs share them as virtual devices)\n"
         "  --kernels K           native | cuda-on-host: the CUDA kernels run on the host, on CPU\n"
         "                        devices (a check of the CUDA code without a GPU; slow)  [native]\n"
         "  --members N           ensemble members, a multiple of all devices  [one per device]\n"
         "  --mode M              ensemble | data-parallel               [ensemble]\n"
         "Training:\n"
         "  --epochs E            epochs                                 [10]\n"
         "  --batch-size B        examples per step (data-parallel: split over devices)  [128]\n"
         "  --lr LR               SGD learning rate                      [0.1]\n"
         "  --momentum MU         SGD momentum                           [0.9]\n"
         "  --seed S              key(S) -> member keys and data order   [0]\n"
         "  --report-every N      gather the step losses every N steps   [1 on CPU, 16 on GPUs]\n"
         "Output:\n"
         "  --progress P          auto | bar | plain | none              [auto: bar on a terminal]\n"
         "  --metrics-json PATH   per-epoch metrics as JSON\n"
         "  --metrics-csv PATH    per-epoch metrics as CSV\n"
         "  --plot PATH           SVG of test accuracy and loss per epoch, reliability diagram and\n"
         "                        ensemble-size curve\n"
         "  --predict PATH        CSV of every test image's label, ensemble prediction, its probability,\n"
         "                        predictive entropy and the members' votes (after the last epoch)\n"
         "Checkpoints:\n"
         "  --save PATH           write a checkpoint after every epoch (safetensors)\n"
         "  --resume PATH         continue from a checkpoint (same seed, members and recipe)\n"
         "  --evaluate PATH       evaluate a checkpoint's ensemble instead of training (any backend and\n"
         "                        device count; writes the table, --metrics-json, --plot, --predict)\n"
         "  --members-subset L    with --evaluate: the members to ensemble, e.g. 0,2,5  [all]\n"
         "  -h, --help            this text\n"
         "\n"
         "Several processes: mpirun -np P mnist_ensemble --devices N ... trains on P x N devices; the first\n"
         "process prints and writes every output, with every member in its checkpoints.\n";
}

}  // namespace pmap::ensemble
