// The parts of the program's run around train::Trainer, as the runner (the training layer before issue #51)
// had them, so the program's outputs keep their form: the resolved configuration its files record, an epoch's metrics from the
// Trainer's report and evaluation, early stopping's records, the checkpoint's own entries (the flags, the
// history) and the checks of a resumed run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <pmap/mesh.h>

#include <pmapcc/io/json.h>
#include <pmapcc/train/early_stopping.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/config.h"

namespace pmap::ensemble {

// `c` as the run on `mesh` (one axis, or the mode's axis by "model") resolves it: the model's architecture,
// the mesh's devices (A x M), processes, members (0: one per device along A in ensemble mode, else 1), the
// report interval (0: 1 on CPU devices, 16 on GPUs) and a cosine schedule's decay steps (0: the run's steps
// after the warmup, over the `fit` set's steps). Checks c against the mesh and the data (TrainConfig::check)
// first, and --dropout against a model without Dropout: ValueError naming the flag.
TrainConfig resolved_config(TrainConfig c, const Mesh& mesh, const Dataset& fit, const Dataset& test);

// One epoch's metrics: the Trainer's `report` of its steps (nullptr: no training, as for an evaluation) and the
// `evaluation` after it, on the set `evaluated_on` ("test" or "validation"), which took eval_seconds.
EpochMetrics epoch_metrics(const train::EpochReport* report, const train::Evaluation& evaluation,
                           const std::string& evaluated_on = "test", double eval_seconds = 0);

// Early stopping's records of `members` members: the EarlyStopping's, or before its first epoch (a run of
// --epochs 0) a record of no epoch for each member, as the runner's.
std::vector<train::MemberStopping> stopping_records(const train::EarlyStopping& stopping, int members);

// The metrics JSON's "early_stopping": [{"member", "best_epoch", "best_validation_nll" (null: no epoch evaluated
// yet, or not a number), "stopped_epoch" (null: trained every epoch)}].
io::Json early_stopping_json(const std::vector<train::MemberStopping>& records);

// What the program adds to a Trainer checkpoint's __metadata__: its resolved configuration ("config", as
// TrainConfig::to_json), the epochs' metrics ("history", epoch_json's) and its training examples
// ("train_examples"), as the runner's files hold them.
std::map<std::string, std::string> checkpoint_metadata(const TrainConfig& resolved,
                                                       const std::vector<EpochMetrics>& history,
                                                       std::int64_t train_examples);

// Before a resumed run loads `path`: the checkpoint's recorded configuration (the runner's, or one that
// checkpoint_metadata wrote) against this run's `resolved` one (check_resumable: DataError naming the field).
// A train::Trainer file without a program's configuration is left to Trainer::load's checks.
void check_resume(const std::filesystem::path& path, const TrainConfig& resolved);

// After Trainer::load: the file's training examples against this run's (DataError naming both), its `step`
// against its `epochs_done` epochs of `steps_per_epoch` steps, and its history, the epochs' metrics (empty:
// none recorded).
std::vector<EpochMetrics> resumed_history(const std::filesystem::path& path, const train::Checkpoint& checkpoint,
                                          std::int64_t train_examples, std::int64_t steps_per_epoch,
                                          std::int64_t step, std::int64_t epochs_done);

// Whether this process writes the outputs: the one of the mesh's first device.
bool is_main_process(const Mesh& mesh);

}  // namespace pmap::ensemble
