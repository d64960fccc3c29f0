// The program's configuration (config.h): --layout's specs and maps, schedules as text, the optimizer's flags
// and their checks, the models' recipes, TrainConfig's checks and JSON, and a checkpoint's summary.
#include "examples/mnist_ensemble/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <regex>

#include <pmap/error.h>

#include <pmapcc/io/safetensors.h>
#include <pmapcc/train/model.h>
#include <pmapcc/train/trainer.h>

namespace pmap::ensemble {

using io::dump_json;
using io::Json;
using io::JsonView;
using io::SafetensorsFile;

// ---- --layout -----------------------------------------------------------------------------------------------
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool is_axis_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

}  // namespace

bool PartitionSpec::replicated() const {
  return std::none_of(dims.begin(), dims.end(), [](const auto& a) { return a.has_value(); });
}

std::string PartitionSpec::str() const {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + (dims[i] ? "'" + *dims[i] + "'" : "None");
  return s + (dims.size() == 1 ? ",)" : ")");
}

PartitionSpec PartitionSpec::parse(std::string_view text) {
  const std::string original(text);
  auto bad = [&](const std::string& what) -> ValueError {
    return ValueError("layout '" + original + "': " + what + " (expected e.g. None,model or ('model',))");
  };
  std::string_view s = trim(text);
  if (s.starts_with('(') != s.ends_with(')')) throw bad("unbalanced parentheses");
  if (s.starts_with('(')) s = trim(s.substr(1, s.size() - 2));
  PartitionSpec spec;
  if (s.empty()) return spec;
  if (s.ends_with(',')) s.remove_suffix(1);  // a Python one-tuple: ('model',)
  for (std::size_t start = 0; start <= s.size();) {
    const std::size_t comma = std::min(s.find(',', start), s.size());
    std::string_view entry = trim(s.substr(start, comma - start));
    start = comma + 1;
    if (entry.size() >= 2 && (entry.front() == '\'' || entry.front() == '"') && entry.back() == entry.front())
      entry = entry.substr(1, entry.size() - 2);
    if (entry.empty()) throw bad("an empty entry");
    if (entry == "None" || entry == "none") {
      spec.dims.emplace_back(std::nullopt);
    } else if (is_axis_name(entry)) {
      spec.dims.emplace_back(std::string(entry));
    } else {
      throw bad("'" + std::string(entry) + "' is neither an axis name nor None");
    }
  }
  return spec;
}

void LayoutMap::add(std::string pattern, PartitionSpec spec, bool must_match) {
  try {
    std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ValueError("layout map: '" + pattern + "' is not a regular expression (" + e.what() + ")");
  }
  entries_.push_back({std::move(pattern), std::move(spec), must_match});
}

PartitionSpec LayoutMap::layout_of(std::string_view name, std::optional<std::size_t>* entry) const {
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (std::regex_match(name.begin(), name.end(), std::regex(entries_[i].pattern, std::regex::ECMAScript))) {
      if (entry != nullptr) *entry = i;
      return entries_[i].spec;
    }
  }
  if (entry != nullptr) *entry = std::nullopt;
  return {};
}

LayoutMap reference_cnn_layout() {
  LayoutMap m;
  m.add("Dense_0/kernel", PartitionSpec::parse("None,model"));
  m.add("Dense_0/bias", PartitionSpec::parse("model"));
  m.add("Dense_1/kernel", PartitionSpec::parse("model,None"));
  return m;
}

// ---- the optimizer's flags ----------------------------------------------------------------------------------
namespace {

// The optimizers --optimizer names (recipe_optimizer builds them).
const std::vector<std::string>& registry() {
  static const std::vector<std::string> r{"sgd", "adam", "adamw"};
  return r;
}

[[noreturn]] void bad_schedule(std::string_view text, const std::string& why) {
  throw ValueError("--lr-schedule '" + std::string(text) + "': " + why +
                   " (constant | cosine[:ALPHA] | exponential:RATE:STEPS | piecewise:STEP=FACTOR,...)");
}

template <class T>
T number(std::string_view text, std::string_view part, const char* what) {
  T v{};
  const auto r = std::from_chars(part.data(), part.data() + part.size(), v);
  if (part.empty() || r.ec != std::errc() || r.ptr != part.data() + part.size())
    bad_schedule(text, std::string(what) + " '" + std::string(part) + "' is not a number");
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) bad_schedule(text, std::string(what) + " must be finite");
  return v;
}

std::vector<std::string_view> split_on(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t start = 0;;) {
    const std::size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

// The shortest decimal that reads back to v (0.1, not 0.10000000149011612).
template <class T>
std::string shortest(T v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

Schedule parse_schedule(std::string_view text) {
  const auto parts = split_on(text, ':');
  const std::string_view kind = parts[0];
  Schedule s;
  if (kind == "constant") {
    if (parts.size() != 1) bad_schedule(text, "constant takes no arguments");
  } else if (kind == "cosine") {
    s.kind = kernels::ScheduleKind::cosine;
    if (parts.size() > 2) bad_schedule(text, "cosine takes one argument, the final factor");
    if (parts.size() == 2) s.alpha = number<double>(text, parts[1], "the final factor");
    if (!(s.alpha >= 0 && s.alpha <= 1)) bad_schedule(text, "the final factor must be in [0, 1]");
  } else if (kind == "exponential") {
    s.kind = kernels::ScheduleKind::exponential;
    if (parts.size() != 3) bad_schedule(text, "exponential takes a rate and a number of steps");
    s.decay_rate = number<double>(text, parts[1], "the rate");
    s.decay_steps = number<std::int64_t>(text, parts[2], "the steps");
    if (!(s.decay_rate > 0)) bad_schedule(text, "the rate must be > 0");
    if (s.decay_steps < 1) bad_schedule(text, "the steps must be >= 1, got " + std::to_string(s.decay_steps));
  } else if (kind == "piecewise") {
    s.kind = kernels::ScheduleKind::piecewise;
    if (parts.size() != 2 || parts[1].empty()) bad_schedule(text, "piecewise takes STEP=FACTOR,... ");
    for (std::string_view piece : split_on(parts[1], ',')) {
      const auto kv = split_on(piece, '=');
      if (kv.size() != 2) bad_schedule(text, "'" + std::string(piece) + "' is not STEP=FACTOR");
      const auto step = number<std::int64_t>(text, kv[0], "the step");
      const auto factor = number<double>(text, kv[1], "the factor");
      if (step < 0 || (!s.pieces.empty() && step <= s.pieces.back().first))
        bad_schedule(text, "the steps must be >= 0 and increasing");
      if (factor < 0) bad_schedule(text, "the factors must be >= 0");
      s.pieces.emplace_back(step, factor);
    }
    if (s.pieces.size() > static_cast<std::size_t>(kernels::kMaxScheduleBoundaries))
      bad_schedule(text, "at most " + std::to_string(kernels::kMaxScheduleBoundaries) + " pieces");
  } else {
    bad_schedule(text, "unknown schedule '" + std::string(kind) + "'");
  }
  return s;
}

std::string Schedule::str() const {
  switch (kind) {
    case kernels::ScheduleKind::constant:
      return "constant";
    case kernels::ScheduleKind::cosine:
      return alpha == 0 ? "cosine" : "cosine:" + shortest(alpha);
    case kernels::ScheduleKind::exponential:
      return "exponential:" + shortest(decay_rate) + ":" + std::to_string(decay_steps);
    case kernels::ScheduleKind::piecewise: {
      std::string out = "piecewise:";
      for (std::size_t i = 0; i < pieces.size(); ++i)
        out += (i ? "," : "") + std::to_string(pieces[i].first) + "=" + shortest(pieces[i].second);
      return out;
    }
  }
  return "constant";
}

kernels::ScheduleParams Schedule::params() const {
  kernels::ScheduleParams p;
  p.kind = kind;
  p.warmup_steps = warmup_steps;
  p.decay_steps = kind == kernels::ScheduleKind::constant || kind == kernels::ScheduleKind::piecewise ? 1 : decay_steps;
  p.decay_rate = decay_rate;
  p.alpha = alpha;
  p.boundaries_count = static_cast<int>(pieces.size());
  for (std::size_t i = 0; i < pieces.size() && i < static_cast<std::size_t>(kernels::kMaxScheduleBoundaries); ++i) {
    p.boundaries[i] = pieces[i].first;
    p.values[i] = pieces[i].second;
  }
  if (warmup_steps < 0) throw ValueError("--warmup-steps must be >= 0, got " + std::to_string(warmup_steps));
  if (p.decay_steps < 1)
    throw ValueError("--lr-schedule " + str() + ": decays over " + std::to_string(p.decay_steps) +
                     " steps; it needs at least 1 (the run's steps after --warmup-steps)");
  kernels::validate(p);
  return p;
}

std::string OptimizerConfig::str() const {
  auto list = [](const std::vector<float>& v) {
    std::string out;
    for (float x : v) out += (out.empty() ? "" : ",") + shortest(x);
    return out;
  };
  std::string out = name + " lr " + list(learning_rates(static_cast<int>(learning_rate.size())));
  if (name == "sgd") out += ", momentum " + shortest(momentum) + (nesterov ? " (Nesterov)" : "");
  if (weight_decay_of(0) != 0 || weight_decay.size() > 1)
    out += ", weight decay " + list(weight_decays(static_cast<int>(weight_decay.size())));
  if (clip_norm > 0) out += ", clip norm " + shortest(clip_norm);
  if (schedule.kind != kernels::ScheduleKind::constant || schedule.warmup_steps > 0)
    out += ", " + schedule.str() +
           (schedule.warmup_steps > 0 ? " after " + std::to_string(schedule.warmup_steps) + " warmup steps" : "");
  return out;
}

namespace {

// Member m's value of a flag's list: the default when empty, the one value, or the member's own.
float value_of(const std::vector<float>& v, float fallback, int member, const char* flag) {
  if (v.empty()) return fallback;
  if (v.size() == 1) return v[0];
  if (member < 0 || static_cast<std::size_t>(member) >= v.size())
    throw ValueError(std::string(flag) + " gives " + std::to_string(v.size()) + " values: none for member " +
                     std::to_string(member) + " (give one value, or one per member)");
  return v[static_cast<std::size_t>(member)];
}

std::vector<float> values(const std::vector<float>& v, int members, const std::function<float(int)>& of) {
  std::vector<float> out;
  for (int m = 0; m < (v.size() > 1 ? members : 1); ++m) out.push_back(of(m));
  return out;
}

}  // namespace

float OptimizerConfig::learning_rate_of(int member) const {
  return value_of(learning_rate, name == "sgd" ? 0.1f : 0.001f, member, "--lr");
}

float OptimizerConfig::weight_decay_of(int member) const {
  return value_of(weight_decay, name == "adamw" ? 0.004f : 0.0f, member, "--weight-decay");
}

std::vector<float> OptimizerConfig::learning_rates(int members) const {
  return values(learning_rate, members, [this](int m) { return learning_rate_of(m); });
}

std::vector<float> OptimizerConfig::weight_decays(int members) const {
  return values(weight_decay, members, [this](int m) { return weight_decay_of(m); });
}

void OptimizerConfig::check(int members) const {
  auto bad = [](const std::string& m) { throw ValueError(m); };
  bool known = false;
  for (const std::string& n : registry()) known = known || n == name;
  if (!known) {
    std::string names;
    for (const std::string& n : registry()) names += (names.empty() ? "" : ", ") + n;
    bad("--optimizer must be one of " + names + ", got '" + name + "'");
  }
  auto per_member = [&](const char* flag, const std::vector<float>& v) {
    if (v.size() > 1 && v.size() != static_cast<std::size_t>(members))
      bad(std::string(flag) + " gives " + std::to_string(v.size()) + " values for " + std::to_string(members) +
          " member(s): give one value, or one per member");
  };
  per_member("--lr", learning_rate);
  per_member("--weight-decay", weight_decay);
  for (float lr : learning_rate)
    if (!(lr > 0) || !std::isfinite(lr)) bad("--lr must be a positive number, got " + shortest(lr));
  for (float wd : weight_decay)
    if (!(wd >= 0) || !std::isfinite(wd)) bad("--weight-decay must be a number >= 0, got " + shortest(wd));
  if (!(momentum >= 0 && momentum < 1)) bad("--momentum must be in [0, 1), got " + shortest(momentum));
  if (!(clip_norm >= 0) || !std::isfinite(clip_norm))
    bad("--clip-norm must be a number >= 0 (0: off), got " + shortest(clip_norm));
  kernels::validate(kernels::AdamParams{beta_1, beta_2, epsilon});
  if (schedule.warmup_steps < 0) bad("--warmup-steps must be >= 0, got " + std::to_string(schedule.warmup_steps));
}

std::vector<std::string> optimizer_names() { return registry(); }

// ---- the models ---------------------------------------------------------------------------------------------

std::vector<std::string> model_names() { return train::model_names(); }

ModelRecipe model_recipe(const std::string& name) {
  if (name == "flax-cnn") return {"sgd", 128};
  if (name == "keras-convnet") return {"adam", 64};
  std::string names;
  for (const std::string& n : model_names()) names += (names.empty() ? "" : ", ") + n;
  throw ValueError("--model must be one of " + names + ", got '" + name + "'");
}

// ---- TrainConfig --------------------------------------------------------------------------------------------

std::string TrainConfig::mesh_text() const { return std::to_string(mesh_axis) + "x" + std::to_string(mesh_model); }

std::string_view to_string(Mode m) {
  return m == Mode::ensemble ? "ensemble" : m == Mode::data_parallel ? "data-parallel" : "model-parallel";
}

Mode parse_mode(std::string_view text) {
  for (Mode m : {Mode::ensemble, Mode::data_parallel, Mode::model_parallel})
    if (text == to_string(m)) return m;
  throw ValueError("--mode must be ensemble, data-parallel or model-parallel, got '" + std::string(text) + "'");
}

namespace {

// The float as the decimal it was most likely written as: the shortest one that reads back to it.
double as_given(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  double d = 0;
  std::from_chars(buf, r.ptr, d);
  return d;
}

// One value for every member as a number, a per-member list as an array.
io::Json as_given(const std::vector<float>& v) {
  if (v.size() == 1) return as_given(v[0]);
  io::Json a = io::Json::array();
  for (float x : v) a.push_back(as_given(x));
  return a;
}

// The optimizer's fields, those it uses only: the flags' names with '_' for '-'.
void optimizer_json(const OptimizerConfig& o, int members, io::Json& j) {
  j["optimizer"] = o.name;
  j["lr"] = as_given(o.learning_rates(members));
  if (o.name == "sgd") {
    j["momentum"] = as_given(o.momentum);
    j["nesterov"] = o.nesterov;
  } else {
    j["beta_1"] = o.beta_1;
    j["beta_2"] = o.beta_2;
    j["epsilon"] = as_given(o.epsilon);
  }
  j["weight_decay"] = as_given(o.weight_decays(members));
  j["clip_norm"] = as_given(o.clip_norm);
  j["lr_schedule"] = o.schedule.str();
  j["warmup_steps"] = o.schedule.warmup_steps;
  if (o.schedule.kind == kernels::ScheduleKind::cosine) j["decay_steps"] = o.schedule.decay_steps;
}

}  // namespace

io::Json TrainConfig::to_json() const {
  io::Json j = io::Json::object();
  j["backend"] = pmap::to_string(backend);
  j["devices"] = devices;
  j["members"] = members;
  j["mode"] = ensemble::to_string(mode);
  j["model"] = model;
  if (!architecture.empty()) j["architecture"] = architecture;
  j["mesh"] = mesh_text();
  if (splits_weights()) {
    io::Json entries = io::Json::array();
    for (const LayoutMap::Entry& e : layout.entries())
      entries.push_back({{"pattern", e.pattern}, {"spec", e.spec.str()}});
    j["layout"] = std::move(entries);
  }
  j["epochs"] = epochs;
  j["batch_size"] = batch_size;
  optimizer_json(optimizer, members, j);
  j["dropout"] = dropout.empty() ? io::Json(nullptr) : as_given(dropout);  // null: the model's own rates
  j["seed"] = static_cast<std::int64_t>(seed);
  j["validation_split"] = validation_split;
  j["early_stopping_patience"] = patience;
  j["train_limit"] = train_limit;
  j["test_limit"] = test_limit;
  j["eval_batch"] = eval_batch;
  j["pin_threads"] = pin_threads;
  j["member_group"] = member_group;
  j["report_every"] = report_every;
  j["kernels"] = cuda_kernels_on_host ? "cuda-on-host" : "native";
  j["graphs"] = graphs;
  j["precision"] = kernels::name(precision);
  j["processes"] = processes;
  j["dataset"] = dataset;
  return j;
}

// `devices`: along the mode's axis (the mesh's first), which the members or the batch are split over.
void TrainConfig::check(int along, const Dataset& train, const Dataset& test) const {
  const TrainConfig& c = *this;
  auto bad = [](const std::string& m) { throw ValueError(m); };
  if (c.epochs < 0) bad("--epochs must be >= 0, got " + std::to_string(c.epochs));
  if (c.batch_size < 1) bad("--batch-size must be >= 1, got " + std::to_string(c.batch_size));
  c.optimizer.check(c.members);
  if (c.dropout.size() > 1 && c.dropout.size() != static_cast<std::size_t>(c.members))
    bad("--dropout gives " + std::to_string(c.dropout.size()) + " values for " + std::to_string(c.members) +
        " member(s): give one value, or one per member");
  for (float r : c.dropout)
    if (!(r >= 0 && r < 1)) bad("--dropout must be in [0, 1), got " + io::dump_json(as_given(r)));
  if (c.eval_batch < 1) bad("eval batch must be >= 1");
  if (!(c.validation_split >= 0 && c.validation_split < 1))
    bad("--validation-split must be in [0, 1), got " + io::dump_json(c.validation_split));
  if (c.patience < 0) bad("--early-stopping-patience must be >= 0 (0: off), got " + std::to_string(c.patience));
  if (c.patience > 0 && c.validation_split == 0)
    bad("--early-stopping-patience " + std::to_string(c.patience) +
        " watches the validation NLL: give --validation-split too");
  if (c.report_every < 0) bad("report_every must be >= 0 (0: automatic), got " + std::to_string(c.report_every));
  const std::string over = c.splits_weights()
                               ? "the " + std::to_string(along) + " devices of --mesh's first axis"
                               : "--devices " + std::to_string(along);
  if (c.mode == Mode::ensemble && c.members % along != 0)
    bad("--members " + std::to_string(c.members) + " is not a multiple of " + over +
        ": every device runs the same number of members");
  if (c.mode != Mode::ensemble && c.members != 1)
    bad("--mode " + std::string(to_string(c.mode)) + " trains one model over the devices: --members must be 1, got " +
        std::to_string(c.members));
  // Data parallel splits a batch of any size (train::Trainer pads the blocks); split weights need equal blocks (the
  // collectives over "model" take one shape on every device).
  if (c.splits_weights() && c.mode != Mode::ensemble && c.batch_size % along != 0)
    bad("--batch-size " + std::to_string(c.batch_size) + " does not split evenly over " + over +
        ": model parallelism needs equal blocks");
  if (c.mode != Mode::ensemble && c.batch_size < along)
    bad("--batch-size " + std::to_string(c.batch_size) + " is smaller than " + over +
        ": data parallel gives every device at least one example");
  if (c.epochs > 0 && train.count < c.batch_size)
    bad("--batch-size " + std::to_string(c.batch_size) + " is larger than the " + std::to_string(train.count) +
        " training examples (see --train-limit" + (c.validation_split > 0 ? " and --validation-split)" : ")"));
  if (test.count < 1) bad("the test set is empty");
  if (train.rows != test.rows || train.cols != test.cols)
    bad("the training images are " + std::to_string(train.rows) + "x" + std::to_string(train.cols) +
        ", the test images " + std::to_string(test.rows) + "x" + std::to_string(test.cols) +
        ": --data must hold the two splits of one dataset");
}

// ---- a checkpoint's summary ---------------------------------------------------------------------------------

namespace {

// The file, checked to be a pmapcc checkpoint (its __metadata__ "format", as train::Trainer::load checks it).
SafetensorsFile load_checkpoint_file(const std::filesystem::path& path) {
  SafetensorsFile f = io::load_safetensors(path);
  train::checkpoint_format(f.metadata, path.string());
  return f;
}

// A non-negative integer of __metadata__.
std::int64_t metadata_count(const SafetensorsFile& f, const char* key) {
  if (f.metadata.find(key) == f.metadata.end())
    throw DataError(f.path.string() + ": __metadata__ has no '" + key + "': not a pmapcc checkpoint");
  const Json j = f.metadata_json(key);
  const std::int64_t n = j.is_number_integer() ? j.get<std::int64_t>() : -1;
  if (n < 0) throw DataError(f.path.string() + ": __metadata__." + key + " is not a count");
  return n;
}

CheckpointSummary summary_of(const SafetensorsFile& f) {
  CheckpointSummary s;
  s.format = f.metadata.at("format");
  if (f.metadata.at("format") == train::kCheckpointFormat) {  // its own "members" and "model"; the caller's "config"
    s.members = static_cast<int>(metadata_count(f, "members"));
    if (s.members < 1 || s.members > 1'000'000)
      throw DataError(f.path.string() + ": __metadata__.members is not a member count");
    s.epochs_done = static_cast<int>(metadata_count(f, "epochs_done"));
    const auto model = f.metadata.find("model");
    if (model == f.metadata.end()) throw DataError(f.path.string() + ": __metadata__ has no 'model'");
    s.config = f.metadata.find("config") != f.metadata.end() ? f.metadata_json("config") : Json::object();
    if (!s.config.is_object()) throw DataError(f.path.string() + ": __metadata__.config is not a JSON object");
    // A caller's record of the model and members must be the file's own (a file edited in one place).
    for (const auto& [key, value] : {std::pair<std::string, Json>{"model", model->second}, {"members", s.members}})
      if (s.config.contains(key) && s.config[key] != value)
        throw DataError(f.path.string() + ": __metadata__.config records " + key + " " + dump_json(s.config[key]) +
                        ", the file's __metadata__." + key + " is " + dump_json(value) + ": the file was altered");
    s.config["model"] = model->second;
    s.config["members"] = s.members;
    return s;
  }
  s.config = f.metadata_json("config");
  const JsonView members = JsonView(s.config, f.path.string(), "__metadata__.config")["members"];
  if (members.as_int() < 1 || members.as_int() > 1'000'000) members.fail("is not a member count");
  s.members = static_cast<int>(members.as_int());
  s.epochs_done = static_cast<int>(metadata_count(f, "epochs_done"));
  return s;
}

}  // namespace

CheckpointSummary inspect_checkpoint(const std::filesystem::path& path) {
  return summary_of(load_checkpoint_file(path));
}

}  // namespace pmap::ensemble
