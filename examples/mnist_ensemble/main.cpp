// mnist_ensemble: trains an ensemble of MNIST CNNs (one or more members per device, or one model data-
// parallel over the devices) and reports each member's and the ensemble's test accuracy and calibration,
// and at the end the ensemble-size curve; or (--evaluate) evaluates a saved ensemble. Under mpirun or srun
// the mesh spans the processes (--devices per process); only the main process prints and writes.
// train::Trainer runs the members, made from the flags by recipe.h, with run_parts.h's pieces around it; a run
// that splits weights over 'model' (--mode model-parallel, --mesh AxM with M > 1) is the Trainer's too, its
// parameters sharded by --layout (recipe_sharding) on a mesh of two axes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <pmap/backends.h>
#include <pmap/distributed.h>

#include "cli.h"
#include "progress.h"
#include "recipe.h"
#include "report.h"
#include "run_checks.h"
#include "run_parts.h"
#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cpu_backend.h>
#include <pmapcc/train/data.h>
#include <pmapcc/train/early_stopping.h>
#include <pmapcc/train/trainer.h>
#ifdef PMAPCC_HAVE_ONNX
#include <pmapcc/export/onnx/export.h>
#endif

using namespace pmap::ensemble;

namespace {

using Clock = std::chrono::steady_clock;

// What the outputs need of a run.
struct RunView {
  const TrainConfig* config = nullptr;  // as the run resolved it
  const pmap::Mesh* mesh = nullptr;
  int members_per_device = 1;
  int members = 1;
  std::int64_t params_per_member = 0;
  const RecipeSharding* split = nullptr;  // how --layout splits the weights, when it does; else nullptr
  std::int64_t validation_examples = 0;
  const std::vector<EpochMetrics>* history = nullptr;
  std::vector<pmap::train::MemberStopping> stopping;  // empty: early stopping is off
  bool main_process = true;
};

bool all_stopped(const RunView& v) {
  return !v.stopping.empty() && std::all_of(v.stopping.begin(), v.stopping.end(),
                                            [](const pmap::train::MemberStopping& s) { return s.stopped_epoch > 0; });
}

// The metrics are the same on every process, and only the main one writes them (checkpoints: `save`, which
// every process calls, gathers every member). `final_test`: the test set's evaluation at the end of a run whose
// epochs were evaluated on a validation set (the metrics JSON's "final").
void write_outputs(const CliOptions& o, const RunView& v, const std::function<void()>& save,
                   const EnsembleReport* report, const EpochMetrics* final_test = nullptr) {
  if (!o.save.empty()) save();
  if (!v.main_process) return;
  const std::vector<SizePoint> curve = report == nullptr ? std::vector<SizePoint>{} : report->size_curve;
  pmap::io::Json extra = pmap::io::Json::object();
  if (final_test != nullptr) extra["final"] = pmap::io::epoch_json(*final_test);
  if (!v.stopping.empty()) extra["early_stopping"] = early_stopping_json(v.stopping);
  const TrainConfig& c = *v.config;
  if (!o.metrics_json.empty()) write_metrics_json(o.metrics_json, c.to_json(), *v.history, curve, extra);
  if (!o.metrics_csv.empty()) write_metrics_csv(o.metrics_csv, *v.history);
  if (!o.plot.empty()) write_plot_svg(o.plot, *v.history, PlotExtras{dataset_title(c.dataset), curve});
  if (!o.predict.empty() && report != nullptr) write_predictions_csv(o.predict, report->predictions);
}

// --export-onnx: the members (`params` and `state`: tensors (members, ...) as train::Trainer::params() gives them,
// of `model`) as one ensemble graph, or --export-member's member alone, with the recipe and the test accuracy and
// NLL of the evaluation `m` in the file's metadata. `members` are the members' own indices (their checkpoint's,
// with --members-subset; empty: 0, 1, ...). The main process writes.
void export_onnx(const CliOptions& o, const RunView& v, const pmap::train::Model& model,
                 const pmap::train::Variables& params, const pmap::train::Variables& state, const EpochMetrics& m,
                 const std::vector<int>& members) {
#ifdef PMAPCC_HAVE_ONNX
  if (!v.main_process) return;
  const TrainConfig& c = *v.config;
  auto index_of = [&](int i) { return members.empty() ? i : members[static_cast<std::size_t>(i)]; };
  int position = -1;  // --export-member's place among the run's members
  for (int i = 0; i < v.members && o.export_member >= 0; ++i)
    if (index_of(i) == o.export_member) position = i;
  if (o.export_member >= 0 && position < 0)
    throw pmap::ValueError("--export-member " + std::to_string(o.export_member) + ": no such member among the " +
                           std::to_string(v.members) + (members.empty() ? "" : " evaluated") + " members");
  std::string list;
  for (int i = 0; i < v.members; ++i) list += (i ? "," : "") + std::to_string(index_of(i));
  pmap::onnx::ExportInfo info;
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
                    : "a pmapcc ensemble of " + std::to_string(v.members) + " " + c.model +
                          " members: the mean of their softmax probabilities";
  const pmap::onnx::Network network = pmap::onnx::network_of(model);
  const std::vector<pmap::train::Variables> all = pmap::onnx::members_of(model, params, state);
  if (member) {
    pmap::onnx::export_member(network, all.at(p), o.export_onnx, info);
  } else {
    pmap::onnx::export_ensemble(network, all, o.export_onnx, info);
  }
#else
  (void)o, (void)v, (void)model, (void)params, (void)state, (void)m, (void)members;  // parse_cli refuses the flag
#endif
}

// Before a run: its model can be exported (recorded on a member drawn as the run would; not found out after
// the run) and --export-member names one of its members.
void check_export(const CliOptions& o, const pmap::train::Model& model, int members) {
#ifdef PMAPCC_HAVE_ONNX
  if (!o.export_onnx.empty()) {
    auto [params, state] = model.init(pmap::key(0));
    pmap::train::Variables member;
    for (auto& [name, tensor] : params) member.emplace("params/" + name, std::move(tensor));
    for (auto& [name, tensor] : state) member.emplace("state/" + name, std::move(tensor));
    pmap::onnx::check_exportable(pmap::onnx::network_of(model), member);
  }
  if (o.export_member >= members)
    throw pmap::ValueError("--export-member " + std::to_string(o.export_member) + ": no such member among the " +
                           std::to_string(members) + " members");
#else
  (void)o, (void)model, (void)members;
#endif
}

void print_exported(const CliOptions& o) {
  if (o.export_onnx.empty()) return;
  const std::string what = o.export_member >= 0 ? "member " + std::to_string(o.export_member) : "the ensemble";
  std::printf("\nONNX: %s written to %s\n", what.c_str(), o.export_onnx.c_str());
}

void print_header(const RunView& v, std::int64_t train_count, std::int64_t test_count, const std::string& what) {
  const TrainConfig& c = *v.config;
  const std::int64_t validation = train_count > 0 ? v.validation_examples : 0;
  const std::string images = (train_count > 0 ? std::to_string(train_count) + " train / " : std::string()) +
                             (validation > 0 ? std::to_string(validation) + " validation / " : std::string()) +
                             std::to_string(test_count) + " test images";
  std::printf("pmapcc mnist_ensemble: %s: %d CNN member(s) on %s (%d per device), mode %s, %s, %s\n", what.c_str(),
              v.members, v.mesh->str().c_str(), v.members_per_device, std::string(to_string(c.mode)).c_str(),
              dataset_title(c.dataset).c_str(), images.c_str());
  if (train_count > 0)
    std::printf("%s, %lld parameters per member; epochs %d, batch %d, %s, seed %llu\n", c.model.c_str(),
                static_cast<long long>(v.params_per_member), c.epochs, c.batch_size, c.optimizer.str().c_str(),
                static_cast<unsigned long long>(c.seed));
  if (const RecipeSharding* split = v.split)
    std::printf("weights split over 'model': %s; the rest replicated: %lld of %lld weights per device\n",
                split->split.empty() ? "none" : split->split.c_str(), static_cast<long long>(split->local_params),
                static_cast<long long>(split->full_params));
  if (c.cuda_kernels_on_host) std::printf("the CUDA kernels run on the host (--kernels cuda-on-host)\n");
  if (c.processes > 1)
    std::printf("%d processes, %d device(s) each; this process prints and writes the outputs\n", c.processes,
                v.mesh->local_size());
  std::fflush(stdout);
}

// The members early stopping stopped after `epoch`, each with its best epoch.
void print_stopped(const RunView& v, int epoch) {
  for (std::size_t g = 0; g < v.stopping.size(); ++g) {
    const pmap::train::MemberStopping& s = v.stopping[g];
    if (s.stopped_epoch != epoch) continue;
    std::printf("early stopping: member %zu stopped after epoch %d, %d epoch(s) without a better validation NLL; "
                "back to epoch %d's parameters (NLL %.4f)\n",
                g, epoch, v.config->patience, s.best_epoch, s.best_nll);
  }
  if (all_stopped(v)) std::printf("early stopping: every member has stopped\n");
  std::fflush(stdout);
}

// Early stopping's outcome: each member's best epoch, and when it stopped.
void print_early_stopping(const RunView& v) {
  if (v.stopping.empty()) return;
  std::printf("\nearly stopping (patience %d, on the validation NLL): each member keeps its best epoch\n",
              v.config->patience);
  for (std::size_t g = 0; g < v.stopping.size(); ++g) {
    const pmap::train::MemberStopping& s = v.stopping[g];
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

// The final evaluation's numbers (`evaluated`: of the test set) as the table and the metrics show them: after
// epochs evaluated on the test set, the last epoch's own; after epochs evaluated on a validation set, the test
// set's with the last epoch's training figures; with no epoch run, the initial or resumed members'.
EpochMetrics final_metrics(const EpochMetrics& evaluated, const std::vector<EpochMetrics>& history, bool validated) {
  if (history.empty()) return evaluated;
  const EpochMetrics& back = history.back();
  if (!validated) return back;
  EpochMetrics last = evaluated;
  last.epoch = back.epoch;
  last.train_loss = back.train_loss;
  last.train_accuracy = back.train_accuracy;
  last.seconds = back.seconds;
  last.model_images_per_second = back.model_images_per_second;
  return last;
}

void print_final(const RunView& v, const EpochMetrics& last, const EnsembleReport& report) {
  std::printf("\n%s", final_table(last, v.members_per_device).c_str());
  print_size_curve(report.size_curve);
  print_early_stopping(v);
}

void print_evaluating_test(const RunView& v, std::int64_t test_count) {
  std::printf("\nevaluating on the %lld test images%s\n", static_cast<long long>(test_count),
              v.stopping.empty() ? "" : " (every member at its best epoch)");
  std::fflush(stdout);
}

// --cpu-threads (kernels/cpu_backend.h's cpu::share_cores): auto gives each of this process's CPU devices its
// share of the cores; without the flag a set PMAPCC_CPU_THREADS stands. Results are the same bits either way;
// only the speed differs.
void apply_cpu_threads(const CliOptions& o, const TrainConfig& c, const pmap::Mesh& mesh) {
  if (c.backend != pmap::DeviceKind::cpu || c.cuda_kernels_on_host) return;
  pmap::kernels::cpu::share_cores(mesh.local_size(), o.cpu_threads);
}

// The Trainer's options for the resolved run `r`: the recipe's, the layout's sharding, and the CUDA kernels on the
// host (--kernels cuda-on-host).
pmap::train::TrainerOptions trainer_options(const TrainConfig& r, const RecipeSharding& split) {
  pmap::train::TrainerOptions options = recipe_options(r, r.members);
  options.sharding = split.sharding;
  if (r.cuda_kernels_on_host) options.cpu_backend = &pmap::kernels::cuda_backend_on_host();
  return options;
}

// What a run is made from, before its Trainer: the flags resolved on `mesh` for the data, the model and how
// --layout splits it, checked against the machine's memory and the other processes, the CPU threads shared out.
struct Prepared {
  TrainConfig config;
  pmap::train::Model model;
  RecipeSharding split;
};

Prepared prepare(const CliOptions& o, const TrainConfig& c, const pmap::Mesh& mesh, const Dataset& fit,
                 const Dataset& test) {
  TrainConfig r = resolved_config(c, mesh, fit, test);
  pmap::train::Model model = recipe_model(r, fit);
  RecipeSharding split = recipe_sharding(r, model, mesh.axes());
  check_memory(r, r.mesh_axis, split.local_params, 2 + r.optimizer.slots());
  if (r.processes > 1) check_processes_agree(mesh, r.to_json(), fit, test);
  apply_cpu_threads(o, r, mesh);
  return {std::move(r), std::move(model), std::move(split)};
}

// train::Trainer trains the members from the recipe of the flags: on a mesh of one axis, or of two when weights
// are split over 'model'.
int run_training(const CliOptions& o) {
  const Dataset train = load_mnist(o.data, Split::train, o.train.train_limit);
  const Dataset test = load_mnist(o.data, Split::test, o.train.test_limit);
  TrainConfig c = o.train;
  // The validation set, held out of the training set with the data key.
  if (!(c.validation_split >= 0 && c.validation_split < 1))
    throw pmap::ValueError("--validation-split must be in [0, 1), got " + pmap::io::dump_json(c.validation_split));
  Dataset fit = train, validation;
  if (c.validation_split > 0)
    std::tie(fit, validation) =
        pmap::train::split_validation(train, c.validation_split, pmap::train::validation_key(c.seed));
  pmap::Mesh mesh = build_mesh(c);
  Prepared p = prepare(o, c, mesh, fit, test);
  const TrainConfig& r = p.config;
  const RecipeSharding& split = p.split;
  const std::int64_t steps = pmap::train::steps_per_epoch(fit.count, r.batch_size);
  pmap::train::Trainer trainer(std::move(p.model), recipe_optimizer(r.optimizer, r.members, r.epochs * steps),
                               std::move(mesh), trainer_options(r, split));
  std::optional<pmap::train::EarlyStopping> stop;
  if (r.patience > 0) stop.emplace(r.patience);
  std::vector<EpochMetrics> history;
  if (!o.resume.empty()) {
    check_resume(o.resume, r);
    const pmap::train::Checkpoint ck = trainer.load(o.resume, {"best/"});
    history = resumed_history(o.resume, ck, fit.count, steps, trainer.step(), trainer.epochs_done());
    if (stop) stop->restore(ck, trainer, o.resume.string());
  }
  auto view = [&] {
    return RunView{&r, &trainer.mesh(), trainer.members_per_device(), r.members, split.full_params,
                   r.splits_weights() ? &split : nullptr, validation.count, &history,
                   stop ? stopping_records(*stop, r.members) : std::vector<pmap::train::MemberStopping>{},
                   is_main_process(trainer.mesh())};
  };
  const auto save = [&] {
    std::map<std::string, std::string> metadata = checkpoint_metadata(r, history, fit.count);
    pmap::train::Variables tensors;
    if (stop) stop->save_to(metadata, tensors);
    trainer.save(o.save, metadata, tensors);
  };
  const bool main_process = view().main_process;
  check_export(o, trainer.model(), r.members);
  if (main_process)
    print_header(view(), fit.count, test.count,
                 o.resume.empty() ? "training" : "resumed after epoch " + std::to_string(trainer.epochs_done()));
  if (main_process && !o.no_summary) std::printf("\n%s\n", trainer.model().summary().c_str());
  ProgressBar bar(stdout, main_process ? parse_progress_mode(o.progress) : ProgressMode::none, std::max(1, r.epochs));
  const bool validated = validation.count > 0;
  auto running = [&] { return trainer.epochs_done() < r.epochs && !(stop && stop->all_stopped()); };
  while (running()) {
    bar.begin_epoch(trainer.epochs_done() + 1, static_cast<int>(steps));
    const pmap::train::EpochReport epoch = trainer.run_epoch(fit, [&](const pmap::train::StepReport& s) {
      bar.update(s.step, s.running_loss, s.images_per_second, s.running_accuracy);
    });
    bar.evaluating(validated ? "validation" : "test");
    const auto t0 = Clock::now();  // eval_seconds: early stopping's bookkeeping included
    const pmap::train::Evaluation evaluation = stop                ? stop->end_epoch(trainer, validation)
                                               : validated         ? trainer.evaluate(validation)
                                                                   : trainer.evaluate(test);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    history.push_back(epoch_metrics(&epoch, evaluation, validated ? "validation" : "test", seconds));
    bar.end_epoch(history.back());
    if (main_process) print_stopped(view(), history.back().epoch);
    if (running()) write_outputs(o, view(), save, nullptr);
  }
  if (stop) stop->restore_best(trainer);  // the run is over: every member at its best epoch
  if (main_process && validated) print_evaluating_test(view(), test.count);
  const pmap::train::Evaluation evaluation = trainer.evaluate(test, {.size_curve = true, .predictions = true});
  const EnsembleReport report{evaluation.size_curve, evaluation.predictions};
  const EpochMetrics last = final_metrics(epoch_metrics(nullptr, evaluation), history, validated);
  write_outputs(o, view(), save, &report, validated ? &last : nullptr);
  if (main_process) print_final(view(), last, report);
  if (!o.export_onnx.empty())
    export_onnx(o, view(), trainer.model(), trainer.params(), trainer.model_state(), last, {});
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
    } catch (const pmap::Error&) {  // (no GPU: building the mesh says so)
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
  // The run's recorded batch (the data-parallel blocks it was trained in).
  if (const auto batch = saved.config.find("batch_size"); batch != saved.config.end() && batch->is_number_integer())
    c.batch_size = batch->get<int>();
  EpochMetrics m;
  EnsembleReport report;
  const std::vector<EpochMetrics> no_history;
  pmap::Mesh mesh = build_mesh(c);  // --mesh AxM with M > 1: the members' weights split over 'model' by --layout
  Prepared p = prepare(o, c, mesh, test, test);
  const TrainConfig& r = p.config;
  const RecipeSharding& split = p.split;
  pmap::train::Trainer trainer(std::move(p.model), recipe_optimizer(r.optimizer, r.members, 0), std::move(mesh),
                               trainer_options(r, split));
  if (saved.config.contains("architecture"))  // before it was recorded: the flax CNN, whose tensors are checked
    check_architecture(o.evaluate, saved.config.at("architecture"), r.to_json().at("architecture"));
  check_member_subset(o.members_subset, saved.members, o.evaluate);
  const pmap::train::SavedMembers s = pmap::train::read_members(o.evaluate, trainer.model(), o.members_subset);
  std::vector<int> all(static_cast<std::size_t>(r.members));
  for (int g = 0; g < r.members; ++g) all[static_cast<std::size_t>(g)] = g;
  trainer.set_members(s.params, s.state, all);
  const pmap::train::Evaluation e = trainer.evaluate(test, {.size_curve = true, .predictions = true});
  m = epoch_metrics(nullptr, e);
  report = EnsembleReport{e.size_curve, e.predictions};
  const RunView v{&r, &trainer.mesh(), trainer.members_per_device(), r.members, split.full_params,
                  r.splits_weights() ? &split : nullptr, 0, &no_history, {}, is_main_process(trainer.mesh())};
  if (o.summary && v.main_process)
    std::printf("%s\n", trainer.model().summary().c_str());
  m.epoch = saved.epochs_done;
  // Nothing was trained: no train loss or accuracy (null in the JSON, left out of the plot), not 0.
  m.train_loss = m.train_accuracy = std::numeric_limits<double>::quiet_NaN();
  if (!o.export_onnx.empty())  // collective: every process gathers the members
    export_onnx(o, v, trainer.model(), trainer.params(), trainer.model_state(), m, o.members_subset);
  if (!v.main_process) return 0;
  print_header(v, 0, test.count, "evaluating " + o.evaluate.string() + " (epoch " + std::to_string(m.epoch) + ")");
  std::printf("\n%s", final_table(m, v.members_per_device, o.members_subset).c_str());
  print_size_curve(report.size_curve);
  if (!o.metrics_json.empty()) {
    const pmap::io::Json doc = {{"config", v.config->to_json()},
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
