// mnist_ensemble's command line on CLI11: the flags in groups with their defaults, and checks that name the
// flag and what is wrong ("--epochs: 'x' is not an integer"). CLI11 tokenizes, dispatches and formats the
// help; the validators below give the messages, and parse_cli turns every CLI11 error into one UsageError.
#include "cli.h"

#include <CLI/CLI.hpp>

#include <unistd.h>  // access

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <utility>

namespace pmap::ensemble {
namespace {

// The whole of `text` as a T, or nothing.
template <class T>
std::optional<T> number(const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc{} || p != end) return std::nullopt;
  return v;
}

// CLI11 reports a validator's message as "<flag>: <message>". The empty description keeps it out of the help.
CLI::Validator check(std::function<std::string(const std::string&)> message) {
  return CLI::Validator([message = std::move(message)](std::string& text) { return message(text); }, "");
}

CLI::Validator integer_in(long long min, long long max) {
  return check([=](const std::string& text) -> std::string {
    const auto v = number<long long>(text);
    if (!v) return "'" + text + "' is not an integer";
    if (*v < min || *v > max)
      return text + " is out of range (" + std::to_string(min) + ".." + std::to_string(max) + ")";
    return {};
  });
}

// "'x' is not a, b or c".
CLI::Validator one_of(std::vector<std::string> choices) {
  return check([choices = std::move(choices)](const std::string& text) -> std::string {
    if (std::find(choices.begin(), choices.end(), text) != choices.end()) return {};
    std::string list;
    for (std::size_t i = 0; i < choices.size(); ++i)
      list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
    return "'" + text + "' is not " + list;
  });
}

// A float, checked by `ok` (which returns the complaint about a bad value, or nothing).
CLI::Validator real(std::function<std::string(float, const std::string&)> ok) {
  return check([ok = std::move(ok)](const std::string& text) -> std::string {
    const auto v = number<float>(text);
    if (!v) return "'" + text + "' is not a number";
    return std::isfinite(*v) ? ok(*v, text) : "'" + text + "' is not a finite number";
  });
}

// "0,2,5": distinct member indices, in order, into `out`. Returns what is wrong, or nothing.
std::string parse_members(const std::string& text, std::vector<int>& out) {
  out.clear();
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    if (item.empty()) return "'" + text + "' has an empty entry (expected e.g. 0,2,5)";
    const auto m = number<int>(item);
    if (!m) return "'" + item + "' is not an integer";
    if (*m < 0) return item + " is out of range (0..1000000000)";
    if (std::find(out.begin(), out.end(), *m) != out.end()) return "member " + item + " is named twice";
    out.push_back(*m);
    start = comma + 1;
  }
  return {};
}

// "AxM" (e.g. 2x4): two counts whose product is at most `max`. Returns what is wrong, or nothing.
std::string parse_mesh(const std::string& text, int max, int& first, int& model) {
  const std::size_t x = text.find('x');
  const auto a = number<int>(text.substr(0, x));
  const auto m = x == std::string::npos ? std::nullopt : number<int>(text.substr(x + 1));
  if (!a || !m) return "'" + text + "' is not AxM (e.g. 2x4: 2 devices along the mode's axis by 4 along 'model')";
  if (*a < 1 || *m < 1 || static_cast<long long>(*a) * *m > max)
    return "'" + text + "' is out of range (each at least 1, at most " + std::to_string(max) + " devices in all)";
  first = *a;
  model = *m;
  return {};
}

// "NAME=SPEC": a weight-name pattern and its layout (ensemble/layout.h). Returns what is wrong, or nothing.
std::string parse_layout(const std::string& text, LayoutMap* into) {
  const std::size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    return "'" + text + "' is not NAME=SPEC (e.g. Dense_0/kernel=None,model)";
  try {
    LayoutMap scratch;
    (into != nullptr ? *into : scratch).add(text.substr(0, eq), PartitionSpec::parse(text.substr(eq + 1)), true);
  } catch (const ValueError& e) {
    return e.what();
  }
  return {};
}

// "0.1" or "0.1,0.05,...": one value for every member, or one per member, each checked by `ok` (the
// complaint about a bad value, or nothing), into `out`. Returns what is wrong, or nothing.
std::string parse_floats(const std::string& text, std::vector<float>& out,
                         const std::function<std::string(float, const std::string&)>& ok) {
  out.clear();
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    if (item.empty()) return "'" + text + "' has an empty entry (expected e.g. 0.1 or 0.1,0.05)";
    const auto v = number<float>(item);
    if (!v) return "'" + item + "' is not a number";
    if (!std::isfinite(*v)) return "'" + item + "' is not a finite number";
    if (std::string why = ok(*v, item); !why.empty()) return why;
    out.push_back(*v);
    start = comma + 1;
  }
  return {};
}

std::string positive(float v, const std::string& text) {
  return v > 0 ? std::string() : "must be positive, got " + text;
}
std::string unit_rate(float v, const std::string& text) {
  return v >= 0 && v < 1 ? std::string() : "must be in [0, 1), got " + text;
}
std::string non_negative(float v, const std::string& text) {
  return v >= 0 ? std::string() : "must be >= 0, got " + text;
}

// A validator of parse_floats's lists.
CLI::Validator floats(std::string (*ok)(float, const std::string&)) {
  return check([ok](const std::string& text) {
    std::vector<float> values;
    return parse_floats(text, values, ok);
  });
}

const CLI::Validator kNonEmpty = check([](const std::string& text) -> std::string {
  return text.empty() ? "needs a non-empty value" : "";
});

// Devices are worker threads (and, on GPUs, streams): as many as PMAPCC_CPU_DEVICES allows.
constexpr int kMaxDevices = 4096;
constexpr long long kMaxCount = 1'000'000'000;

// The help layout: "usage: NAME [flags]" and the description first, groups one blank line apart, each
// flag's default at the end of its first line.
class Help : public CLI::Formatter {
 public:
  std::string make_description(const CLI::App*) const override { return {}; }
  std::string make_usage(const CLI::App* app, std::string name) const override {
    while (name.ends_with(' ')) name.pop_back();  // App::help appends the (empty) app name after a space
    return "usage: " + name + " [flags]\n" + app->get_description() + "\n\n";
  }
  std::string make_group(std::string group, bool positional, std::vector<const CLI::Option*> opts) const override {
    return CLI::Formatter::make_group(std::move(group), positional, std::move(opts)).substr(1);  // no "\n" first
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_type_size() == 0 ? std::string() : " " + opt->get_type_name();
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string text = opt->get_description();
    if (const std::string& d = opt->get_default_str(); !d.empty())
      text.insert(std::min(text.find('\n'), text.size()), "  [" + d + "]");
    return text;
  }
};

// A flag of `group` whose value CLI11 converts into `target`, or hands to `set` as text.
template <class T>
CLI::Option* flag(CLI::App& app, const char* name, T& target, const char* type, const char* group, const char* help) {
  return app.add_option(name, target, help)->type_name(type)->group(group)->check(kNonEmpty);
}
CLI::Option* flag(CLI::App& app, const char* name, std::function<void(const std::string&)> set, const char* type,
                  const char* group, const char* help) {
  return app.add_option_function<std::string>(name, std::move(set), help)->type_name(type)->group(group)->check(
      kNonEmpty);
}

// The flags of each help group, bound to `o`.
void data_flags(CLI::App& a, CliOptions& o) {
  TrainConfig& t = o.train;
  flag(a, "--dataset", t.dataset, "D", "Data", "mnist | fashion-mnist (names the data, picks the directory)")
      ->check(one_of({"mnist", "fashion-mnist"}))->default_str("mnist");
  flag(a, "--data", o.data, "DIR", "Data", "the IDX files (raw or .gz)")->default_str("data/<dataset>");
  flag(a, "--train-limit", t.train_limit, "N", "Data", "use the first N training examples")
      ->check(integer_in(1, kMaxCount))->default_str("all");
  flag(a, "--test-limit", t.test_limit, "N", "Data", "use the first N test examples")
      ->check(integer_in(1, kMaxCount))->default_str("all");
}

void device_flags(CLI::App& a, CliOptions& o) {
  TrainConfig& t = o.train;
  flag(a, "--backend", [&t](const std::string& v) { t.backend = parse_device_kind(v); }, "cpu|cuda", "Devices",
       "device kind")->check(one_of({"cpu", "cuda"}))->default_str("cpu");
  flag(a, "--devices", t.devices, "N", "Devices",
       "devices in the mesh\n(under mpirun/srun: per process; the mesh spans all processes;\n"
       "more CUDA devices than GPUs share them as virtual devices)")
      ->check(integer_in(1, kMaxDevices))->default_str("PMAPCC_CPU_DEVICES, else cores; all GPUs");
  flag(a, "--kernels", [&t](const std::string& v) { t.cuda_kernels_on_host = v == "cuda-on-host"; }, "K", "Devices",
       "native | cuda-on-host\n(cuda-on-host: the CUDA kernels run on the host, on CPU devices;\n"
       "a check of the CUDA code without a GPU; slow)")
      ->check(one_of({"native", "cuda-on-host"}))->default_str("native");
  flag(a, "--precision",
       [&t](const std::string& v) { t.precision = kernels::parse_precision(v.c_str(), "--precision"); }, "P", "Devices",
       "fp32 | bf16 (bf16: conv and dense products take bf16 operands and\nsum in fp32; weights, gradients and "
       "optimizer state stay fp32;\nCPU devices with AVX512_BF16, AMX where the CPU has it; CUDA\n"
       "through cuBLAS's bf16 GEMMs)")
      ->check(one_of({"fp32", "bf16"}))->default_str("fp32");
  flag(a, "--cpu-threads", [&o](const std::string& v) { o.cpu_threads = v == "auto" ? 0 : std::stoi(v); }, "T",
       "Devices",
       "threads per CPU device for the conv and dense products (the same\nbits for any T); auto: the cores "
       "divided by this process's devices")
      ->check(check([](const std::string& v) -> std::string {
        const auto n = number<long long>(v);
        return v == "auto" || (n && *n >= 1 && *n <= 64) ? "" : "'" + v + "' is not a thread count (1..64) or auto";
      }))
      ->default_str("PMAPCC_CPU_THREADS, else auto");
  flag(a, "--members", t.members, "N", "Devices",
       "ensemble members, a multiple of the devices\n(of the A along 'ensemble' with --mesh AxM)")
      ->check(integer_in(1, kMaxCount))->default_str("one per device");
  flag(a, "--mode", [&t](const std::string& v) { t.mode = parse_mode(v); }, "M", "Devices",
       "ensemble | data-parallel | model-parallel\n(model-parallel: one model, its weights split over 'model' and\n"
       "the batch over 'data')")
      ->check(one_of({"ensemble", "data-parallel", "model-parallel"}))->default_str("ensemble");
  flag(a, "--mesh", [&t](const std::string& v) { parse_mesh(v, kMaxDevices, t.mesh_axis, t.mesh_model); }, "AxM",
       "Devices",
       "A devices along the mode's axis by M along 'model'\n(the mode's axis: 'ensemble', or 'data' in "
       "the parallel modes;\neach member's weights split over the M devices of its row)")
      ->check(check([](const std::string& text) {
        int first = 0, model = 0;
        return parse_mesh(text, kMaxDevices, first, model);
      }))->default_str("Nx1; model-parallel: 1xN");
}

// --layout entries, in the order given (they come before the default layout's entries).
void layout_flags(CLI::App& a, std::vector<std::string>& layouts) {
  a.add_option("--layout", layouts,
               "split the weights whose whole name matches the regular expression\n"
               "NAME by SPEC, e.g. Dense_0/kernel=None,model or 'Conv_0/.*=()'\n"
               "(replicated); repeatable, first match wins, tried before the\n"
               "default: Dense_0 column-, Dense_1 row-parallel over 'model'")
      ->type_name("NAME=SPEC")->group("Devices")->check(kNonEmpty)
      ->check(check([](const std::string& text) { return parse_layout(text, nullptr); }))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->allow_extra_args(false);
}

// Floats are converted with from_chars, as their validators read them (CLI11 reads through long double,
// which can round differently).
void training_flags(CLI::App& a, TrainConfig& t) {
  flag(a, "--model", t.model, "NAME", "Training",
       "flax-cnn (the Flax example's CNN; sgd, batch 128) |\nkeras-convnet (the Keras guides' BatchNorm + Dropout "
       "convnet;\nadam 1e-3, batch 64): the model and its recipe's defaults")
      ->check(one_of(model_names()))->capture_default_str();
  flag(a, "--dropout", [&t](const std::string& v) { parse_floats(v, t.dropout, unit_rate); }, "RATE[,..]",
       "Training", "the rate of the model's Dropout layers (keras-convnet: 0.5);\na list gives each member its own")
      ->check(floats(unit_rate))->default_str("the model's");
  flag(a, "--epochs", t.epochs, "E", "Training", "epochs")->check(integer_in(0, kMaxCount))->capture_default_str();
  flag(a, "--batch-size", t.batch_size, "B", "Training",
       "examples per step (data- and model-parallel: split over 'data')")
      ->check(integer_in(1, kMaxCount))->default_str("128; keras-convnet: 64");
  flag(a, "--seed", t.seed, "S", "Training", "key(S) -> member keys and data order")
      ->check(check([](const std::string& text) {
        return number<std::uint64_t>(text) ? std::string() : "'" + text + "' is not an integer";
      }))->capture_default_str();
  flag(a, "--validation-split", [&t](const std::string& v) { t.validation_split = *number<double>(v); }, "F",
       "Training",
       "hold out the fraction F of the training set (drawn with the seed) as a\nvalidation set: each epoch is "
       "evaluated on it, the test set once, at the end")
      ->check(check([](const std::string& text) {
        const auto v = number<double>(text);
        return v && *v >= 0 && *v < 1 ? std::string() : "must be in [0, 1), got " + text;
      }))->default_str("0: none");
  flag(a, "--early-stopping-patience", t.patience, "N", "Training",
       "stop a member whose validation NLL has not improved for N epochs,\nwith its best epoch's parameters, "
       "while the others go on (needs\n--validation-split)")
      ->check(integer_in(0, kMaxCount))->default_str("0: off");
  flag(a, "--report-every", t.report_every, "N", "Training", "gather the step losses every N steps")
      ->check(integer_in(1, kMaxCount))->default_str("1 on CPU, 16 on GPUs");
}

// The optimizer (ensemble/optimizer.h). --lr and --weight-decay take one value for every member or one per
// member (a hyper-parameter ensemble).
void optimizer_flags(CLI::App& a, OptimizerConfig& t) {
  auto set_float = [](float& target) { return [&target](const std::string& v) { target = *number<float>(v); }; };
  flag(a, "--optimizer", t.name, "O", "Optimizer", "sgd | adam | adamw (Keras's Adam: beta 0.9, 0.999, epsilon 1e-7)")
      ->check(one_of(optimizer_names()))->default_str("sgd; keras-convnet: adam");
  flag(a, "--lr", [&t](const std::string& v) { parse_floats(v, t.learning_rate, positive); }, "LR[,..]",
       "Optimizer", "learning rate; a list gives each member its own")
      ->check(floats(positive))->default_str("0.1; adam, adamw: 0.001");
  flag(a, "--momentum", set_float(t.momentum), "MU", "Optimizer", "sgd's momentum")
      ->check(real([](float v, const std::string& text) {
        return v >= 0 && v < 1 ? std::string() : "must be in [0, 1), got " + text;
      }))->default_str("0.9");
  a.add_flag("--nesterov", t.nesterov, "sgd: Nesterov momentum")->group("Optimizer");
  flag(a, "--weight-decay", [&t](const std::string& v) { parse_floats(v, t.weight_decay, non_negative); },
       "WD[,..]", "Optimizer", "decoupled weight decay, as Keras's: p -= lr WD p;\na list gives each member its own")
      ->check(floats(non_negative))->default_str("0; adamw: 0.004");
  flag(a, "--clip-norm", set_float(t.clip_norm), "C", "Optimizer", "clip each member's gradients to global norm C")
      ->check(real(non_negative))->default_str("off");
  flag(a, "--lr-schedule",
       [&t](const std::string& v) {
         const std::int64_t warmup = t.schedule.warmup_steps;
         t.schedule = parse_schedule(v);
         t.schedule.warmup_steps = warmup;
       },
       "S", "Optimizer",
       "constant | cosine[:ALPHA] | exponential:RATE:STEPS |\npiecewise:STEP=FACTOR,... (cosine: to ALPHA x LR at the run's end)")
      ->check(check([](const std::string& text) {
        try {
          parse_schedule(text);
        } catch (const ValueError& e) {
          const std::string m = e.what();
          return m.substr(m.find(": ") + 2);  // without the flag, which CLI11 puts first
        }
        return std::string();
      }))->default_str("constant");
  flag(a, "--warmup-steps", t.schedule.warmup_steps, "N", "Optimizer", "linear warmup from 0 over the first N steps")
      ->check(integer_in(0, kMaxCount))->capture_default_str();
}

void output_flags(CLI::App& a, CliOptions& o) {
  auto* summary = a.add_flag("--summary", o.summary,
                             "print the model's layers, output shapes and parameters (Keras's table);\n"
                             "training prints it at the start unless --no-summary")
                      ->group("Output");
  a.add_flag("--no-summary", o.no_summary, "training: leave the model's table out")->group("Output")->excludes(summary);
  flag(a, "--progress", o.progress, "P", "Output", "auto | bar | plain | none")
      ->check(one_of({"auto", "bar", "plain", "none"}))->default_str("auto: bar on a terminal");
  flag(a, "--metrics-json", o.metrics_json, "PATH", "Output", "per-epoch metrics as JSON");
  flag(a, "--metrics-csv", o.metrics_csv, "PATH", "Output", "per-epoch metrics as CSV");
  flag(a, "--plot", o.plot, "PATH", "Output",
       "SVG of test accuracy and loss per epoch, reliability diagram and\nensemble-size curve");
  flag(a, "--predict", o.predict, "PATH", "Output",
       "CSV of every test image's label, ensemble prediction, its probability,\n"
       "predictive entropy and the members' votes (after the last epoch)");
}

void checkpoint_flags(CLI::App& a, CliOptions& o) {
  flag(a, "--save", o.save, "PATH", "Checkpoints", "write a checkpoint after every epoch (safetensors)");
  flag(a, "--resume", o.resume, "PATH", "Checkpoints", "continue from a checkpoint (same seed, members and recipe)");
  flag(a, "--evaluate", o.evaluate, "PATH", "Checkpoints",
       "evaluate a checkpoint's ensemble instead of training (any backend and\n"
       "device count; writes the table, --metrics-json, --plot, --predict)");
  flag(a, "--members-subset", [&o](const std::string& v) { parse_members(v, o.members_subset); }, "L", "Checkpoints",
       "with --evaluate: the members to ensemble, e.g. 0,2,5")
      ->check(check([](const std::string& text) {
        std::vector<int> members;
        return parse_members(text, members);
      }))->default_str("all");
  flag(a, "--export-onnx", o.export_onnx, "PATH", "Checkpoints",
       "write the trained (or --evaluate'd) ensemble as one ONNX graph (opset 17):\n"
       "images (N, 28, 28, 1) f32 in [0, 1] -> probabilities (N, 10), class (N)");
  flag(a, "--export-member", o.export_member, "I", "Checkpoints",
       "with --export-onnx: member I alone (logits, probabilities) instead")
      ->check(integer_in(0, kMaxCount));
  a.add_flag("-h,--help", o.help, "this text")->group("Checkpoints");
  a.add_flag("--version", o.version, "the program's version and its build's backends")->group("Checkpoints");
}

std::unique_ptr<CLI::App> make_app(CliOptions& o) {
  auto app = std::make_unique<CLI::App>(
      "Trains an ensemble of MNIST CNNs (the Flax example's model and recipe), one or more members per\n"
      "device, and reports each member's and the ensemble's test accuracy and calibration (NLL, Brier\n"
      "score, expected calibration error, predictive entropy).");
  app->formatter(std::make_shared<Help>());
  app->get_formatter()->column_width(24);
  app->footer(
      "Several processes: mpirun -np P mnist_ensemble --devices N ... trains on P x N devices; the first\n"
      "process prints and writes every output, with every member in its checkpoints.");
  app->set_help_flag();  // --help is a flag like the others (parse_cli reports it), not an exception
  app->allow_extras();   // unknown flags and stray words: reported by parse_cli in its own words
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  data_flags(*app, o);
  device_flags(*app, o);
  layout_flags(*app, o.layouts);
  training_flags(*app, o.train);
  optimizer_flags(*app, o.train.optimizer);
  output_flags(*app, o);
  checkpoint_flags(*app, o);
  return app;
}

// CLI11's "--batch-size: 1 required N missing" (no value after the flag) as "--batch-size needs a value".
std::string usage_message(const CLI::ParseError& e) {
  std::string m = e.what();
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr && m.find(" required ") != std::string::npos)
    return m.substr(0, m.find(':')) + " needs a value";
  std::replace(m.begin(), m.end(), '\n', ' ');
  return m;
}

}  // namespace

bool onnx_export_built() {
#ifdef PMAPCC_HAVE_ONNX
  return true;
#else
  return false;
#endif
}

std::string dataset_title(const std::string& dataset) { return dataset == "fashion-mnist" ? "Fashion-MNIST" : "MNIST"; }

CliOptions parse_cli(const std::vector<std::string>& args) {
  CliOptions o;
  const auto app = make_app(o);
  try {
    app->parse(std::vector<std::string>(args.rbegin(), args.rend()));  // CLI11 takes them last first
  } catch (const CLI::ParseError& e) {
    throw UsageError(usage_message(e));
  }
  if (const auto rest = app->remaining(); !rest.empty()) {
    const std::string& word = rest.front();
    if (word.starts_with("-")) throw UsageError("unknown flag '" + word.substr(0, word.find('=')) + "'");
    throw UsageError("unexpected argument '" + word + "' (flags start with --)");
  }
  if (app->count("--data") == 0) o.data = "data/" + o.train.dataset;
  OptimizerConfig& opt = o.train.optimizer;
  const ModelRecipe recipe = model_recipe(o.train.model);  // what the flags leave open
  if (app->count("--optimizer") == 0) opt.name = recipe.optimizer;
  if (app->count("--batch-size") == 0) o.train.batch_size = recipe.batch_size;
  for (const char* sgd_only : {"--momentum", "--nesterov"})
    if (opt.name != "sgd" && app->count(sgd_only) > 0)
      throw UsageError(std::string(sgd_only) + " is an option of --optimizer sgd, not of " + opt.name);
  if (!o.layouts.empty()) {
    if (!o.train.splits_weights())
      throw UsageError("--layout splits weights over 'model': it needs --mode model-parallel or --mesh AxM with M > 1");
    LayoutMap layout;
    for (const std::string& entry : o.layouts) parse_layout(entry, &layout);
    for (const LayoutMap::Entry& e : o.train.layout.entries()) layout.add(e.pattern, e.spec, e.must_match);
    o.train.layout = std::move(layout);
  }
  if (!o.members_subset.empty() && o.evaluate.empty())
    throw UsageError("--members-subset picks members of the checkpoint given with --evaluate");
  if (!o.evaluate.empty() && (!o.save.empty() || !o.resume.empty()))
    throw UsageError("--evaluate trains nothing: it takes neither --save nor --resume");
  if (!o.evaluate.empty() && !o.metrics_csv.empty())
    throw UsageError("--evaluate writes no per-epoch CSV: use --metrics-json (and --predict)");
  if (o.export_member >= 0 && o.export_onnx.empty())
    throw UsageError("--export-member picks the member that --export-onnx writes: give --export-onnx PATH");
  if (!o.export_onnx.empty() && o.train.epochs == 0 && o.resume.empty() && o.evaluate.empty())
    throw UsageError("--export-onnx with --epochs 0 would export untrained members: train (--epochs), "
                     "--resume or --evaluate a checkpoint");
  if (!o.export_onnx.empty() && !onnx_export_built())
    throw UsageError("--export-onnx: this build has no ONNX export (configure where libonnx-dev and "
                     "libprotobuf-dev are installed: PMAPCC_WITH_ONNX)");
  if (o.train.patience > 0 && o.train.validation_split == 0)
    throw UsageError("--early-stopping-patience watches the validation NLL: give --validation-split too");
  if (!o.evaluate.empty() && o.no_summary)
    throw UsageError("--no-summary is for training: --evaluate prints the model's table only with --summary");
  // The checkpoint decides the model and its batch; nothing is trained: a training flag would be ignored.
  if (!o.evaluate.empty())
    for (const CLI::Option* given : app->get_options())
      if (given->count() > 0 && (given->get_group() == "Training" || given->get_group() == "Optimizer" ||
                                 given->check_lname("train-limit")))
        throw UsageError("--evaluate trains nothing: " + given->get_name() +
                         " is a training flag (the checkpoint records the model and its recipe)");
  return o;
}

void check_output_paths(const CliOptions& o) {
  namespace fs = std::filesystem;
  const std::pair<const char*, const fs::path*> outputs[] = {{"--save", &o.save},
                                                             {"--metrics-json", &o.metrics_json},
                                                             {"--metrics-csv", &o.metrics_csv},
                                                             {"--plot", &o.plot},
                                                             {"--export-onnx", &o.export_onnx},
                                                             {"--predict", &o.predict}};
  std::vector<std::pair<fs::path, const char*>> seen;
  for (const auto& [flag, path] : outputs) {
    if (path->empty()) continue;
    const std::string what = std::string(flag) + " " + path->string();
    std::error_code ec;
    if (fs::is_directory(*path, ec)) throw UsageError(what + ": is a directory, not a file");
    const fs::path dir = path->has_parent_path() ? path->parent_path() : fs::path(".");
    if (!fs::is_directory(dir, ec)) throw UsageError(what + ": the directory '" + dir.string() + "' does not exist");
    if (::access(dir.c_str(), W_OK) != 0)
      throw UsageError(what + ": the directory '" + dir.string() + "' is not writable");
    const fs::path canonical = fs::weakly_canonical(*path, ec);
    for (const auto& [other, other_flag] : seen)
      if (other == canonical)
        throw UsageError(what + ": the same file as " + other_flag + " (each output needs its own)");
    seen.emplace_back(canonical, flag);
  }
}

std::string cli_help(const std::string& program) {
  CliOptions o;
  const auto app = make_app(o);
  return app->help(program);
}

}  // namespace pmap::ensemble
