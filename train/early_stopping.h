// Per-member early stopping on a validation set: Keras's EarlyStopping(monitor="val_loss", patience,
// restore_best_weights=True) applied to each member of an ensemble on its own. A member whose validation NLL
// has not improved for `patience` epochs stops: from then on it keeps its best epoch's parameters and model
// state (the stacked step still computes it; what an epoch teaches it is discarded), and at the end every
// member goes back to its best epoch.
//
//   auto [fit, held_out] = train::split_validation(train_set, 0.1, train::validation_key(seed));
//   train::EarlyStopping stop(2);
//   for (int e = 0; e < epochs && !stop.all_stopped(); ++e) {
//     trainer.run_epoch(fit);
//     const train::Evaluation v = stop.end_epoch(trainer, held_out);
//   }
//   stop.restore_best(trainer);
#pragma once

#include <map>
#include <string>
#include <vector>

#include <pmapcc/train/trainer.h>

namespace pmap::train {

// One member's record.
struct MemberStopping {
  int best_epoch = 0;    // the epoch of its lowest validation NLL so far (the first on ties); 0: none evaluated
  double best_nll = 0;   // that NLL
  int wait = 0;          // epochs since it improved
  int stopped_epoch = 0; // the epoch it stopped after; 0: still training
};

class EarlyStopping {
 public:
  // patience: epochs without improvement before a member stops, at least 1 (ValueError naming it).
  explicit EarlyStopping(int patience);

  int patience() const { return patience_; }
  // Each member's record (empty before the first end_epoch), member g at index g.
  const std::vector<MemberStopping>& members() const { return members_; }
  bool all_stopped() const;

  // After `trainer`'s epoch (its epochs_done() is the epoch's number): the members that had stopped go back to
  // their best; every member is evaluated on `validation` (Trainer::evaluate); a running member whose NLL is
  // below its best (a number after a NaN: a NaN never improves) keeps its parameters and model state as its
  // best, one that has not improved for patience() epochs stops and goes back to its best now. Returns the
  // evaluation (of the stopped members at their best). ValueError for a Trainer of another member count than
  // the previous call's. Collective.
  Evaluation end_epoch(Trainer& trainer, const Dataset& validation, const EvaluateOptions& options = {});

  // Every member that has a best epoch at its best parameters and model state: the end of a run. Collective.
  void restore_best(Trainer& trainer) const;

  // For Trainer::save: the records as the __metadata__ entry "early_stopping" (per member best_epoch, best_nll,
  // null when not a number, wait and stopped_epoch: the runner's entry), the patience as
  // "early_stopping_patience", and, once a member has a best, the best parameters and model state as tensors
  // "best/params/<tensor>" and "best/state/<tensor>" (members, ...).
  void save_to(std::map<std::string, std::string>& metadata, Variables& tensors) const;
  // Continues from a checkpoint (Trainer::load with others {"best/"}, the runner's files with
  // --early-stopping-patience too) of `trainer`'s run: DataError naming the source and entry for a run of
  // another patience, records that are not one per member of `trainer` (none: saved before the first epoch's
  // end, a fresh start), hold an epoch past its epochs_done(), or miss a best tensor.
  // Collective.
  void restore(const Checkpoint& checkpoint, const Trainer& trainer, const std::string& source);

 private:
  void restore(Trainer& trainer, const std::vector<int>& members) const;

  int patience_;
  std::vector<MemberStopping> members_;
  Variables best_params_, best_state_;  // on the host, (members, ...), each member's rows from its best epoch
};

}  // namespace pmap::train
