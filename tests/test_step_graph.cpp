// train::TrainStep's graphs: on a backend that records graphs (the CUDA kernels run on the host here, which
// record and replay as a GPU's do) the jitted step is captured on its second call and launched from then on,
// its arguments copied into the graph's places. A call on another state, another batch, or with another
// per-member learning rate (a hyper-parameter the state holds), and the steps along the optimizer's schedule,
// must compute what the same calls compute run eagerly (StepOptions::graphs false), never replay the
// captured call's values.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/model.h>
#include <pmapcc/train/optimizer.h>
#include <pmapcc/train/step.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace train = pmap::train;
using pmap::Array;

namespace {

constexpr int kRows = 8, kSide = 12, kClasses = 10;

struct Batch {
  Array images, labels;
};

Batch batch(int seed, const pmap::Device& device) {
  std::vector<float> images(static_cast<std::size_t>(kRows * kSide * kSide));
  pmap::uniform(pmap::key(static_cast<std::uint64_t>(seed)), images);
  std::vector<std::int32_t> labels(kRows);
  for (int i = 0; i < kRows; ++i) labels[static_cast<std::size_t>(i)] = (i * 7 + seed) % kClasses;
  return {Array::from_host(images, {kRows, kSide, kSide, 1}, device), Array::from_host(labels, {kRows}, device)};
}

// One call of the step: on which state, on which batch, and the learning rate state 0 holds from then on (0:
// unchanged).
struct Call {
  int state;
  int batch;
  float learning_rate = 0.0f;
};

struct Result {
  std::vector<std::vector<float>> params;  // each state's parameters after the calls, tensor after tensor
  pmap::JitStats stats;
};

// One member a state, two states, on one CPU device whose ops the CUDA kernels' host run computes: the
// calls in order, on a step that captures graphs or not. Adam under a piecewise schedule (its rate computed
// on the device from the state's count), each state its own learning rate.
Result run(bool graphs, const std::vector<Call>& calls) {
  const pmap::Device cpu = pmap::local_devices(pmap::DeviceKind::cpu, 1)[0];
  const train::TrainStep step(
      train::flax_cnn({kSide, kSide, 1}, kClasses),
      train::Optimizer(pmap::optim::Adam{
          .learning_rate = pmap::optim::piecewise_schedule(1e-3f, {.boundaries = {2, 4}, .factors = {0.5, 0.25}})}),
      train::softmax_cross_entropy_loss, {.graphs = graphs});
  std::vector<train::TrainState> states;
  for (const auto& [seed, lr] : {std::pair{1u, 1e-3f}, std::pair{2u, 2e-3f}}) {
    const std::vector<pmap::Key> keys{pmap::key(seed)};
    states.push_back(step.init(keys, cpu, {.learning_rate = {lr}}));
  }
  std::vector<Batch> batches;
  batches.push_back(batch(3, cpu));
  batches.push_back(batch(4, cpu));
  pmap::Mesh mesh({cpu}, "ensemble");
  for (const Call& c : calls) {
    if (c.learning_rate != 0.0f)
      states[0].hyperparams.at("learning_rate") = Array::from_host(std::vector<float>{c.learning_rate}, {1}, cpu);
    pmap::pmap([&] {
      pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
      const Batch& b = batches[static_cast<std::size_t>(c.batch)];
      step(states[static_cast<std::size_t>(c.state)], b.images, b.labels);
    }, mesh)();
  }
  Result r{{}, step.stats()};
  for (const train::TrainState& s : states) {
    std::vector<float> p;
    for (const std::string& name : step.model().param_names()) {
      const auto t = s.params.at(name).to_vector<float>();
      p.insert(p.end(), t.begin(), t.end());
    }
    r.params.push_back(std::move(p));
  }
  return r;
}

}  // namespace

TEST_CASE("train step graphs: another state, batch or learning rate captures nothing stale, as eager steps run") {
  // A trace and a capture on state 0 and batch 0, then calls that change one argument of the captured call
  // each; state 0's six steps cross both of the schedule's boundaries.
  const std::vector<Call> calls{{0, 0}, {0, 0}, {0, 0}, {1, 0}, {0, 1}, {0, 0, 5e-4f}, {1, 1}, {0, 0}};
  const Result captured = run(true, calls);
  const Result eager = run(false, calls);
  CHECK(captured.params[0] == eager.params[0]);
  CHECK(captured.params[1] == eager.params[1]);
  // The graphs ran (one capture, launched for the later calls); the eager step captured none.
  CHECK(captured.stats.graph_captures >= 1);
  CHECK(captured.stats.graph_launches >= 4);
  CHECK(captured.stats.graph_refusals == 0);
  CHECK(eager.stats.graph_captures == 0);
  CHECK(eager.stats.graph_launches == 0);
  // The states moved (the comparison is not of untouched parameters).
  const Result untouched = run(false, {});
  CHECK(eager.params[0] != untouched.params[0]);
  CHECK(eager.params[1] != untouched.params[1]);
}

}  // namespace PMAPCC_TEST_FILE
