// Trainer checkpoints: save gathers every member to the host and the mesh's first process writes one
// safetensors file; load checks a file against this Trainer, then copies each device's rows into its state.
// The runner's files (ensemble::Trainer, formats pmapcc.ensemble.v1 and v2) load by their tensor names.
#include <pmapcc/train/trainer.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <exception>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <pmap/collectives.h>
#include <pmap/distributed.h>
#include <pmap/error.h>
#include <pmap/pmap.h>
#include <pmapcc/io/json.h>
#include <pmapcc/io/safetensors.h>

namespace pmap::train {
namespace {

constexpr const char* kFormat = kCheckpointFormat;
constexpr const char* kRunnerV2 = "pmapcc.ensemble.v2";
constexpr const char* kRunnerV1 = "pmapcc.ensemble.v1";

// The __metadata__ keys save writes itself (a caller's metadata may not use them).
const std::set<std::string>& own_keys() {
  static const std::set<std::string> keys{"format", "model",      "optimizer", "mode",    "members",
                                          "seed",   "step",       "epochs_done", "devices", "member_keys"};
  return keys;
}

// The roles of a TrainState a checkpoint holds, with their tensors' prefixes.
struct Role {
  const char* prefix;
  Variables TrainState::*member;
};
constexpr Role kRoles[] = {{"params/", &TrainState::params},
                           {"state/", &TrainState::state},
                           {"opt/", &TrainState::opt},
                           {"hyperparams/", &TrainState::hyperparams}};

std::string shape_text(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

io::TensorEntry entry_of(std::string name, const Array& host) {
  io::TensorEntry e{std::move(name), host.dtype(), host.shape(), std::vector<std::byte>(host.nbytes())};
  if (host.nbytes() > 0) host.copy_to_host(e.data.data(), host.nbytes());
  return e;
}

// A file's __metadata__ value as a whole number (DataError naming the file and key otherwise).
std::int64_t whole(const io::SafetensorsFile& f, const std::string& key) {
  const io::Json j = f.metadata_json(key);
  if (!j.is_number_integer()) throw DataError(f.path.string() + ": __metadata__." + key + " is not a whole number");
  return j.get<std::int64_t>();
}

std::string text(const io::SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end()) throw DataError(f.path.string() + ": __metadata__ has no '" + key + "'");
  return it->second;
}

std::string list_text(const std::vector<float>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, v[i]).ptr;  // the shortest text that reads back as v[i]
    out += (i ? ", " : "") + std::string(buf, end);
  }
  return out + "]";
}

// The runner's name for the optimizer state leaf `field` keeps per parameter (SGD's momentum, Adam's moments).
const char* runner_slot(const std::string& field) {
  if (field == "trace") return "momentum";
  if (field == "mu") return "m";
  if (field == "nu") return "v";
  return nullptr;
}

}  // namespace

std::string checkpoint_format(const std::map<std::string, std::string>& metadata, const std::string& file) {
  const auto fmt = metadata.find("format");
  if (fmt == metadata.end()) throw DataError(file + ": __metadata__ has no 'format': not a pmapcc checkpoint");
  if (fmt->second != kFormat && fmt->second != kRunnerV2 && fmt->second != kRunnerV1)
    throw DataError(file + ": format '" + fmt->second + "' is not " + kFormat + " (nor the runner's " + kRunnerV2 +
                    " or " + kRunnerV1 + ")");
  return fmt->second;
}

void Trainer::save(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata,
                   const Variables& others) const {
  for (const auto& [k, v] : metadata)
    if (own_keys().contains(k))
      throw ValueError("train::Trainer::save: metadata key '" + k + "' is one the Trainer writes itself");
  for (const auto& [name, a] : others)
    for (const Role& role : kRoles)
      if (name.starts_with(role.prefix))
        throw ValueError("train::Trainer::save: tensor '" + name + "' is under " + role.prefix +
                         ", where the Trainer writes its own");
  std::vector<io::TensorEntry> tensors;
  for (const Role& role : kRoles)
    for (const auto& [name, a] : gathered(role.member)) tensors.push_back(entry_of(role.prefix + name, a));
  for (const auto& [name, a] : others) tensors.push_back(entry_of(name, a));
  io::Json keys = io::Json::array();
  for (const Key& k : split(split(key(options_.seed), 2)[0], options_.members)) keys.push_back({k.k0, k.k1});
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = kFormat;
  meta["model"] = step_.model().name();
  meta["optimizer"] = step_.optimizer().name();
  meta["mode"] = options_.data_parallel ? "data-parallel" : "ensemble";
  meta["members"] = std::to_string(options_.members);
  meta["seed"] = std::to_string(options_.seed);
  meta["step"] = std::to_string(step());
  meta["epochs_done"] = std::to_string(epochs_done_);
  meta["devices"] = std::to_string(mesh_.size());
  meta["member_keys"] = io::dump_json(keys);
  const bool writer = mesh_.devices()[0].process == distributed::process_index();
  std::exception_ptr failure;
  if (writer) try {
      io::save_safetensors(path, tensors, meta);
    } catch (...) {
      failure = std::current_exception();
    }
  // Every process waits for the file and learns whether it was written: the writer's outcome summed over the
  // mesh (so a load right after a save reads the new file, and a failed write raises in every process).
  const float failed = writer && failure ? 1.0f : 0.0f;
  const auto outcome = pmap::pmap([&](int) {
    return psum(Array::from_host(std::vector<float>{failed}, Shape{1}, current_device()), all_axes());
  }, mesh_)(0);
  if (failure) std::rethrow_exception(failure);
  if (outcome[0].to_vector<float>()[0] > 0)
    throw IoError("train::Trainer::save: process " + std::to_string(mesh_.devices()[0].process) +
                  " could not write " + path.string());
}

Checkpoint Trainer::load(const std::filesystem::path& path, const std::vector<std::string>& others) {
  const std::string file = path.string();
  const Variables own = gathered(&TrainState::hyperparams);  // collective: before anything can fail
  const TrainState& first = states_[0];
  std::map<std::string, Array> host;  // by this Trainer's name ("params/Conv_0/kernel")
  Checkpoint out;
  std::int64_t step = 0, epochs = 0;
  std::exception_ptr failure;
  try {  // reading and checking the file: nothing collective, nothing changed
    const io::SafetensorsFile f = io::load_safetensors(path);
    auto fail = [&](const std::string& what) { throw DataError(file + ": " + what); };
    const std::string format = checkpoint_format(f.metadata, file);
    const bool runner = format != kFormat, v1 = format == kRunnerV1;
    const int members = options_.members;
    const std::string mode = options_.data_parallel ? "data-parallel" : "ensemble";

    // What the file says it is, against this Trainer.
    io::Json config;  // the runner's configuration (its program's flags)
    std::string saved_model, saved_mode;
    std::uint64_t saved_seed = 0;
    if (runner) {
      config = f.metadata_json("config");
      auto field = [&](const char* name) -> const io::Json& {
        if (!config.is_object() || !config.contains(name))
          fail(std::string("__metadata__.config has no '") + name + "'");
        return config[name];
      };
      for (const char* name : {"model", "mode", "optimizer"})
        if (config.is_object() && config.contains(name) && !config[name].is_string())
          fail(std::string("__metadata__.config.") + name + " is not a string");
      saved_model = config.contains("model") ? field("model").get<std::string>() : "flax-cnn";  // v1: the only one
      saved_mode = config.contains("mode") ? field("mode").get<std::string>() : "ensemble";
      if (saved_mode == "model-parallel") saved_mode = "data-parallel";  // one model, its batch split over "data"
      if (!field("seed").is_number_integer()) fail("__metadata__.config.seed is not a whole number");
      saved_seed = static_cast<std::uint64_t>(field("seed").get<std::int64_t>());  // written as int64(seed)
      // The optimizer's class (its settings, the momentum or the betas, are the caller's to keep; a chain, the
      // runner's clipping or decay, is checked by the slots it finds).
      const std::string opt = config.contains("optimizer") ? field("optimizer").get<std::string>() : "sgd";
      const std::string cls = opt == "sgd"     ? "optim::Sgd"
                              : opt == "adam"  ? "optim::Adam"
                              : opt == "adamw" ? "optim::AdamW"
                                               : opt;
      if (std::string(step_.optimizer().name()) != "optim::chain" && cls != step_.optimizer().name())
        fail("the checkpoint was trained with " + cls + ", this Trainer with " + step_.optimizer().name());
      if (saved_mode == "ensemble" && field("members") != io::Json(members))
        fail("the checkpoint holds " + io::dump_json(field("members")) + " members; this Trainer has " +
             std::to_string(members) + " (options.members)");
      // A per-member list the runner trained with must be this Trainer's per-member values (checked below),
      // unless its values are all one (one value for every member, as the optimizer's or the model's own).
      for (const auto& [flag, name] : {std::pair{"lr", "learning_rate"}, std::pair{"weight_decay", "weight_decay"},
                                       std::pair{"dropout", "dropout_rate"}}) {
        if (!config.contains(flag) || !config[flag].is_array() || states_[0].hyperparams.contains(name)) continue;
        const io::Json& list = config[flag];
        if (std::any_of(list.begin(), list.end(), [&](const io::Json& v) { return v != list.front(); }))
          fail(std::string("the checkpoint's members were trained with one ") + name + " each (" +
               io::dump_json(list) + "); give them as options.hyperparams." + name);
      }
    } else {
      saved_model = text(f, "model");
      saved_mode = text(f, "mode");
      const io::Json seed = f.metadata_json("seed");
      if (!seed.is_number_unsigned()) fail("__metadata__.seed is not a whole number");
      saved_seed = seed.get<std::uint64_t>();
      if (whole(f, "members") != members)
        fail("the checkpoint holds " + text(f, "members") + " members; this Trainer has " + std::to_string(members) +
             " (options.members)");
      if (text(f, "optimizer") != step_.optimizer().name())
        fail("the checkpoint was trained with " + text(f, "optimizer") + ", this Trainer with " +
             step_.optimizer().name());
    }
    if (saved_model != step_.model().name())
      fail("the checkpoint holds model '" + saved_model + "'; this Trainer trains '" + step_.model().name() + "'");
    if (saved_mode != mode)
      fail("the checkpoint was trained in " + saved_mode + " mode; this Trainer trains " +
           (options_.data_parallel ? "data parallel (options.data_parallel)" : "an ensemble"));
    if (saved_seed != options_.seed)
      fail("the checkpoint was trained from seed " + std::to_string(saved_seed) + "; this Trainer's is " +
           std::to_string(options_.seed) + " (options.seed: the members' keys and the epochs' orders come from it)");
    step = whole(f, "step");
    epochs = whole(f, "epochs_done");
    if (step < 0 || epochs < 0 || epochs > step || epochs > 1'000'000'000)
      fail("step " + std::to_string(step) + " and epochs_done " + std::to_string(epochs) + " do not describe a run");

    // Every tensor this Trainer holds, from the file: (members, ...) for a member's, as on a device otherwise.
    std::set<std::string> used;
    for (const Role& role : kRoles) {
      const bool opt = role.member == &TrainState::opt, hyper = role.member == &TrainState::hyperparams;
      for (const auto& [name, a] : first.*role.member) {
        const bool shared = opt && shared_leaf(name);
        Shape want = a.shape();
        if (!shared) want[0] = members;
        const P spec = spec_of(role.member, name);  // a split leaf's whole shape: its block's times the axes' sizes
        for (std::size_t d = 0; d < spec.size(); ++d)
          if (!spec.dims()[d].empty()) want[d + 1] *= mesh_.axis_size(spec.dims()[d]);
        std::string from = role.prefix + name;  // the file's name for it
        if (runner && opt) {
          if (shared) {  // an element-wise optimizer's count: the runner's step
            if (a.dtype() != DType::i64 || a.size() != 1)
              fail("the runner's checkpoint holds no state for the optimizer's '" + name + "' (" + a.signature() + ")");
            host.emplace(role.prefix + name, Array::from_host(std::vector<std::int64_t>{step}, want));
            continue;
          }
          std::string param;  // the parameter the leaf is kept for (a loop: clang 14 captures no binding)
          for (const std::string& p : step_.model().param_names())
            if (param.empty() && name.size() > p.size() && name.ends_with("/" + p)) param = p;
          const std::string head = param.empty() ? name : name.substr(0, name.size() - param.size() - 1);
          const char* slot = runner_slot(head.substr(head.rfind('/') == std::string::npos ? 0 : head.rfind('/') + 1));
          if (param.empty() || slot == nullptr)
            fail("the runner's checkpoint holds no state for " + std::string(step_.optimizer().name()) + "'s '" + name +
                 "' (it kept SGD's momentum and Adam's moments)");
          from = (v1 ? "" : "opt/") + std::string(slot) + "/" + param;
        }
        if (runner && hyper) {  // the runner's per-member lists, from its configuration
          const char* field = name == "learning_rate" ? "lr" : name == "dropout_rate" ? "dropout" : name.c_str();
          io::Json list = config.contains(field) ? config[field] : io::Json();
          if (list.is_number()) list = io::Json(std::vector<io::Json>(static_cast<std::size_t>(members), list));
          if (!list.is_array() || list.size() != static_cast<std::size_t>(members))
            fail("the checkpoint was trained with one " + name + " for every member; this Trainer has one per member "
                 "(options.hyperparams." + name + ")");
          std::vector<float> values;
          for (const io::Json& v : list) {
            if (!v.is_number()) fail("__metadata__.config." + std::string(field) + " holds " + io::dump_json(v));
            values.push_back(static_cast<float>(v.get<double>()));
          }
          host.emplace(role.prefix + name, Array::from_host(values, want));
          continue;
        }
        const io::TensorEntry* e = f.find(from);
        if (e == nullptr)
          fail("tensor '" + from + "' is missing (this Trainer's is " +
               std::string(io::safetensors_dtype_name(a.dtype())) + shape_text(want) + ")");
        if (e->dtype != a.dtype() || e->shape != want)
          fail("tensor '" + from + "' is " + std::string(io::safetensors_dtype_name(e->dtype)) + shape_text(e->shape) +
               "; this Trainer's is " + std::string(io::safetensors_dtype_name(a.dtype())) + shape_text(want));
        Array t(want, e->dtype);
        if (t.nbytes() > 0) t.copy_from_host(e->data.data(), e->data.size());
        if (e->dtype == DType::f32) {
          const float* v = t.data<float>();
          if (!std::all_of(v, v + t.size(), [](float x) { return std::isfinite(x); }))
            fail("tensor '" + from + "' holds a NaN or an infinity");
        }
        used.insert(from);
        host.emplace(role.prefix + name, std::move(t));
      }
    }
    std::string extra;
    for (const io::TensorEntry& e : f.tensors) {
      if (used.contains(e.name)) continue;
      if (std::any_of(others.begin(), others.end(), [&](const std::string& p) { return e.name.starts_with(p); })) {
        Array t(e.shape, e.dtype);
        if (t.nbytes() > 0) t.copy_from_host(e.data.data(), e.data.size());
        out.tensors.emplace(e.name, std::move(t));
      } else {
        extra += (extra.empty() ? "'" : ", '") + e.name + "'";
      }
    }
    if (!extra.empty())
      fail("holds tensors this Trainer does not (another model or optimizer, per-member hyper-parameters it was "
           "not given, or a part's, whose prefix load's `others` names): " + extra);
    // Per-member hyper-parameters: the file's must be this Trainer's (its options'), member by member.
    for (const auto& [name, a] : own) {
      const std::vector<float> mine = a.to_vector<float>();
      const std::vector<float> theirs = host.at("hyperparams/" + name).to_vector<float>();
      if (mine != theirs)
        fail("the checkpoint's members were trained with " + name + " " + list_text(theirs) + "; this Trainer's are " +
             list_text(mine) + " (options.hyperparams." + name + ")");
    }
    out.metadata = f.metadata;
  } catch (...) {
    failure = std::current_exception();
  }
  // Every process read the file alike, or every process raises (none goes on into a collective alone).
  const float failed = failure ? 1.0f : 0.0f;
  const auto outcome = pmap::pmap([&](int) {
    return psum(Array::from_host(std::vector<float>{failed}, Shape{1}, current_device()), all_axes());
  }, mesh_)(0);
  if (failure) std::rethrow_exception(failure);
  if (outcome[0].to_vector<float>()[0] > 0)
    throw DataError(file + ": another process of the mesh could not load it (its error says why)");

  for (const Role& role : kRoles) {
    Variables part;
    for (const auto& [name, a] : first.*role.member) part.emplace(name, std::move(host.at(role.prefix + name)));
    put(role.member, part);
  }
  pmap::pmap([&](TrainState& s) { s.step.copy_from(Array::from_host(std::vector<std::int64_t>{step}, Shape{1})); },
             mesh_)(states_);
  epochs_done_ = static_cast<int>(epochs);
  return out;
}

SavedMembers read_members(const std::filesystem::path& path, const Model& model, const std::vector<int>& members) {
  const std::string file = path.string();
  auto fail = [&](const std::string& what) { throw DataError(file + ": " + what); };
  const io::SafetensorsFile f = io::load_safetensors(path);
  const bool runner = checkpoint_format(f.metadata, file) != kFormat;
  std::string saved_model = "flax-cnn";  // the runner's v1 files: the only model there was
  if (runner) {
    const io::Json config = f.metadata_json("config");
    if (config.is_object() && config.contains("model")) {
      if (!config["model"].is_string()) fail("__metadata__.config.model is not a string");
      saved_model = config["model"].get<std::string>();
    }
  } else {
    saved_model = text(f, "model");
  }
  if (saved_model != model.name())
    fail("the checkpoint holds model '" + saved_model + "', not '" + model.name() + "'");

  // The file's member count: the leading axis of the model's first tensor (every tensor is checked against it).
  const auto [params, state] = model.init(key(0));
  const io::TensorEntry* first = f.find("params/" + model.param_names().at(0));
  if (first == nullptr || first->shape.empty() || first->shape[0] < 1)
    fail("tensor 'params/" + model.param_names().at(0) + "' is missing or holds no member");
  SavedMembers out;
  out.members = static_cast<int>(first->shape[0]);
  out.metadata = f.metadata;
  std::vector<int> pick = members;
  if (pick.empty())
    for (int m = 0; m < out.members; ++m) pick.push_back(m);
  for (std::size_t i = 0; i < pick.size(); ++i) {
    if (pick[i] < 0 || pick[i] >= out.members)
      throw ValueError("member " + std::to_string(pick[i]) + " is not among the " + std::to_string(out.members) +
                       " members (0.." + std::to_string(out.members - 1) + ") of " + file);
    if (std::count(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(i), pick[i]) > 0)
      throw ValueError("member " + std::to_string(pick[i]) + " is asked for twice");
  }
  const auto rows = static_cast<std::int64_t>(pick.size());
  auto read = [&](const std::string& prefix, const Variables& like, Variables& into) {
    for (const auto& [name, a] : like) {
      Shape want = a.shape();
      want.insert(want.begin(), out.members);
      const io::TensorEntry* e = f.find(prefix + name);
      if (e == nullptr)
        fail("tensor '" + prefix + name + "' is missing (the model's is " +
             std::string(io::safetensors_dtype_name(a.dtype())) + shape_text(want) + ")");
      if (e->dtype != DType::f32 || e->shape != want)
        fail("tensor '" + prefix + name + "' is " + std::string(io::safetensors_dtype_name(e->dtype)) +
             shape_text(e->shape) + "; the model's is f32" + shape_text(want));
      const std::size_t row = static_cast<std::size_t>(a.size()) * sizeof(float);
      Shape picked = want;
      picked[0] = rows;
      std::vector<float> values(static_cast<std::size_t>(rows * a.size()));
      for (std::size_t i = 0; i < pick.size(); ++i)
        std::memcpy(values.data() + i * static_cast<std::size_t>(a.size()),
                    e->data.data() + static_cast<std::size_t>(pick[i]) * row, row);
      if (!std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); }))
        fail("tensor '" + prefix + name + "' holds a NaN or an infinity");
      into.emplace(name, Array::from_host(values, picked));
    }
  };
  read("params/", params, out.params);
  read("state/", state, out.state);
  return out;
}

}  // namespace pmap::train
