// Training on a GPU with train::Trainer (feed, jitted step, CUDA graphs), against the CPU: the same initial
// parameters for a key (bitwise), a 10-step loss trajectory within float reassociation of the CPU's, the same run
// twice bitwise on the GPU, several members on one GPU and virtual devices, data parallel, bf16 on the GPU against
// the CUDA kernels' host run, and a checkpoint moving between CPU and GPU. Each case needs a GPU.
#include "cuda_testing.h"

#include <filesystem>
#include <memory>
#include <tuple>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace train = pmap::train;
using pmap::kernels::Precision;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

// flax-cnn with SGD (momentum 0.9, rate 0.1), batches of 64, losses read every 3 steps (at steps 3, 6, 9 and
// 10): `members` members on `devices` devices of `kind`, an ensemble or one data-parallel model; at `precision`,
// and on CPU devices computed by `kernels` (null: the CPU kernels).
std::unique_ptr<train::Trainer> make_trainer(pmap::DeviceKind kind, int devices, int members,
                                             bool data_parallel = false, Precision precision = Precision::fp32,
                                             const pmap::kernels::Backend* kernels = nullptr) {
  return std::make_unique<train::Trainer>(
      train::flax_cnn({12, 12, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
      pmap::Mesh(pmap::local_devices(kind, devices), data_parallel ? "data" : "ensemble"),
      train::TrainerOptions{.members = members, .data_parallel = data_parallel, .batch_size = 64, .report_every = 3,
                            .eval_batch = 128, .precision = precision, .cpu_backend = kernels});
}

// Per-step losses of one epoch, as the progress callback reports them.
std::vector<double> step_losses(train::Trainer& t) {
  std::vector<double> out;
  t.run_epoch(data().train, [&](const train::StepReport& r) { out.push_back(r.loss); });
  return out;
}

// The members' parameters as one vector, tensor after tensor.
std::vector<float> params(const train::Trainer& t) {
  return pmap::testing::stacked(t.params(), t.model().param_names());
}

using pmap::testing::same_bits;

using pmap::testing::max_abs_diff;

}  // namespace

TEST_CASE("cuda training: the GPU starts from the CPU's parameters and follows its loss trajectory") {
  PMAPCC_REQUIRE_GPU();
#if defined(__SANITIZE_THREAD__)
  const std::vector<int> counts{2};  // ThreadSanitizer's build (the CUDA stand-in's): one small group, for time
#elif defined(__SANITIZE_ADDRESS__)
  const std::vector<int> counts{4};  // a sanitizer build (the CUDA stand-in's): one batched group, for time
#else
  const std::vector<int> counts{1, 4, 8};
#endif
  for (int members : counts) {
    CAPTURE(members);
    const auto cpu = make_trainer(pmap::DeviceKind::cpu, 1, members);
    const auto gpu = make_trainer(pmap::DeviceKind::cuda, 1, members);
    const auto again = make_trainer(pmap::DeviceKind::cuda, 1, members);
    CHECK(params(*gpu) == params(*cpu));  // initial parameters: bitwise, for the same key
    const auto lc = step_losses(*cpu), lg = step_losses(*gpu), la = step_losses(*again);
    REQUIRE(lg.size() == 10);
    REQUIRE(lc.size() == lg.size());
    for (std::size_t s = 0; s < lc.size(); ++s) CHECK(lg[s] == doctest::Approx(lc[s]).epsilon(1e-4));
    CHECK(la == lg);  // the same run twice on the GPU: bitwise
    CHECK(params(*again) == params(*gpu));
    CHECK(again->evaluate(data().test).ensemble_accuracy == gpu->evaluate(data().test).ensemble_accuracy);
    const float diff = max_abs_diff(params(*gpu), params(*cpu));
    MESSAGE(members << " member(s): max |param difference| GPU vs CPU after 10 steps: " << diff);
    CHECK(diff <= 1e-4f);
  }
}

TEST_CASE("cuda training: virtual devices on one GPU and data parallel match their CPU twins") {
  PMAPCC_REQUIRE_GPU();
  for (auto [devices, members, data_parallel] : {std::tuple{4, 4, false}, std::tuple{2, 1, true}}) {
    CAPTURE(devices);
    const auto cpu = make_trainer(pmap::DeviceKind::cpu, devices, members, data_parallel);
    const auto gpu = make_trainer(pmap::DeviceKind::cuda, devices, members, data_parallel);
    const auto lc = step_losses(*cpu), lg = step_losses(*gpu);
    REQUIRE(lc.size() == lg.size());
    for (std::size_t s = 0; s < lc.size(); ++s) CHECK(lg[s] == doctest::Approx(lc[s]).epsilon(1e-4));
    CHECK(max_abs_diff(params(*gpu), params(*cpu)) <= 1e-4f);
  }
}

TEST_CASE("cuda training: bf16 on the GPU follows the host run of the same kernels, and is reproducible") {
  PMAPCC_REQUIRE_GPU();
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  const int members = 1;  // a sanitizer build (the CUDA stand-in's): one member, for time
#else
  const int members = 4;
#endif
  // The CUDA kernels and their bf16 rounding, run on the host (options.cpu_backend), against the GPU's.
  const auto h = make_trainer(pmap::DeviceKind::cpu, 1, members, false, Precision::bf16,
                              &pmap::kernels::cuda_backend_on_host());
  const auto g = make_trainer(pmap::DeviceKind::cuda, 1, members, false, Precision::bf16);
  const auto again = make_trainer(pmap::DeviceKind::cuda, 1, members, false, Precision::bf16);
  const auto fp32 = make_trainer(pmap::DeviceKind::cuda, 1, members);
  const auto lh = step_losses(*h), lg = step_losses(*g), la = step_losses(*again), lf = step_losses(*fp32);
  REQUIRE(lg.size() == 10);
  REQUIRE(lh.size() == lg.size());
  for (std::size_t s = 0; s < lh.size(); ++s) CHECK(lg[s] == doctest::Approx(lh[s]).epsilon(1e-3));
  CHECK(la == lg);
  CHECK(params(*again) == params(*g));
  CHECK(params(*g) != params(*fp32));
  // The GPU's fp32 sums differ in order from the host's, so an operand now and then rounds to the other bf16
  // neighbour (2^-8 apart): the parameters drift further apart than in fp32 (1e-4), though the losses agree.
  const float diff = max_abs_diff(params(*g), params(*h)), from_fp32 = max_abs_diff(params(*g), params(*fp32));
  MESSAGE("bf16, " << members << " member(s): max |param difference| GPU vs host run after 10 steps: " << diff
                    << " (GPU bf16 vs fp32: " << from_fp32 << "); last loss " << lg.back() << " vs fp32 " << lf.back());
  CHECK(diff <= 5e-3f);        // 2.5e-3 on an H200 (the runner's), 2026-11-27
  CHECK(2 * diff < from_fp32);  // and closer to the host's bf16 than to fp32 (1.2e-2 there)
}

TEST_CASE("cuda training: a checkpoint written on the GPU resumes on the CPU and back") {
  PMAPCC_REQUIRE_GPU();
  const auto dir = pmap::testing::scratch_dir("pmapcc_cuda_train");
  const auto gpu = make_trainer(pmap::DeviceKind::cuda, 1, 2);
  gpu->run_epoch(data().train);
  gpu->save(dir / "gpu.safetensors");
  const auto cpu = make_trainer(pmap::DeviceKind::cpu, 2, 2);
  cpu->load(dir / "gpu.safetensors");
  CHECK(params(*cpu) == params(*gpu));
  CHECK(same_bits(cpu->optimizer_state(), gpu->optimizer_state()));
  cpu->run_epoch(data().train);
  cpu->save(dir / "cpu.safetensors");
  const auto back = make_trainer(pmap::DeviceKind::cuda, 1, 2);
  back->load(dir / "cpu.safetensors");
  CHECK(params(*back) == params(*cpu));
  CHECK(back->epochs_done() == 2);
  CHECK(back->step() == 20);
  std::filesystem::remove_all(dir);
}

}  // namespace PMAPCC_TEST_FILE
