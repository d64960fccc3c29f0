// Per-member early stopping: the records, and the members' best parameters kept on the host.
#include <pmapcc/train/early_stopping.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include <pmap/error.h>
#include <pmapcc/io/json.h>

namespace pmap::train {
namespace {

// Member g's rows of `from` copied into `to` (host tensors (members, ...) of the same names and shapes).
void copy_rows(const Variables& from, Variables& to, int g) {
  for (auto& [name, a] : to) {
    const Array& src = from.at(name);
    const std::size_t row = a.nbytes() / static_cast<std::size_t>(a.dim(0));
    std::memcpy(static_cast<std::byte*>(a.raw_data()) + row * static_cast<std::size_t>(g),
                static_cast<const std::byte*>(src.raw_data()) + row * static_cast<std::size_t>(g), row);
  }
}

}  // namespace

EarlyStopping::EarlyStopping(int patience) : patience_(patience) {
  if (patience < 1)
    throw ValueError("train::EarlyStopping: patience is " + std::to_string(patience) + "; it must be at least 1");
}

bool EarlyStopping::all_stopped() const {
  return !members_.empty() &&
         std::all_of(members_.begin(), members_.end(), [](const MemberStopping& s) { return s.stopped_epoch > 0; });
}

void EarlyStopping::restore(Trainer& trainer, const std::vector<int>& members) const {
  if (members.empty() || best_params_.empty()) return;
  trainer.set_members(best_params_, best_state_, members);
}

Evaluation EarlyStopping::end_epoch(Trainer& trainer, const Dataset& validation, const EvaluateOptions& options) {
  const int count = trainer.options().data_parallel ? 1 : trainer.options().members;
  if (members_.empty()) members_.assign(static_cast<std::size_t>(count), MemberStopping{});
  if (static_cast<int>(members_.size()) != count)
    throw ValueError("train::EarlyStopping::end_epoch: the Trainer has " + std::to_string(count) +
                     " members; this EarlyStopping keeps the records of " + std::to_string(members_.size()));
  std::vector<int> stopped, improved, stopped_now;
  for (int g = 0; g < count; ++g)
    if (members_[static_cast<std::size_t>(g)].stopped_epoch > 0) stopped.push_back(g);
  restore(trainer, stopped);  // what the epoch taught the stopped members is discarded
  Evaluation e = trainer.evaluate(validation, options);
  const int epoch = trainer.epochs_done();
  for (int g = 0; g < count; ++g) {
    MemberStopping& s = members_[static_cast<std::size_t>(g)];
    if (s.stopped_epoch > 0) continue;
    const double nll = e.member_calibration.at(static_cast<std::size_t>(g)).nll;
    if (s.best_epoch == 0 || nll < s.best_nll || (std::isnan(s.best_nll) && !std::isnan(nll))) {
      s.best_epoch = epoch;
      s.best_nll = nll;
      s.wait = 0;
      improved.push_back(g);
    } else if (++s.wait >= patience_) {
      s.stopped_epoch = epoch;
      stopped_now.push_back(g);
    }
  }
  if (!improved.empty()) {  // the improved members' parameters and state become their best
    Variables params = trainer.params(), state = trainer.model_state();
    if (best_params_.empty()) {
      best_params_ = std::move(params);
      best_state_ = std::move(state);
    } else {
      for (const int g : improved) {
        copy_rows(params, best_params_, g);
        copy_rows(state, best_state_, g);
      }
    }
  }
  restore(trainer, stopped_now);
  return e;
}

void EarlyStopping::restore_best(Trainer& trainer) const {
  std::vector<int> members;
  for (std::size_t g = 0; g < members_.size(); ++g)
    if (members_[g].best_epoch > 0) members.push_back(static_cast<int>(g));
  restore(trainer, members);
}

void EarlyStopping::save_to(std::map<std::string, std::string>& metadata, Variables& tensors) const {
  io::Json records = io::Json::array();
  for (const MemberStopping& s : members_)
    records.push_back({{"best_epoch", s.best_epoch},
                       {"best_nll", std::isfinite(s.best_nll) ? io::Json(s.best_nll) : io::Json(nullptr)},
                       {"wait", s.wait},
                       {"stopped_epoch", s.stopped_epoch}});
  metadata["early_stopping"] = io::dump_json(records);
  metadata["early_stopping_patience"] = std::to_string(patience_);
  for (const auto& [prefix, best] : {std::pair{"best/params/", &best_params_}, std::pair{"best/state/", &best_state_}})
    for (const auto& [name, a] : *best) tensors.emplace(prefix + name, a.copy());
}

void EarlyStopping::restore(const Checkpoint& checkpoint, const Trainer& trainer, const std::string& source) {
  const auto it = checkpoint.metadata.find("early_stopping");
  if (it == checkpoint.metadata.end())
    throw DataError(source + ": __metadata__ has no 'early_stopping' (written by a run without early stopping)");
  // The patience the run had (the runner recorded it in its configuration): the same, or the run changes.
  std::string recorded;
  if (const auto p = checkpoint.metadata.find("early_stopping_patience"); p != checkpoint.metadata.end()) {
    recorded = p->second;
  } else if (const auto c = checkpoint.metadata.find("config"); c != checkpoint.metadata.end()) {
    const io::Json config = io::parse_json(c->second, source + ": __metadata__.config");
    if (config.is_object() && config.contains("early_stopping_patience"))
      recorded = io::dump_json(config["early_stopping_patience"]);
  }
  if (!recorded.empty() && recorded != std::to_string(patience_))
    throw DataError(source + ": the run stopped its members with patience " + recorded + "; this EarlyStopping's is " +
                    std::to_string(patience_));
  const io::Json records = io::parse_json(it->second, source + ": __metadata__.early_stopping");
  const io::JsonView view(records, source, "__metadata__.early_stopping");
  const int count = trainer.options().data_parallel ? 1 : trainer.options().members;
  if (view.size() == 0) {  // saved before its first epoch's end: nothing to continue
    members_.clear();
    best_params_.clear();
    best_state_.clear();
    return;
  }
  if (view.size() != static_cast<std::size_t>(count))
    view.fail("holds " + std::to_string(view.size()) + " records; the Trainer has " + std::to_string(count) +
              " members");
  std::vector<MemberStopping> members(static_cast<std::size_t>(count));
  const int epochs = trainer.epochs_done();
  bool any_best = false;
  for (std::size_t g = 0; g < members.size(); ++g) {
    const io::JsonView e = view[g];
    MemberStopping& s = members[g];
    s.best_epoch = static_cast<int>(e["best_epoch"].as_int());
    s.best_nll = e["best_nll"].is_null() ? std::nan("") : e["best_nll"].as_double();
    s.wait = static_cast<int>(e["wait"].as_int());
    s.stopped_epoch = static_cast<int>(e["stopped_epoch"].as_int());
    if (s.best_epoch < 0 || s.best_epoch > epochs || s.wait < 0 || s.stopped_epoch < 0 || s.stopped_epoch > epochs)
      e.fail("holds an epoch outside the checkpoint's " + std::to_string(epochs));
    if (s.stopped_epoch > 0 && s.stopped_epoch < s.best_epoch)
      e.fail("stops the member before its best epoch");
    any_best = any_best || s.best_epoch > 0;
  }
  Variables best_params, best_state;
  if (any_best) {
    const Variables params = trainer.params(), state = trainer.model_state();
    for (const auto& [prefix, now, best] : {std::tuple{"best/params/", &params, &best_params},
                                            std::tuple{"best/state/", &state, &best_state}})
      for (const auto& [name, a] : *now) {
        const auto t = checkpoint.tensors.find(prefix + name);
        if (t == checkpoint.tensors.end())
          throw DataError(source + ": tensor '" + prefix + name + "' is missing (early stopping's best)");
        if (t->second.shape() != a.shape() || t->second.dtype() != a.dtype())
          throw DataError(source + ": tensor '" + prefix + name + "' is " + t->second.signature() + "; it must be " +
                          a.signature());
        best->emplace(name, t->second.copy());
      }
  }
  members_ = std::move(members);
  best_params_ = std::move(best_params);
  best_state_ = std::move(best_state);
}

}  // namespace pmap::train
