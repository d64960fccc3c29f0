// train::Trainer over a mesh that spans the processes: an ensemble and a data-parallel model trained for an
// epoch and evaluated give, on every process, the numbers of one process with as many CPU devices, bit for
// bit (the per-step losses, the evaluation and its size curve, and the parameters).
#include <cstdio>
#include <cstring>
#include <vector>

#include <pmap/distributed.h>
#include <pmap/pmap.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "../synthetic.h"
#include "mpi_test_support.h"

namespace {

namespace train = pmap::train;

// Every number a run gives, in one order.
std::vector<double> run(pmap::Mesh mesh, bool data_parallel, const train::Dataset& data, const train::Dataset& test) {
  const int n = mesh.size();
  train::Trainer t(data_parallel ? train::keras_convnet({12, 12, 1}) : train::flax_cnn({12, 12, 1}),
                   train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}), std::move(mesh),
                   {.members = data_parallel ? 1 : 2 * n, .data_parallel = data_parallel, .batch_size = 60,
                    .report_every = 3, .eval_batch = 64});
  std::vector<double> out;
  t.run_epoch(data, [&](const train::StepReport& r) { out.insert(out.end(), {r.loss, r.running_accuracy}); });
  const train::Evaluation e = t.evaluate(test, {.size_curve = true, .predictions = true});
  out.insert(out.end(), {e.loss, e.ensemble_accuracy, e.ensemble_calibration.nll, e.ensemble_calibration.ece});
  for (std::size_t g = 0; g < e.member_accuracy.size(); ++g)
    out.insert(out.end(), {e.member_accuracy[g], e.member_calibration[g].nll, e.member_calibration[g].brier});
  for (const auto& point : e.size_curve) out.insert(out.end(), {point.accuracy, point.calibration.nll});
  const pmap::io::Predictions& p = e.predictions;
  for (std::size_t i = 0; i < p.label.size(); ++i)
    out.insert(out.end(), {double(p.predicted[i]), double(p.probability[i]), double(p.entropy[i])});
  for (const auto& votes : p.votes) out.insert(out.end(), votes.begin(), votes.end());
  for (const auto& [name, a] : t.params())
    for (float v : a.to_vector<float>()) out.push_back(v);
  for (const auto& [name, a] : t.model_state())
    for (float v : a.to_vector<float>()) out.push_back(v);
  return out;
}

}  // namespace

int check_trainer(int local_n) {
  const int rank = pmap::distributed::process_index();
  const auto devices = pmap::distributed::global_devices(pmap::DeviceKind::cpu, local_n);
  const int n = static_cast<int>(devices.size());
  const auto data = pmap::testing::synthetic_dataset(600, 12, 1), test = pmap::testing::synthetic_dataset(150, 12, 2);
  int failures = 0;
  for (const bool dp : {false, true}) {
    const auto got = run(pmap::Mesh(devices, dp ? "data" : "ensemble"), dp, data, test);
    const auto want = run(pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), dp ? "data" : "ensemble"), dp,
                          data, test);
    const bool same =
        got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(double)) == 0;
    failures += !same;
    std::printf("rank %d: train::Trainer %s over %d processes: %zu numbers %s the %d-device single-process run\n",
                rank, dp ? "data parallel" : "ensemble", pmap::distributed::process_count(), got.size(),
                same ? "bitwise equal to" : "DIFFER from", n);
  }
  return failures == 0 ? 0 : 1;
}
