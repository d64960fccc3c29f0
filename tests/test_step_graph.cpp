// The train step's graph key (review F4): a captured step freezes the batch's and the state's device
// pointers, the rows, the optimizer and its by-value options; a call that changes any of them must capture
// anew, never replay the old values. Checked with the CUDA kernels run on the host, whose graphs record and
// replay as a GPU's do, against the same calls run eagerly.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/ensemble/model.h>
#include <pmapcc/ensemble/optimizer.h>
#include <pmapcc/ensemble/step.h>
#include <pmapcc/kernels/backend.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;

namespace {

constexpr int kRows = 8, kSide = 12, kClasses = 10;

pe::Batch batch(int seed) {
  std::vector<float> images(static_cast<std::size_t>(kRows * kSide * kSide));
  pmap::uniform(pmap::key(static_cast<std::uint64_t>(seed)), images);
  std::vector<std::int32_t> labels(kRows);
  for (int i = 0; i < kRows; ++i) labels[static_cast<std::size_t>(i)] = (i * 7 + seed) % kClasses;
  return {pmap::Array::from_host(images, {kRows, kSide, kSide, 1}), pmap::Array::from_host(labels, {kRows})};
}

// One member's train steps, each call given as (which state, which batch, which schedule), on one DeviceWork
// that captures (graphs = true) or not; returns each state's parameters after the calls.
struct Call {
  int state;
  int batch;
  bool decayed;  // an exponential schedule instead of the constant one
};

std::vector<std::vector<float>> run(bool graphs, const std::vector<Call>& calls) {
  const auto model = pe::flax_mnist_cnn({kSide, kSide, 1}, kClasses);
  pe::OptimizerConfig adam;
  adam.name = "adam";
  adam.learning_rate = {1e-3f};
  const auto optimizer = pe::make_optimizer(adam);
  const pmap::Device cpu = pmap::local_devices(pmap::DeviceKind::cpu, 1)[0];
  pe::DeviceWork work(*model, pmap::kernels::cuda_backend_on_host(), cpu, 1, kRows, kRows, 0, 64,
                      pe::OptimizerWork(adam, 1, 0, cpu), graphs);
  std::vector<pe::TrainState> states;
  for (std::uint64_t seed : {1u, 2u}) {
    std::vector<float> init(static_cast<std::size_t>(model->params_per_member()));
    const std::vector<pmap::Key> keys{pmap::key(seed)};
    model->init(keys, init);
    states.push_back(pe::make_train_state(*optimizer, pmap::Array::from_host(init, {model->params_per_member()})));
  }
  std::vector<pe::Batch> batches;
  batches.push_back(batch(3));
  batches.push_back(batch(4));
  pe::StepOptions opt;
  opt.optimizer = optimizer.get();
  pe::StepOptions decayed = opt;
  decayed.update.schedule.kind = pmap::kernels::ScheduleKind::exponential;
  decayed.update.schedule.decay_rate = 0.5;
  pmap::Mesh mesh({cpu}, "ensemble");
  for (const Call& c : calls)
    pmap::pmap([&] {
      pe::train_step(states[static_cast<std::size_t>(c.state)], work, batches[static_cast<std::size_t>(c.batch)],
                     c.decayed ? decayed : opt);
    }, mesh)();
  std::vector<std::vector<float>> out;
  for (const auto& s : states) out.push_back(s.params.to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("a captured train step captures anew for another state, batch or schedule, as eager steps run") {
  // Warm-up and capture on state 0 and batch 0, then calls that change one frozen input each.
  const std::vector<Call> calls{{0, 0, false}, {0, 0, false}, {0, 0, false}, {1, 0, false},
                                {0, 1, false}, {0, 0, true},  {1, 1, true},  {0, 0, false}};
  const auto captured = run(true, calls);
  const auto eager = run(false, calls);
  CHECK(captured[0] == eager[0]);
  CHECK(captured[1] == eager[1]);
  // The states moved (the comparison is not of untouched parameters).
  const auto untouched = run(false, {});
  CHECK(eager[0] != untouched[0]);
  CHECK(eager[1] != untouched[1]);
}

}  // namespace PMAPCC_TEST_FILE
