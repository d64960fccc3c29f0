// The parts of the program's run around train::Trainer (run_parts.h).
#include "examples/mnist_ensemble/run_parts.h"
#include "examples/mnist_ensemble/recipe.h"
#include "examples/mnist_ensemble/run_checks.h"

#include <algorithm>
#include <cmath>

#include <pmap/distributed.h>
#include <pmap/error.h>

#include <pmapcc/io/metrics.h>

namespace pmap::ensemble {

TrainConfig resolved_config(TrainConfig c, const Mesh& mesh, const Dataset& fit, const Dataset& test) {
  if (mesh.axes().size() > 2)
    throw ValueError("resolved_config: a mesh of one or two axes, got " + std::to_string(mesh.axes().size()));
  const train::Model model = recipe_model(c, fit);
  c.model = model.name();
  c.architecture = model.architecture();
  const int devices = mesh.size(), along = mesh.axes()[0].size;  // along the mode's axis
  c.devices = devices;
  c.mesh_axis = along;
  c.mesh_model = devices / along;
  c.processes = 1;
  for (const Device& d : mesh.devices()) c.processes = std::max(c.processes, d.process + 1);
  if (c.members == 0) c.members = c.mode == Mode::ensemble ? along : 1;
  c.check(along, fit, test);
  if (!c.dropout.empty() && model.dropout_layers() == 0)
    throw ValueError("--dropout sets the rate of the model's Dropout layers, and " + model.name() + " has none");
  if (c.report_every == 0) c.report_every = c.backend == DeviceKind::cpu ? 1 : 16;
  Schedule& s = c.optimizer.schedule;
  if (s.kind == kernels::ScheduleKind::cosine && s.decay_steps == 0) {
    const std::int64_t steps = steps_per_epoch(fit.count, c.batch_size);
    const std::int64_t run = static_cast<std::int64_t>(c.epochs) * steps;
    if (c.epochs > 0 && run - s.warmup_steps < 1)
      throw ValueError("--lr-schedule " + s.str() + ": --warmup-steps " + std::to_string(s.warmup_steps) +
                       " leaves none of the run's " + std::to_string(run) + " steps (--epochs " +
                       std::to_string(c.epochs) + " x " + std::to_string(steps) + ") for the decay");
    s.decay_steps = std::max<std::int64_t>(1, run - s.warmup_steps);
  }
  return c;
}

EpochMetrics epoch_metrics(const train::EpochReport* report, const train::Evaluation& evaluation,
                           const std::string& evaluated_on, double eval_seconds) {
  EpochMetrics m;
  if (report != nullptr) {
    m.epoch = report->epoch;
    m.train_loss = report->train_loss;
    m.train_accuracy = report->train_accuracy;
    m.seconds = report->seconds;
    m.model_images_per_second = report->images_per_second;
  }
  m.test_loss = evaluation.loss;
  m.member_test_accuracy = evaluation.member_accuracy;
  m.ensemble_test_accuracy = evaluation.ensemble_accuracy;
  m.member_calibration = evaluation.member_calibration;
  m.ensemble_calibration = evaluation.ensemble_calibration;
  m.evaluated_on = evaluated_on;
  m.eval_seconds = eval_seconds;
  return m;
}

std::vector<train::MemberStopping> stopping_records(const train::EarlyStopping& stopping, int members) {
  if (!stopping.members().empty()) return stopping.members();
  return std::vector<train::MemberStopping>(static_cast<std::size_t>(members));
}

io::Json early_stopping_json(const std::vector<train::MemberStopping>& records) {
  io::Json list = io::Json::array();
  for (std::size_t g = 0; g < records.size(); ++g) {
    const train::MemberStopping& s = records[g];
    list.push_back({{"member", static_cast<int>(g)},
                    {"best_epoch", s.best_epoch},
                    {"best_validation_nll",  // none before an epoch was evaluated
                     s.best_epoch > 0 && std::isfinite(s.best_nll) ? io::Json(s.best_nll) : nullptr},
                    {"stopped_epoch", s.stopped_epoch > 0 ? io::Json(s.stopped_epoch) : nullptr}});
  }
  return list;
}

std::map<std::string, std::string> checkpoint_metadata(const TrainConfig& resolved,
                                                       const std::vector<EpochMetrics>& history,
                                                       std::int64_t train_examples) {
  io::Json epochs = io::Json::array();
  for (const EpochMetrics& e : history) epochs.push_back(io::epoch_json(e));
  return {{"config", io::dump_json(resolved.to_json())},
          {"history", io::dump_json(epochs)},
          {"train_examples", std::to_string(train_examples)}};
}

void check_resume(const std::filesystem::path& path, const TrainConfig& resolved) {
  const CheckpointSummary saved = inspect_checkpoint(path);
  // (a program's configuration always records the mode; a Trainer file without one holds only its own)
  if (saved.format == train::kCheckpointFormat && !saved.config.contains("mode")) return;
  check_resumable(path, saved.config, resolved.to_json());
}

std::vector<EpochMetrics> resumed_history(const std::filesystem::path& path, const train::Checkpoint& checkpoint,
                                          std::int64_t train_examples, std::int64_t steps_per_epoch,
                                          std::int64_t step, std::int64_t epochs_done) {
  const auto& meta = checkpoint.metadata;
  if (const auto it = meta.find("train_examples"); it != meta.end() && it->second != std::to_string(train_examples))
    throw DataError(path.string() + ": the checkpoint was trained on " + it->second + " examples, this run has " +
                    std::to_string(train_examples));
  if (step != epochs_done * steps_per_epoch)
    throw DataError(path.string() + ": step " + std::to_string(step) + " does not match " +
                    std::to_string(epochs_done) + " epochs of " + std::to_string(steps_per_epoch) + " steps");
  std::vector<EpochMetrics> history;
  const auto it = meta.find("history");
  if (it == meta.end()) return history;
  const io::Json json = io::parse_json(it->second, path.string() + ": __metadata__.history");
  const io::JsonView view(json, path.string(), "__metadata__.history");
  for (std::size_t i = 0; i < view.size(); ++i) history.push_back(io::epoch_metrics_from_json(view[i]));
  return history;
}

bool is_main_process(const Mesh& mesh) { return mesh.devices()[0].process == distributed::process_index(); }

}  // namespace pmap::ensemble
