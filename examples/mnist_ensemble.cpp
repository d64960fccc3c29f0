// mnist_ensemble: trains an ensemble of MNIST CNNs (one or more members per device, or one model data-
// parallel over the devices) and reports each member's and the ensemble's test accuracy. Under mpirun or
// srun the mesh spans the processes (--devices per process); only the main process prints and writes.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <pmap/distributed.h>

#include "ensemble/cli.h"
#include "ensemble/progress.h"
#include "ensemble/report.h"
#include "ensemble/trainer.h"

using namespace pmap::ensemble;

namespace {

// Checkpoints gather every member from every process; the metrics are the same on every process, and
// only the main one writes them.
void write_outputs(const CliOptions& o, const Trainer& t) {
  if (!o.save.empty()) t.save_checkpoint(o.save);
  if (!t.is_main_process()) return;
  if (!o.metrics_json.empty()) write_metrics_json(o.metrics_json, t.config().to_json(), t.history());
  if (!o.metrics_csv.empty()) write_metrics_csv(o.metrics_csv, t.history());
  if (!o.plot.empty()) write_plot_svg(o.plot, t.history());
}

int run(const CliOptions& o) {
  const Dataset train = load_mnist(o.data, Split::train, o.train.train_limit);
  const Dataset test = load_mnist(o.data, Split::test, o.train.test_limit);
  Trainer trainer(o.train, train, test);
  if (!o.resume.empty()) trainer.load_checkpoint(o.resume);
  const TrainConfig& c = trainer.config();
  const bool main_process = trainer.is_main_process();
  if (main_process) {
    std::printf("pmapcc mnist_ensemble: %d %s member(s) on %s (%d per device), mode %s, %lld train / %lld test images\n",
                trainer.total_members(), "CNN", trainer.mesh().str().c_str(), trainer.members_per_device(),
                std::string(to_string(c.mode)).c_str(), static_cast<long long>(train.count),
                static_cast<long long>(test.count));
    std::printf("%lld parameters per member; epochs %d, batch %d, lr %g, momentum %g, seed %llu%s\n",
                static_cast<long long>(trainer.model().params_per_member()), c.epochs, c.batch_size,
                static_cast<double>(c.learning_rate), static_cast<double>(c.momentum),
                static_cast<unsigned long long>(c.seed),
                o.resume.empty() ? "" : (", resumed after epoch " + std::to_string(trainer.epochs_done())).c_str());
    if (c.cuda_kernels_on_host) std::printf("the CUDA kernels run on the host (--kernels cuda-on-host)\n");
    if (c.processes > 1)
      std::printf("%d processes, %d device(s) each; this process prints and writes the outputs\n", c.processes,
                  trainer.mesh().local_size());
    std::fflush(stdout);
  }
  ProgressBar bar(stdout, main_process ? parse_progress_mode(o.progress) : ProgressMode::none, std::max(1, c.epochs));
  bool ran_epoch = false;
  while (trainer.epochs_done() < c.epochs) {
    ran_epoch = true;
    bar.begin_epoch(trainer.epochs_done() + 1, trainer.steps_per_epoch());
    EpochMetrics m = trainer.run_epoch([&](int step, int, double loss, double ips) { bar.update(step, loss, ips); });
    bar.end_epoch(m);
    write_outputs(o, trainer);
  }
  EpochMetrics last;
  if (trainer.history().empty()) {
    trainer.evaluate(last);  // --epochs 0: evaluate the initial (or resumed) members
  } else {
    last = trainer.history().back();
  }
  // No epoch ran in this invocation (--epochs 0, or a resume already at --epochs): the outputs asked for
  // are still written, of the initial or resumed state (the metrics with the epochs done so far).
  if (!ran_epoch) write_outputs(o, trainer);
  if (main_process) std::printf("\n%s", final_table(last, trainer.members_per_device()).c_str());
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
  try {
    pmap::distributed::initialize();  // joins the other processes under mpirun/srun; nothing otherwise
    return run(options);
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
