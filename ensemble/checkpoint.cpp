// Trainer checkpoints: every member's parameters and momentum as (members, ...) safetensors tensors,
// with the step, epoch, keys, configuration and history in __metadata__. Written atomically.
#include <cmath>

#include <pmap/error.h>

#include "ensemble/safetensors.h"
#include "ensemble/trainer.h"

namespace pmap::ensemble {
namespace {

constexpr const char* kFormat = "pmapcc.ensemble.v1";

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

// The fields a resumed run must share with the run that wrote the checkpoint to continue exactly.
void check_same(const SafetensorsFile& f, const Json& saved, const Json& now) {
  const JsonView s(saved, f.path.string(), "__metadata__.config");
  for (const char* field : {"mode", "members", "seed", "batch_size", "lr", "momentum", "train_limit"}) {
    const Json* a = saved.find(field);
    const Json* b = now.find(field);
    if (a == nullptr) s.fail(std::string("missing field '") + field + "'");
    if (!(*a == *b))
      throw DataError(f.path.string() + ": the checkpoint was written with " + field + " = " + a->dump() +
                      ", this run has " + b->dump() + " (resume with the same setting)");
  }
}

std::vector<float> read_stacked(const SafetensorsFile& f, const std::string& prefix, const Sequential& model,
                                std::int64_t members) {
  std::vector<float> out(static_cast<std::size_t>(members * model.params_per_member()));
  for (const auto& t : model.tensors()) {
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
  const std::int64_t m = total_members_;
  for (const char* prefix : {"params/", "momentum/"}) {
    const std::vector<float> all = gather(std::string(prefix) == "momentum/");
    for (const auto& t : model_->tensors()) {
      std::span<const float> block(all.data() + t.offset * m, static_cast<std::size_t>(t.size * m));
      tensors.push_back(make_tensor<float>(prefix + t.name, stacked_shape(m, t.shape), block));
    }
  }
  Json keys = Json::array();
  for (const Key& k : split(init_key_, total_members_)) {
    Json pair = Json::array();
    pair.push_back(static_cast<std::int64_t>(k.k0));
    pair.push_back(static_cast<std::int64_t>(k.k1));
    keys.push_back(std::move(pair));
  }
  Json history = Json::array();
  for (const auto& e : history_) history.push_back(epoch_json(e));
  std::map<std::string, std::string> meta{
      {"format", kFormat},
      {"config", config_.to_json().dump()},
      {"step", std::to_string(step())},
      {"epochs_done", std::to_string(epochs_done_)},
      {"seed", std::to_string(config_.seed)},
      {"devices", std::to_string(mesh_.size())},
      {"train_examples", std::to_string(train_.count)},
      {"member_keys", keys.dump()},
      {"history", history.dump()},
  };
  if (is_main_process()) save_safetensors(path, tensors, meta);
}

void Trainer::load_checkpoint(const std::filesystem::path& path) {
  const SafetensorsFile f = load_safetensors(path);
  auto meta = [&](const char* key) -> const std::string& {
    auto it = f.metadata.find(key);
    if (it == f.metadata.end()) throw DataError(path.string() + ": __metadata__ has no '" + key + "': not a pmapcc checkpoint");
    return it->second;
  };
  if (meta("format") != kFormat)
    throw DataError(path.string() + ": format '" + meta("format") + "' is not " + kFormat);
  check_same(f, f.metadata_json("config"), config_.to_json());
  auto integer = [&](const char* key) {
    const Json j = f.metadata_json(key);
    if (!j.is_integer() || j.as_int() < 0) throw DataError(path.string() + ": __metadata__." + key + " is not a count");
    return j.as_int();
  };
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
  const auto params = read_stacked(f, "params/", *model_, total_members_);
  const auto momentum = read_stacked(f, "momentum/", *model_, total_members_);
  if (f.tensors.size() != 2 * model_->tensors().size())
    throw DataError(path.string() + ": holds " + std::to_string(f.tensors.size()) + " tensors, this model has " +
                    std::to_string(2 * model_->tensors().size()));
  scatter(params, momentum, step);
  epochs_done_ = static_cast<int>(epochs);
  history_ = std::move(restored);
}

}  // namespace pmap::ensemble
