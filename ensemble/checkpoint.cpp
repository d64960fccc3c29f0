// Trainer checkpoints: every member's parameters ("params/<tensor>"), model state ("state/<tensor>", e.g.
// "state/BatchNorm_0/moving_mean") and optimizer state ("opt/<slot>/<tensor>") as (members, ...) safetensors tensors, with the step, epoch, keys, configuration
// (the optimizer's included) and history in __metadata__. Written atomically. Version 1 files (SGD only,
// the momentum as "momentum/<tensor>", no optimizer fields) still load.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include <pmap/error.h>

#include <pmapcc/ensemble/member_layout.h>
#include <pmapcc/ensemble/run_checks.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/io/metrics.h>
#include <pmapcc/io/safetensors.h>

namespace pmap::ensemble {

using io::dump_json;
using io::epoch_json;
using io::epoch_metrics_from_json;
using io::Json;
using io::JsonView;
using io::load_safetensors;
using io::make_tensor;
using io::safetensors_dtype_name;
using io::save_safetensors;
using io::SafetensorsFile;
using io::TensorEntry;

namespace {

constexpr const char* kFormat = "pmapcc.ensemble.v2";
constexpr const char* kFormatV1 = "pmapcc.ensemble.v1";
constexpr const char* kTrainerFormat = "pmapcc.train.v1";  // train::Trainer's (train/checkpoint.cpp)

std::vector<std::int64_t> stacked_shape(std::int64_t members, const Dims& per_member) {
  std::vector<std::int64_t> s{members};
  s.insert(s.end(), per_member.begin(), per_member.end());
  return s;
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

// Where an optimizer slot's tensors are named: "opt/<slot>/<tensor>"; version 1 (SGD only) "<slot>/<tensor>".
std::string slot_prefix(const std::string& slot, bool v1) { return (v1 ? "" : "opt/") + slot + "/"; }

std::vector<float> read_stacked(const SafetensorsFile& f, const std::string& prefix, const TensorLayout& layout,
                                std::int64_t members) {
  std::vector<float> out(static_cast<std::size_t>(members * layout.per_member));
  for (const auto& t : layout.tensors) {
    const std::string name = prefix + t.name;
    const TensorEntry* e = f.find(name);
    if (e == nullptr) throw DataError(f.path.string() + ": tensor '" + name + "' is missing");
    const auto want = stacked_shape(members, t.shape);
    if (e->dtype != DType::f32 || e->shape != want)
      throw DataError(f.path.string() + ": tensor '" + name + "' is " + std::string(safetensors_dtype_name(e->dtype)) +
                      shape_text(e->shape) + ", this model needs F32" + shape_text(want));
    auto values = tensor_values<float>(*e);
    for (float v : values)
      if (!std::isfinite(v)) throw DataError(f.path.string() + ": tensor '" + name + "' holds a NaN or infinity");
    std::copy(values.begin(), values.end(), out.begin() + t.offset * members);
  }
  return out;
}

}  // namespace

void Trainer::save_checkpoint(const std::filesystem::path& path) const {
  std::vector<TensorEntry> tensors;
  const std::int64_t m = total_members();
  std::vector<std::tuple<std::string, std::string, const TensorLayout*>> variables{
      {"params/", "params", &model_->params_layout()}, {"state/", "state", &model_->state_layout()}};
  for (const std::string& slot : optimizer_->slots())
    variables.emplace_back(slot_prefix(slot, false), slot, &model_->params_layout());
  for (const auto& [prefix, name, layout] : variables) {
    if (layout->tensors.empty()) continue;
    const std::vector<float> all = stacked(name);
    for (const auto& t : layout->tensors) {
      std::span<const float> block(all.data() + t.offset * m, static_cast<std::size_t>(t.size * m));
      tensors.push_back(make_tensor<float>(prefix + t.name, stacked_shape(m, t.shape), block));
    }
  }
  // Early stopping: each member's best parameters and state so far, and its counters (exact resume).
  if (!best_params_.empty()) {
    for (const auto& [prefix, values, layout] :
         {std::tuple{"best/params/", &best_params_, &model_->params_layout()},
          std::tuple{"best/state/", &best_state_, &model_->state_layout()}}) {
      for (const auto& t : layout->tensors) {
        std::span<const float> block(values->data() + t.offset * m, static_cast<std::size_t>(t.size * m));
        tensors.push_back(make_tensor<float>(prefix + t.name, stacked_shape(m, t.shape), block));
      }
    }
  }
  Json stopping = Json::array();
  for (const MemberStopping& s : stopping_)
    stopping.push_back({{"best_epoch", s.best_epoch},
                        {"best_nll", std::isfinite(s.best_nll) ? Json(s.best_nll) : Json(nullptr)},
                        {"wait", s.wait},
                        {"stopped_epoch", s.stopped_epoch}});
  Json keys = Json::array();
  for (const Key& k : split(init_key_, total_members())) keys.push_back({k.k0, k.k1});
  Json history = Json::array();
  for (const auto& e : history_) history.push_back(epoch_json(e));
  std::map<std::string, std::string> meta{
      {"format", kFormat},
      {"config", dump_json(config_.to_json())},
      {"step", std::to_string(step())},
      {"epochs_done", std::to_string(epochs_done_)},
      {"seed", std::to_string(config_.seed)},
      {"devices", std::to_string(mesh_.size())},
      {"train_examples", std::to_string(train_.count)},
      {"member_keys", dump_json(keys)},
      {"history", dump_json(history)},
  };
  if (!stopping_.empty()) meta["early_stopping"] = dump_json(stopping);
  if (is_main_process()) save_safetensors(path, tensors, meta);
}

namespace {

// The file, checked to be a pmapcc checkpoint (its __metadata__ "format"): the runner's, or (with
// `trainer_files`) train::Trainer's, whose members the runner reads for evaluation.
SafetensorsFile load_checkpoint_file(const std::filesystem::path& path, bool trainer_files) {
  SafetensorsFile f = load_safetensors(path);
  auto it = f.metadata.find("format");
  if (it == f.metadata.end()) throw DataError(path.string() + ": __metadata__ has no 'format': not a pmapcc checkpoint");
  if (it->second == kTrainerFormat && !trainer_files && f.metadata.find("config") == f.metadata.end())
    throw DataError(path.string() + ": written by train::Trainer (format " + kTrainerFormat +
                    ") without a program's configuration (__metadata__.config): resume it with "
                    "train::Trainer::load; this Trainer reads its members for evaluation only (load_members)");
  if (it->second != kFormat && it->second != kFormatV1 && it->second != kTrainerFormat)
    throw DataError(path.string() + ": format '" + it->second + "' is not " + kFormat + " (or " + kFormatV1 + ", or " +
                    kTrainerFormat + " for evaluation)");
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

// A train::Trainer file that mnist_ensemble wrote (its configuration, history and training examples in
// __metadata__) as this Trainer's: the optimizer's per-parameter leaves "opt/[<i>/]trace|mu|nu/<tensor>" (a
// chain's i-th transformation) become "opt/momentum|m|v/<tensor>", and the leaves this Trainer keeps elsewhere
// are dropped: the optimizer's step count (the file's "step") and the per-member values "hyperparams/..." (the
// configuration's lists).
void as_runner_file(SafetensorsFile& f) {
  std::vector<TensorEntry> kept;
  for (TensorEntry& t : f.tensors) {
    if (t.name.starts_with("hyperparams/")) continue;
    if (t.name.starts_with("opt/")) {
      std::string rest = t.name.substr(4);
      const std::size_t slash = rest.find('/');
      if (slash != std::string::npos && slash > 0 &&
          std::all_of(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(slash), [](char ch) {
            return ch >= '0' && ch <= '9';
          }))
        rest = rest.substr(slash + 1);  // the chain's transformation
      if (rest == "count") continue;
      for (const auto& [from, to] : {std::pair{"trace/", "momentum/"}, std::pair{"mu/", "m/"}, std::pair{"nu/", "v/"}})
        if (rest.starts_with(from)) rest = to + rest.substr(std::string(from).size());
      t.name = "opt/" + rest;
    }
    kept.push_back(std::move(t));
  }
  f.tensors = std::move(kept);
}

CheckpointSummary summary_of(const SafetensorsFile& f) {
  CheckpointSummary s;
  s.format = f.metadata.at("format");
  if (f.metadata.at("format") == kTrainerFormat) {  // its own "members" and "model"; the caller's "config", if any
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
  return summary_of(load_checkpoint_file(path, true));
}

void Trainer::load_members(const std::filesystem::path& path, const std::vector<int>& subset) {
  const SafetensorsFile f = load_checkpoint_file(path, true);
  const CheckpointSummary s = summary_of(f);
  if (s.config.contains("architecture"))  // before it was recorded: the flax CNN, whose tensors are checked below
    check_architecture(path, s.config.at("architecture"), config_.to_json().at("architecture"));
  check_member_subset(subset, s.members, path);
  std::vector<int> pick = subset;
  if (pick.empty())
    for (int m = 0; m < s.members; ++m) pick.push_back(m);
  if (static_cast<int>(pick.size()) != total_members())
    throw ValueError("evaluating " + std::to_string(pick.size()) + " member(s) of " + path.string() + " needs a trainer of " +
                     std::to_string(pick.size()) + " members, this one has " + std::to_string(total_members()));
  // The picked members one after another, then stacked (member_layout.h), for the parameters and the state.
  const auto n = static_cast<std::int64_t>(pick.size());
  auto picked = [&](const std::string& prefix, const TensorLayout& layout) {
    const std::vector<float> all = read_stacked(f, prefix, layout, s.members);
    std::vector<float> blocks;
    for (int g : pick) {
      const std::vector<float> one = member_block(layout, all, s.members, g, 1);
      blocks.insert(blocks.end(), one.begin(), one.end());
    }
    return stack_members(layout, blocks, static_cast<int>(n), 1, n);
  };
  restore(picked("params/", model_->params_layout()), picked("state/", model_->state_layout()), zero_optimizer_state(),
          0);
  epochs_done_ = s.epochs_done;
  history_.clear();
}

void Trainer::load_checkpoint(const std::filesystem::path& path) {
  SafetensorsFile f = load_checkpoint_file(path, false);
  if (f.metadata.at("format") == kTrainerFormat) as_runner_file(f);
  check_resumable(path, f.metadata_json("config"), config_.to_json());
  auto integer = [&](const char* key) { return metadata_count(f, key); };
  const std::int64_t step = integer("step"), epochs = integer("epochs_done");
  if (integer("train_examples") != train_.count)
    throw DataError(path.string() + ": the checkpoint was trained on " + std::to_string(integer("train_examples")) +
                    " examples, this run has " + std::to_string(train_.count));
  if (step != epochs * steps_per_epoch())
    throw DataError(path.string() + ": step " + std::to_string(step) + " does not match " + std::to_string(epochs) +
                    " epochs of " + std::to_string(steps_per_epoch()) + " steps");
  const Json history = f.metadata_json("history");
  const JsonView hv(history, path.string(), "__metadata__.history");
  std::vector<EpochMetrics> restored;
  for (std::size_t i = 0; i < hv.size(); ++i) restored.push_back(epoch_metrics_from_json(hv[i]));
  const auto params = read_stacked(f, "params/", model_->params_layout(), total_members());
  const auto state = read_stacked(f, "state/", model_->state_layout(), total_members());
  // Version 1: SGD's momentum as "momentum/<tensor>" (check_resumable has made sure the optimizer is SGD).
  const bool v1 = f.metadata.at("format") == kFormatV1;
  std::map<std::string, std::vector<float>> opt;
  for (const std::string& slot : optimizer_->slots())
    opt[slot] = read_stacked(f, slot_prefix(slot, v1), model_->params_layout(), total_members());
  std::vector<MemberStopping> stopping(stopping_.size());
  std::vector<float> best_params, best_state;
  std::size_t best_tensors = 0;
  if (!stopping_.empty()) {  // early stopping's state (check_resumable has made sure the run has it on too)
    if (f.metadata.find("early_stopping") == f.metadata.end())
      throw DataError(path.string() + ": __metadata__ has no 'early_stopping', which a run with "
                      "--early-stopping-patience writes");
    const Json saved = f.metadata_json("early_stopping");
    const JsonView sv(saved, path.string(), "__metadata__.early_stopping");
    if (sv.size() != stopping.size()) sv.fail("does not hold one entry per member");
    bool any_best = false;
    for (std::size_t g = 0; g < stopping.size(); ++g) {
      const JsonView e = sv[g];
      stopping[g].best_epoch = static_cast<int>(e["best_epoch"].as_int());
      stopping[g].best_nll =
          e["best_nll"].is_null() ? std::numeric_limits<double>::quiet_NaN() : e["best_nll"].as_double();
      stopping[g].wait = static_cast<int>(e["wait"].as_int());
      stopping[g].stopped_epoch = static_cast<int>(e["stopped_epoch"].as_int());
      if (stopping[g].best_epoch < 0 || stopping[g].best_epoch > epochs || stopping[g].wait < 0 ||
          stopping[g].stopped_epoch < 0 || stopping[g].stopped_epoch > epochs)
        e.fail("holds an epoch outside the checkpoint's " + std::to_string(epochs));
      any_best = any_best || stopping[g].best_epoch > 0;
    }
    if (any_best) {
      best_params = read_stacked(f, "best/params/", model_->params_layout(), total_members());
      best_state = read_stacked(f, "best/state/", model_->state_layout(), total_members());
      best_tensors = model_->tensors().size() + model_->state_layout().tensors.size();
    }
  }
  const std::size_t tensors = (1 + optimizer_->slots().size()) * model_->tensors().size() +
                              model_->state_layout().tensors.size() + best_tensors;
  if (f.tensors.size() != tensors)
    throw DataError(path.string() + ": holds " + std::to_string(f.tensors.size()) + " tensors, this model and " +
                    optimizer_->name() + " have " + std::to_string(tensors));
  restore(params, state, opt, step);
  epochs_done_ = static_cast<int>(epochs);
  history_ = std::move(restored);
  stopping_ = std::move(stopping);
  best_params_ = std::move(best_params);
  best_state_ = std::move(best_state);
}

}  // namespace pmap::ensemble
