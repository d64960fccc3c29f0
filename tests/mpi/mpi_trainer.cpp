// train::Trainer over a mesh that spans the processes: an ensemble and a data-parallel model trained for an
// epoch and evaluated give, on every process, the numbers of one process with as many CPU devices, bit for
// bit (the per-step losses, the evaluation and its size curve, and the parameters), and a checkpoint the first
// process writes loads on every process into the same state.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <pmap/distributed.h>
#include <pmap/pmap.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "../synthetic.h"
#include "mpi_test_support.h"

namespace {

namespace train = pmap::train;

// A file name every process of `mesh` names alike: the temp directory, the first process's pid (summed over the
// mesh from the mesh's first device) and the mesh's processes.
std::filesystem::path shared_file(const pmap::Mesh& mesh, const std::string& name) {
  const std::string axis = mesh.axes()[0].name;
  const float pid = static_cast<float>(::getpid());  // exact: Linux pids are below 2^22
  const auto sum = pmap::pmap([&](int) {
    const float mine = pmap::axis_index(axis) == 0 ? pid : 0.0f;
    return pmap::psum(pmap::Array::from_host(std::vector<float>{mine}, pmap::Shape{1}, pmap::current_device()),
                      {axis});
  }, mesh)(0);
  const auto first = static_cast<long>(sum[0].to_vector<float>()[0]);
  return std::filesystem::temp_directory_path() / ("pmapcc_mpi_trainer_" + std::to_string(first) + "_" +
                                                   std::to_string(mesh.devices().back().process + 1) + "_" + name);
}

// Every number a run gives, in one order (the parameters also after a checkpoint's round trip).
std::vector<double> run(pmap::Mesh mesh, bool data_parallel, const train::Dataset& data, const train::Dataset& test) {
  const int n = mesh.size();
  train::Trainer t(data_parallel ? train::keras_convnet({12, 12, 1}) : train::flax_cnn({12, 12, 1}),
                   train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}), std::move(mesh),
                   {.members = data_parallel ? 1 : 2 * n, .data_parallel = data_parallel,
                    .batch_size = data_parallel ? 61 : 60,  // 61: blocks that differ by one example
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
  // A checkpoint: the first process writes it, every process loads it into a fresh Trainer of the mesh.
  const auto path = shared_file(t.mesh(), data_parallel ? "dp.safetensors" : "ensemble.safetensors");
  t.save(path);
  train::Trainer u(t.model(), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
                   pmap::Mesh(t.mesh().devices(), t.mesh().axes()[0].name), t.options());
  u.load(path);
  out.push_back(static_cast<double>(u.step()));
  for (const auto& v : {u.params(), u.model_state(), u.optimizer_state()})
    for (const auto& [name, a] : v)
      if (a.dtype() == pmap::DType::f32)
        for (float x : a.to_vector<float>()) out.push_back(x);
  // Every process has read the file: the gathers above are collective.
  if (pmap::distributed::process_index() == t.mesh().devices()[0].process) std::filesystem::remove(path);
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
