// mnist_ensemble: trains an ensemble of MNIST CNNs (one or more members per device, or one model data-
// parallel over the devices) and reports each member's and the ensemble's test accuracy and calibration,
// and at the end the ensemble-size curve; or (--evaluate) evaluates a saved ensemble. Under mpirun or srun
// the mesh spans the processes (--devices per process); only the main process prints and writes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <new>
#include <thread>

#include <pmap/backends.h>
#include <pmap/distributed.h>

#include "cli.h"
#include "progress.h"
#include "report.h"
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/kernels/cpu_backend.h>
#ifdef PMAPCC_HAVE_ONNX
#include <pmapcc/ensemble/onnx/export.h>
#endif

using namespace pmap::ensemble;

namespace {

// Early stopping's outcome per member, for the metrics JSON: [{"member", "best_epoch", "best_validation_nll",
// "stopped_epoch" (null: trained every epoch)}]; null when it is off.
pmap::io::Json early_stopping_json(const Trainer& t) {
  if (t.early_stopping().empty()) return nullptr;
  pmap::io::Json list = pmap::io::Json::array();
  for (std::size_t g = 0; g < t.early_stopping().size(); ++g) {
    const MemberStopping& s = t.early_stopping()[g];
    list.push_back({{"member", static_cast<int>(g)},
                    {"best_epoch", s.best_epoch},
                    {"best_validation_nll", std::isfinite(s.best_nll) ? pmap::io::Json(s.best_nll) : nullptr},
                    {"stopped_epoch", s.stopped_epoch > 0 ? pmap::io::Json(s.stopped_epoch) : nullptr}});
  }
  return list;
}

// Checkpoints gather every member from every process; the metrics are the same on every process, and
// only the main one writes them. `final_test`: the test set's evaluation at the end of a run whose epochs
// were evaluated on a validation set (the metrics JSON's "final").
void write_outputs(const CliOptions& o, const Trainer& t, const EnsembleReport* report,
                   const EpochMetrics* final_test = nullptr) {
  if (!o.save.empty()) t.save_checkpoint(o.save);
  if (!t.is_main_process()) return;
  const std::vector<SizePoint> curve = report == nullptr ? std::vector<SizePoint>{} : report->size_curve;
  pmap::io::Json extra = pmap::io::Json::object();
  if (final_test != nullptr) extra["final"] = pmap::io::epoch_json(*final_test);
  if (!t.early_stopping().empty()) extra["early_stopping"] = early_stopping_json(t);
  if (!o.metrics_json.empty()) write_metrics_json(o.metrics_json, t.config().to_json(), t.history(), curve, extra);
  if (!o.metrics_csv.empty()) write_metrics_csv(o.metrics_csv, t.history());
  if (!o.plot.empty()) write_plot_svg(o.plot, t.history(), PlotExtras{dataset_title(t.config().dataset), curve});
  if (!o.predict.empty() && report != nullptr) write_predictions_csv(o.predict, report->predictions);
}

// --export-onnx: the trainer's members as one ensemble graph, or --export-member's member alone, with the
// recipe and the test accuracy and NLL of the evaluation `m` in the file's metadata. `members` are the
// members' own indices (their checkpoint's, with --members-subset; empty: 0, 1, ...). Collective (every
// process gathers the members); the main process writes.
void export_onnx(const CliOptions& o, const Trainer& t, const EpochMetrics& m, const std::vector<int>& members) {
#ifdef PMAPCC_HAVE_ONNX
  const std::vector<float> params = t.params(), state = t.model_state();
  if (!t.is_main_process()) return;
  const TrainConfig& c = t.config();
  auto index_of = [&](int i) { return members.empty() ? i : members[static_cast<std::size_t>(i)]; };
  int position = -1;  // --export-member's place among the trainer's members
  for (int i = 0; i < t.total_members() && o.export_member >= 0; ++i)
    if (index_of(i) == o.export_member) position = i;
  if (o.export_member >= 0 && position < 0)
    throw pmap::ValueError("--export-member " + std::to_string(o.export_member) + ": no such member among the " +
                           std::to_string(t.total_members()) + (members.empty() ? "" : " evaluated") + " members");
  std::string list;
  for (int i = 0; i < t.total_members(); ++i) list += (i ? "," : "") + std::to_string(index_of(i));
  onnx::ExportInfo info;
  info.metadata = {{"model", c.model},
                   {"recipe", pmap::io::dump_json(c.to_json())},
                   {"dataset", c.dataset},
                   {"seed", std::to_string(c.seed)},
                   {"members", o.export_member >= 0 ? std::to_string(o.export_member) : list},
                   {"input", "images (N, 28, 28, 1) f32: pixel / 255, channels last"}};
  const bool member = o.export_member >= 0;
  char acc[32], nll[32];
  const auto p = static_cast<std::size_t>(position);
  std::snprintf(acc, sizeof acc, "%.6f", member ? m.member_test_accuracy.at(p) : m.ensemble_test_accuracy);
  std::snprintf(nll, sizeof nll, "%.6f", member ? m.member_calibration.at(p).nll : m.ensemble_calibration.nll);
  info.metadata["test_accuracy"] = acc;
  info.metadata["test_nll"] = nll;
  info.doc = member ? "member " + std::to_string(o.export_member) + " of a pmapcc " + c.model + " ensemble"
                    : "a pmapcc ensemble of " + std::to_string(t.total_members()) + " " + c.model +
                          " members: the mean of their softmax probabilities";
  const onnx::TrainedMembers trained{t.model(), params, state, t.total_members()};
  if (member) {
    onnx::export_member(trained, position, o.export_onnx, info);
  } else {
    onnx::export_ensemble(trained, o.export_onnx, info);
  }
#else
  (void)o, (void)t, (void)m, (void)members;  // parse_cli refuses --export-onnx in such a build
#endif
}

void print_exported(const CliOptions& o) {
  if (o.export_onnx.empty()) return;
  const std::string what = o.export_member >= 0 ? "member " + std::to_string(o.export_member) : "the ensemble";
  std::printf("\nONNX: %s written to %s\n", what.c_str(), o.export_onnx.c_str());
}

void print_header(const Trainer& t, std::int64_t train_count, std::int64_t test_count, const std::string& what) {
  const TrainConfig& c = t.config();
  const std::int64_t validation = train_count > 0 ? t.validation_data().count : 0;
  const std::string images = (train_count > 0 ? std::to_string(train_count) + " train / " : std::string()) +
                             (validation > 0 ? std::to_string(validation) + " validation / " : std::string()) +
                             std::to_string(test_count) + " test images";
  std::printf("pmapcc mnist_ensemble: %s: %d CNN member(s) on %s (%d per device), mode %s, %s, %s\n", what.c_str(),
              t.total_members(), t.mesh().str().c_str(), t.members_per_device(), std::string(to_string(c.mode)).c_str(),
              dataset_title(c.dataset).c_str(), images.c_str());
  if (train_count > 0)
    std::printf("%s, %lld parameters per member; epochs %d, batch %d, %s, seed %llu\n", c.model.c_str(),
                static_cast<long long>(t.model().params_per_member()), c.epochs, c.batch_size,
                c.optimizer.str().c_str(), static_cast<unsigned long long>(c.seed));
  if (const ShardingPlan* plan = t.plan()) {
    std::string split;
    for (const ShardedTensor& w : plan->tensors())
      if (!w.spec.replicated()) split += (split.empty() ? "" : ", ") + w.name + " " + w.spec.str();
    std::printf("weights split over 'model': %s; the rest replicated: %lld of %lld weights per device\n",
                split.empty() ? "none" : split.c_str(), static_cast<long long>(plan->local_params()),
                static_cast<long long>(plan->full_params()));
  }
  if (c.cuda_kernels_on_host) std::printf("the CUDA kernels run on the host (--kernels cuda-on-host)\n");
  if (c.processes > 1)
    std::printf("%d processes, %d device(s) each; this process prints and writes the outputs\n", c.processes,
                t.mesh().local_size());
  std::fflush(stdout);
}

// The members early stopping stopped after `epoch`, each with its best epoch.
void print_stopped(const Trainer& t, int epoch) {
  for (std::size_t g = 0; g < t.early_stopping().size(); ++g) {
    const MemberStopping& s = t.early_stopping()[g];
    if (s.stopped_epoch != epoch) continue;
    std::printf("early stopping: member %zu stopped after epoch %d, %d epoch(s) without a better validation NLL; "
                "back to epoch %d's parameters (NLL %.4f)\n",
                g, epoch, t.config().patience, s.best_epoch, s.best_nll);
  }
  if (t.all_stopped()) std::printf("early stopping: every member has stopped\n");
  std::fflush(stdout);
}

// Early stopping's outcome: each member's best epoch, and when it stopped.
void print_early_stopping(const Trainer& t) {
  if (t.early_stopping().empty()) return;
  std::printf("\nearly stopping (patience %d, on the validation NLL): each member keeps its best epoch\n",
              t.config().patience);
  for (std::size_t g = 0; g < t.early_stopping().size(); ++g) {
    const MemberStopping& s = t.early_stopping()[g];
    const std::string end = s.stopped_epoch > 0 ? "stopped after epoch " + std::to_string(s.stopped_epoch)
                                                : "trained every epoch";
    std::printf("  member %zu: best epoch %d (validation NLL %.4f), %s\n", g, s.best_epoch, s.best_nll, end.c_str());
  }
}

void print_size_curve(const std::vector<SizePoint>& curve) {
  if (curve.size() < 2) return;
  std::printf("\nensemble of the first k members:\n       k  test accuracy      NLL      ECE\n");
  for (const SizePoint& p : curve)
    std::printf("%8d  %11.2f %%  %7.4f  %7.4f\n", p.members, 100 * p.accuracy, p.calibration.nll, p.calibration.ece);
}

// --cpu-threads (kernels/cpu_backend.h's cpu::set_threads): auto gives each of this process's CPU devices
// its share of the cores; without the flag a set PMAPCC_CPU_THREADS stands. Results are the same bits either
// way; only the speed differs.
void apply_cpu_threads(const CliOptions& o, const Trainer& t) {
  if (t.config().backend != pmap::DeviceKind::cpu || t.config().cuda_kernels_on_host) return;
  pmap::kernels::cpu::share_cores(t.mesh().local_size(), o.cpu_threads);
}

int run_training(const CliOptions& o) {
  const Dataset train = load_mnist(o.data, Split::train, o.train.train_limit);
  const Dataset test = load_mnist(o.data, Split::test, o.train.test_limit);
  Trainer trainer(o.train, train, test);
  apply_cpu_threads(o, trainer);
  if (!o.resume.empty()) trainer.load_checkpoint(o.resume);
  const TrainConfig& c = trainer.config();
  const bool main_process = trainer.is_main_process();
#ifdef PMAPCC_HAVE_ONNX
  if (!o.export_onnx.empty()) onnx::check_exportable(trainer.model());  // before the run, not after it
  if (o.export_member >= trainer.total_members())
    throw pmap::ValueError("--export-member " + std::to_string(o.export_member) + ": no such member among the " +
                           std::to_string(trainer.total_members()) + " members");
#endif
  if (main_process)
    print_header(trainer, trainer.train_data().count, test.count,
                 o.resume.empty() ? "training" : "resumed after epoch " + std::to_string(trainer.epochs_done()));
  if (main_process && !o.no_summary) std::printf("\n%s\n", trainer.model().summary().c_str());
  ProgressBar bar(stdout, main_process ? parse_progress_mode(o.progress) : ProgressMode::none, std::max(1, c.epochs));
  while (trainer.epochs_done() < c.epochs && !trainer.all_stopped()) {
    bar.begin_epoch(trainer.epochs_done() + 1, trainer.steps_per_epoch());
    EpochMetrics m =
        trainer.run_epoch(
            [&](const StepReport& r) { bar.update(r.step, r.running_loss, r.images_per_second, r.running_accuracy); },
            [&] { bar.evaluating(trainer.validation_data().count > 0 ? "validation" : "test"); });
    bar.end_epoch(m);
    if (main_process) print_stopped(trainer, m.epoch);
    if (trainer.epochs_done() < c.epochs && !trainer.all_stopped()) write_outputs(o, trainer, nullptr);
  }
  // The final evaluation on the test set (without a validation set: the last epoch's, again, with the size
  // curve and per-image results; or, with no epoch run, of the initial or resumed members), and every
  // output asked for.
  EpochMetrics last;
  const bool validated = trainer.validation_data().count > 0;
  if (main_process && validated) {
    std::printf("\nevaluating on the %lld test images%s\n", static_cast<long long>(test.count),
                trainer.early_stopping().empty() ? "" : " (every member at its best epoch)");
    std::fflush(stdout);
  }
  const EnsembleReport report = trainer.evaluate_report(last);
  if (!trainer.history().empty()) {
    const EpochMetrics& back = trainer.history().back();
    if (validated) {  // the test set's numbers, with the last epoch's training figures
      last.epoch = back.epoch;
      last.train_loss = back.train_loss;
      last.train_accuracy = back.train_accuracy;
      last.seconds = back.seconds;
      last.model_images_per_second = back.model_images_per_second;
    } else {
      last = back;
    }
  }
  write_outputs(o, trainer, &report, validated ? &last : nullptr);
  if (main_process) {
    std::printf("\n%s", final_table(last, trainer.members_per_device()).c_str());
    print_size_curve(report.size_curve);
    print_early_stopping(trainer);
  }
  if (!o.export_onnx.empty()) export_onnx(o, trainer, last, {});
  if (main_process) print_exported(o);
  return 0;
}

int run_evaluation(const CliOptions& o) {
  const Dataset test = load_mnist(o.data, Split::test, o.train.test_limit);
  const CheckpointSummary saved = inspect_checkpoint(o.evaluate);
  TrainConfig c = o.train;
  c.members = o.members_subset.empty() ? saved.members : static_cast<int>(o.members_subset.size());
  c.mode = Mode::ensemble;
  c.epochs = 0;
  // Without --devices (or --mesh) in one process: the default device count, or the largest below it that
  // divides the members (a one-member checkpoint on a two-core machine evaluates on one device).
  if (c.devices == 0 && c.mesh_axis == 0 && pmap::distributed::process_count() == 1) {
    int n = 0;
    try {
      n = static_cast<int>(pmap::local_devices(c.backend, -1).size());
    } catch (const pmap::Error&) {  // (no GPU: the Trainer says so)
    }
    const int all = n;
    while (n > 1 && c.members % n != 0) --n;
    if (n < all)
      std::printf("evaluating on %d of the %d devices: the %d member(s) do not divide over %d\n", n, all, c.members, all);
    c.devices = n;
  }
  // The checkpoint's model (before models were recorded: the Flax CNN, the only one), if the program knows it.
  if (const auto model = saved.config.find("model"); model != saved.config.end() && model->is_string()) {
    const auto names = model_names();
    if (std::find(names.begin(), names.end(), model->get<std::string>()) == names.end())
      throw pmap::DataError(o.evaluate.string() + ": its model '" + model->get<std::string>() +
                      "' is not one this program builds (--model)");
    c.model = model->get<std::string>();
  }
  // Evaluated in the pieces the run was trained with, so a CPU evaluation gives that run's own numbers.
  if (const auto batch = saved.config.find("batch_size"); batch != saved.config.end() && batch->is_number_integer())
    c.batch_size = batch->get<int>();
  Trainer trainer(c, test, test);  // trains nothing: the test set stands in for the training set
  apply_cpu_threads(o, trainer);
  trainer.load_members(o.evaluate, o.members_subset);
  if (o.summary && trainer.is_main_process()) std::printf("%s\n", trainer.model().summary().c_str());
  EpochMetrics m;
  m.epoch = saved.epochs_done;
  const EnsembleReport report = trainer.evaluate_report(m);
  // Nothing was trained: no train loss or accuracy (null in the JSON, left out of the plot), not 0.
  m.train_loss = m.train_accuracy = std::numeric_limits<double>::quiet_NaN();
  if (!o.export_onnx.empty()) export_onnx(o, trainer, m, o.members_subset);  // collective
  if (!trainer.is_main_process()) return 0;
  print_header(trainer, 0, test.count, "evaluating " + o.evaluate.string() + " (epoch " + std::to_string(m.epoch) + ")");
  std::printf("\n%s", final_table(m, trainer.members_per_device(), o.members_subset).c_str());
  print_size_curve(report.size_curve);
  if (!o.metrics_json.empty()) {
    const pmap::io::Json doc = {{"config", trainer.config().to_json()},
                                {"checkpoint", o.evaluate.string()},
                                {"members_subset", o.members_subset},
                                {"evaluation", pmap::io::epoch_json(m)},
                                {"ensemble_size_curve", pmap::io::size_curve_json(report.size_curve)}};
    write_text_file_atomic(o.metrics_json, pmap::io::dump_json(doc, 2) + "\n");
  }
  if (!o.plot.empty()) write_plot_svg(o.plot, {m}, PlotExtras{dataset_title(c.dataset), report.size_curve});
  if (!o.predict.empty()) write_predictions_csv(o.predict, report.predictions, o.members_subset);
  print_exported(o);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CliOptions options;
  try {
    options = parse_cli(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "mnist_ensemble: %s (see --help)\n", e.what());
    return 2;
  }
  if (options.help) {
    std::fputs(cli_help("mnist_ensemble").c_str(), stdout);
    return 0;
  }
  if (options.version) {
    const pmap::BuildInfo b = pmap::build_info();
    std::printf("mnist_ensemble (pmapcc %s): CUDA %s, NCCL %s, MPI %s\n", PMAPCC_VERSION, b.cuda ? "on" : "off",
                b.nccl ? "on" : "off", b.mpi ? "on" : "off");
    return 0;
  }
  try {
    pmap::distributed::initialize();  // joins the other processes under mpirun/srun; nothing otherwise
    // Only the main process writes the outputs: it checks their paths before anything is read or trained.
    if (pmap::distributed::process_index() == 0) {
      try {
        check_output_paths(options);
      } catch (const UsageError& e) {
        if (pmap::distributed::process_count() > 1) throw;
        std::fprintf(stderr, "mnist_ensemble: %s\n", e.what());
        return 2;
      }
    }
    return options.evaluate.empty() ? run_training(options) : run_evaluation(options);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mnist_ensemble: error: out of memory: the run needs more memory than is available "
                         "(fewer --members or --devices, a smaller --batch-size)\n");
    return 1;
  } catch (const std::exception& e) {
    if (pmap::distributed::process_count() > 1) {
      std::fprintf(stderr, "mnist_ensemble: process %d: error: %s\n", pmap::distributed::process_index(), e.what());
      // Leave without finalizing MPI, which could wait for the other processes: the launcher ends the
      // job, or they raise in their next collective (the process timeout).
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);
    }
    std::fprintf(stderr, "mnist_ensemble: error: %s\n", e.what());
    return 1;
  }
}
