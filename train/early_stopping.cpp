// Per-member early stopping: the records, and the members' best parameters kept on the host.
#include <pmapcc/train/early_stopping.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include <pmap/error.h>

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

}  // namespace pmap::train
