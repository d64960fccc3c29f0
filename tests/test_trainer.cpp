// Tests of ensemble training on CPU devices: a pinned loss trajectory, determinism, member placement
// independence, data-parallel equivalence, and exact resume from checkpoints.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <pmapcc/ensemble/member_layout.h>
#include <pmapcc/ensemble/runner.h>
#include <pmapcc/io/safetensors.h>
#include <pmapcc/ensemble/trainer.h>
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

using namespace pmap::ensemble;

namespace {

using pmap::testing::small_config;

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

using pmap::testing::max_abs_diff;

std::filesystem::path temp_path(const std::string& name) {
  return pmap::testing::scratch_dir("pmapcc_trainer_test") / name;
}

}  // namespace

TEST_CASE("a 10-step loss trajectory is pinned and learning happens") {
  Trainer t(small_config(1, 1), data().train, data().test);
  std::vector<double> losses;
  t.run_epoch([&](const pmap::ensemble::StepReport& r) { losses.push_back(r.loss); });
  REQUIRE(losses.size() == 10);  // 640 / 64
  // At initialization the logits are small, so the first loss is close to log(10).
  CHECK(losses[0] == doctest::Approx(std::log(10.0)).epsilon(0.05));
  // Pinned from this implementation (seed 0, synthetic data): catches any change in numerics.
  const std::vector<double> pinned = {2.315010, 2.288333, 2.263436, 2.161933, 2.092911,
                                      1.998013, 1.802227, 1.608478, 1.220347, 0.910082};
  for (std::size_t i = 0; i < pinned.size(); ++i) CHECK(losses[i] == doctest::Approx(pinned[i]).epsilon(1e-4));
}

TEST_CASE("same seed and device count: bitwise identical results, run after run") {
  Trainer a(small_config(2, 2), data().train, data().test), b(small_config(2, 2), data().train, data().test);
  auto ma = a.run_epoch(), mb = b.run_epoch();
  CHECK(a.params() == b.params());
  CHECK(a.optimizer_state("momentum") == b.optimizer_state("momentum"));
  CHECK(ma.train_loss == mb.train_loss);
  CHECK(ma.member_test_accuracy == mb.member_test_accuracy);
  CHECK(ma.ensemble_test_accuracy == mb.ensemble_test_accuracy);
  TrainConfig other = small_config(2, 2);
  other.seed = 1;
  Trainer c(other, data().train, data().test);
  CHECK(c.params() != a.params());
}

TEST_CASE("4 members on 4 devices and 4 members on 1 device start from the same keys") {
  Trainer spread(small_config(4, 4), data().train, data().test), packed(small_config(1, 4), data().train, data().test);
  CHECK(spread.params() == packed.params());  // member g's init depends only on its key
  spread.run_epoch();
  packed.run_epoch();
  const float diff = max_abs_diff(spread.params(), packed.params());
  MESSAGE("max |param difference| after one epoch, 4x1 vs 1x4 members: " << diff);
  CHECK(diff <= 1e-4f);
}

TEST_CASE("members start LeCun-normal as in Flax: truncated at 2 sigma, std sqrt(1/fan_in), zero biases, per key") {
  auto model = flax_mnist_cnn();
  const std::vector<pmap::Key> keys = pmap::split(pmap::key(7), 3);
  const std::int64_t p = model->params_per_member();
  std::vector<float> three(static_cast<std::size_t>(3 * p)), last(static_cast<std::size_t>(p));
  model->init(keys, three);
  model->init(std::span<const pmap::Key>(&keys[2], 1), last);
  for (const TensorSlot& t : model->tensors()) {
    CAPTURE(t.name);
    for (int g = 0; g < 3; ++g) {
      const float* w = three.data() + t.offset * 3 + g * t.size;
      if (t.is_bias) {
        CHECK(std::all_of(w, w + t.size, [](float v) { return v == 0.0f; }));
        continue;
      }
      // Flax's lecun_normal: a standard normal truncated to [-2, 2], scaled to stddev sqrt(1 / fan_in)
      // (the scale divides by 0.8796..., the truncated normal's own stddev).
      const double sigma = std::sqrt(1.0 / static_cast<double>(t.fan_in));
      const double bound = 2.0 * sigma / 0.87962566103423978;
      double sum = 0, sq = 0, peak = 0;
      for (std::int64_t i = 0; i < t.size; ++i) {
        sum += w[i], sq += static_cast<double>(w[i]) * w[i], peak = std::max(peak, std::abs(static_cast<double>(w[i])));
      }
      const double n = static_cast<double>(t.size), mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
      // Tolerances of 5 standard errors of each estimate (std error of the std ~ sigma * 0.55 / sqrt(n) for
      // this truncated normal; of the mean, sigma / sqrt(n)).
      CHECK(std::abs(stddev / sigma - 1.0) <= 5 * 0.55 / std::sqrt(n) + 1e-3);
      CHECK(std::abs(mean) <= 5 * sigma / std::sqrt(n));
      CHECK(peak <= bound * (1 + 1e-6));
      CHECK(peak >= 0.8 * bound);  // the tails are there, cut at the bound
    }
    // Member 2 alone from its key equals member 2 of the three: a member depends only on its key.
    CHECK(std::equal(last.begin() + t.offset, last.begin() + t.offset + t.size, three.begin() + t.offset * 3 + 2 * t.size));
    if (!t.is_bias)
      CHECK(!std::equal(three.begin() + t.offset * 3, three.begin() + t.offset * 3 + t.size,
                        three.begin() + t.offset * 3 + t.size));
  }
}

TEST_CASE("the checkpoint member layout: device blocks stack tensor by tensor, and a block comes back out") {
  const auto model = flax_mnist_cnn({8, 8, 1}, 3);
  const std::int64_t per = model->params_per_member(), local = 2, total = 6;
  // Value v of member g is g * per + v: where each value lands says which member and tensor it belongs to.
  std::vector<float> blocks(static_cast<std::size_t>(total * per));
  for (int d = 0; d < 3; ++d)
    for (const auto& t : model->tensors())
      for (std::int64_t j = 0; j < local; ++j)
        for (std::int64_t i = 0; i < t.size; ++i)
          blocks[static_cast<std::size_t>(d * local * per + t.offset * local + j * t.size + i)] =
              static_cast<float>((d * local + j) * per + t.offset + i);
  const std::vector<float> stacked = stack_members(*model, blocks, 3, local, total);
  for (const auto& t : model->tensors())
    for (std::int64_t g = 0; g < total; ++g)
      for (std::int64_t i = 0; i < t.size; ++i)
        REQUIRE(stacked[static_cast<std::size_t>(t.offset * total + g * t.size + i)] ==
                static_cast<float>(g * per + t.offset + i));
  for (int d = 0; d < 3; ++d) {
    const std::vector<float> block = member_block(*model, stacked, total, d * local, local);
    CHECK(std::equal(block.begin(), block.end(), blocks.begin() + d * local * per));
  }
  CHECK_THROWS_AS(stack_members(*model, blocks, 2, local, total), pmap::ValueError);
  CHECK_THROWS_AS(member_block(*model, stacked, total, 5, local), pmap::ValueError);
}

TEST_CASE("a model runner runs any group of members alike, and rejects a bad group or member range") {
  auto model = flax_mnist_cnn({12, 12, 1}, 10);
  const int members = 4, batch = 8;
  std::vector<pmap::Key> keys = pmap::split(pmap::key(3), members);
  std::vector<float> params(static_cast<std::size_t>(members * model->params_per_member()));
  model->init(keys, params);
  std::vector<float> x(static_cast<std::size_t>(batch * 144));
  pmap::uniform(pmap::key(4), x);
  const auto& be = pmap::kernels::backend_for(pmap::DeviceKind::cpu);
  ModelRunner all(*model, be, pmap::Device{}, members, batch), pairs(*model, be, pmap::Device{}, members, batch, 2);
  CHECK(all.group() == members);
  CHECK(pairs.group() == 2);
  const float* la = all.forward(x.data(), batch, params.data());
  const std::vector<float> logits_all(la, la + members * batch * 10);
  for (int first : {0, 2}) {
    const float* lp = pairs.forward(x.data(), batch, params.data(), first, 2);
    CHECK(std::vector<float>(lp, lp + 2 * batch * 10) ==
          std::vector<float>(logits_all.begin() + first * batch * 10, logits_all.begin() + (first + 2) * batch * 10));
  }
  CHECK_THROWS_WITH_AS(ModelRunner(*model, be, pmap::Device{}, members, batch, 5), doctest::Contains("group of 5"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(ModelRunner(*model, be, pmap::Device{pmap::DeviceKind::cuda, 0, 0}, members, batch),
                       doctest::Contains("the cpu backend cannot run on cuda:0"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pairs.forward(x.data(), batch, params.data(), 3, 2), doctest::Contains("members [3, 5)"),
                       pmap::ShapeError);
  CHECK_THROWS_AS(pairs.forward(x.data(), batch, params.data(), 0, 3), pmap::ShapeError);
  CHECK_THROWS_AS(pairs.forward(x.data(), batch, params.data()), pmap::ShapeError);  // all 4 at once
  std::vector<float> grads(params.size()), dlogits(static_cast<std::size_t>(2 * batch * 10), 0.1f);
  const std::vector<float> other = params;
  pairs.forward(x.data(), batch, params.data(), 0, 2);
  CHECK_THROWS_WITH_AS(pairs.backward(x.data(), other.data(), dlogits.data(), grads.data()),
                       doctest::Contains("same batch and parameters"), pmap::Error);
}

TEST_CASE("the member group changes no result: members run 1, 3 or 4 at a time train bitwise alike") {
  // 4 members on 1 device, run one at a time (the CPU default), in groups of 3 (3 + 1) and all at once.
  std::vector<std::vector<float>> params, momentum;
  std::vector<EpochMetrics> metrics;
  for (int group : {0, 1, 3, 4}) {
    TrainConfig c = small_config(1, 4);
    c.member_group = group;
    Trainer t(c, data().train, data().test);
    CHECK(t.member_group() == (group == 0 ? 1 : group));
    metrics.push_back(t.run_epoch());
    params.push_back(t.params());
    momentum.push_back(t.optimizer_state("momentum"));
  }
  for (std::size_t i = 1; i < params.size(); ++i) {
    CAPTURE(i);
    CHECK(params[i] == params[0]);
    CHECK(momentum[i] == momentum[0]);
    CHECK(metrics[i].train_loss == metrics[0].train_loss);
    CHECK(metrics[i].train_accuracy == metrics[0].train_accuracy);
    CHECK(metrics[i].test_loss == metrics[0].test_loss);
    CHECK(metrics[i].member_test_accuracy == metrics[0].member_test_accuracy);
    CHECK(metrics[i].ensemble_test_accuracy == metrics[0].ensemble_test_accuracy);
  }
  // The members differ from each other (so equal results above are not all one member's).
  CHECK(metrics[0].member_test_accuracy.size() == 4);
  TrainConfig bad = small_config(1, 4);
  bad.member_group = 5;
  CHECK_THROWS_WITH_AS(Trainer(bad, data().train, data().test), doctest::Contains("member group 5 is outside 0..4"),
                       pmap::ValueError);
  bad.member_group = -1;
  CHECK_THROWS_AS(Trainer(bad, data().train, data().test), pmap::ValueError);
}

TEST_CASE("data parallel over 2 devices matches 1 device with the same batch, and the replicas stay identical") {
  TrainConfig one = small_config(1, 1), two = small_config(2, 1);
  one.mode = two.mode = Mode::data_parallel;
  Trainer a(one, data().train, data().test), b(two, data().train, data().test);
  CHECK(a.params() == b.params());
  auto ma = a.run_epoch();
  auto mb = b.run_epoch();
  const float diff = max_abs_diff(a.params(), b.params());
  MESSAGE("max |param difference| after one epoch, data parallel 1 vs 2 devices: " << diff);
  CHECK(diff <= 1e-4f);
  CHECK(ma.train_loss == doctest::Approx(mb.train_loss).epsilon(1e-4));
  CHECK(mb.member_test_accuracy.size() == 1);
  // The replicas are bitwise identical: save and compare each device's copy through a checkpoint round
  // trip is indirect; instead check that a fresh data-parallel trainer gets identical metrics twice.
  Trainer c(two, data().train, data().test);
  auto mc = c.run_epoch();
  CHECK(mc.train_loss == mb.train_loss);
}

TEST_CASE("resume continues exactly: 2 epochs = 1 epoch, save, resume, 1 more") {
  const auto path = temp_path("resume.safetensors");
  Trainer straight(small_config(2, 2, 2), data().train, data().test);
  straight.run_epoch();
  straight.run_epoch();
  {
    Trainer first(small_config(2, 2, 2), data().train, data().test);
    first.run_epoch();
    first.save_checkpoint(path);
  }
  Trainer resumed(small_config(2, 2, 2), data().train, data().test);
  resumed.load_checkpoint(path);
  CHECK(resumed.epochs_done() == 1);
  CHECK(resumed.history().size() == 1);
  auto m = resumed.run_epoch();
  CHECK(m.epoch == 2);
  CHECK(resumed.params() == straight.params());
  CHECK(resumed.optimizer_state("momentum") == straight.optimizer_state("momentum"));
  CHECK(resumed.step() == straight.step());
  CHECK(m.member_test_accuracy == straight.history().back().member_test_accuracy);
  // A checkpoint of 2 members written on 2 devices resumes on 1 device too.
  Trainer one_device(small_config(1, 2, 2), data().train, data().test), two_devices(small_config(2, 2, 2), data().train, data().test);
  one_device.load_checkpoint(path);
  two_devices.load_checkpoint(path);
  CHECK(one_device.params() == two_devices.params());
  CHECK(one_device.optimizer_state("momentum") == two_devices.optimizer_state("momentum"));
}

TEST_CASE("mismatched and corrupt checkpoints are rejected with a clear error") {
  const auto path = temp_path("ckpt.safetensors");
  Trainer t(small_config(1, 1), data().train, data().test);
  t.run_epoch();
  t.save_checkpoint(path);
  TrainConfig other_seed = small_config(1, 1);
  other_seed.seed = 7;
  Trainer u(other_seed, data().train, data().test);
  CHECK_THROWS_WITH_AS(u.load_checkpoint(path), doctest::Contains("seed"), pmap::DataError);
  Trainer two(small_config(1, 2), data().train, data().test);
  CHECK_THROWS_WITH_AS(two.load_checkpoint(path), doctest::Contains("members"), pmap::DataError);
  CHECK_THROWS_AS(t.load_checkpoint(temp_path("missing.safetensors")), pmap::Error);

  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto bad = temp_path("bad.safetensors");
  auto write = [&](const std::string& b) { std::ofstream(bad, std::ios::binary) << b; };
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
#if defined(__SANITIZE_THREAD__)
  const std::size_t every = 7;  // ThreadSanitizer checks threads, not parsing: every 7th try, for CI's time
#else
  const std::size_t every = 1;
#endif
  // Every prefix through the header and a sample through the data: never loads, never crashes.
  // load_checkpoint validates everything before it changes the trainer, so one trainer serves all tries.
  Trainer fresh(small_config(1, 1), data().train, data().test);
  for (std::size_t len = 0; len < bytes.size(); len += (len < header + 64 ? every : 4099)) {
    write(bytes.substr(0, len));
    CHECK_THROWS_AS(fresh.load_checkpoint(bad), pmap::DataError);
  }
  CHECK(fresh.epochs_done() == 0);
  // Single-byte flips of the header: rejected, or (a flip that keeps it valid, e.g. in a float's
  // digits of the history) loaded into a consistent state.
  int rejected = 0, accepted = 0;
  for (std::size_t i = 8; i < 8 + header; i += 3 * every) {
    std::string b = bytes;
    b[i] = static_cast<char>(b[i] ^ 0x04);
    write(b);
    try {
      fresh.load_checkpoint(bad);
      ++accepted;
      CHECK(fresh.epochs_done() == 1);
    } catch (const pmap::DataError&) {
      ++rejected;
    }
  }
  MESSAGE("header flips: " << rejected << " rejected, " << accepted << " accepted as consistent");
  CHECK(rejected > 0);
}

TEST_CASE("bad training configurations are rejected naming the flag") {
  CHECK_THROWS_WITH_AS(Trainer(small_config(2, 3), data().train, data().test), doctest::Contains("--members 3"),
                       pmap::ValueError);
  TrainConfig dp = small_config(2, 2);
  dp.mode = Mode::data_parallel;
  CHECK_THROWS_WITH_AS(Trainer(dp, data().train, data().test), doctest::Contains("--members must be 1"),
                       pmap::ValueError);
  TrainConfig big = small_config(1, 1);
  big.batch_size = 1000;
  CHECK_THROWS_WITH_AS(Trainer(big, data().train, data().test), doctest::Contains("--batch-size 1000"),
                       pmap::ValueError);
}

TEST_CASE("the CUDA backend run on the host trains like the CPU backend, and its captured steps like eager ones") {
  // 5 steps of 2 members through the CUDA kernels run on the host (its reference GEMM is a plain loop,
  // slow under the sanitizers): the captured (recorded and replayed) train step gives bitwise the eager
  // one, and both stay within float reassociation of the CPU ops (cuBLAS's GEMM order is not Eigen's).
  const Dataset train = pmap::testing::synthetic_dataset(320, 12, 1);
  for (Mode mode : {Mode::ensemble, Mode::data_parallel}) {
    CAPTURE(to_string(mode));
    TrainConfig cpu_config = mode == Mode::ensemble ? small_config(1, 2) : small_config(2, 1);
    cpu_config.mode = mode;
    TrainConfig graphs = cpu_config;
    graphs.cuda_kernels_on_host = true;
    TrainConfig eager = graphs;
    eager.graphs = false;
    Trainer cpu(cpu_config, train, data().test), host(graphs, train, data().test), host_eager(eager, train, data().test);
    CHECK(host.params() == cpu.params());  // the same initial members
    const EpochMetrics mc = cpu.run_epoch(), mh = host.run_epoch(), me = host_eager.run_epoch();
    CHECK(host.params() == host_eager.params());
    CHECK(host.optimizer_state("momentum") == host_eager.optimizer_state("momentum"));
    CHECK(mh.train_loss == me.train_loss);
    CHECK(mh.member_test_accuracy == me.member_test_accuracy);
    CHECK(mh.ensemble_test_accuracy == me.ensemble_test_accuracy);
    const float diff = max_abs_diff(host.params(), cpu.params());
    MESSAGE(to_string(mode) << ": max |param difference| after 5 steps, CUDA kernels on the host vs CPU ops: "
                            << diff << "; train loss " << mh.train_loss << " vs " << mc.train_loss);
    CHECK(diff <= 1e-6f);  // measured: 3e-8 in both modes
    CHECK(diff > 0.0f);    // a different GEMM really ran
    CHECK(mh.train_loss == doctest::Approx(mc.train_loss).epsilon(1e-5));
    CHECK(mh.test_loss == doctest::Approx(mc.test_loss).epsilon(1e-4));
    for (std::size_t g = 0; g < mc.member_test_accuracy.size(); ++g)
      CHECK(std::abs(mh.member_test_accuracy[g] - mc.member_test_accuracy[g]) <= 2.0 / 200);
  }
  TrainConfig wrong = small_config(1, 1);
  wrong.cuda_kernels_on_host = true;
  wrong.backend = pmap::DeviceKind::cuda;
  CHECK_THROWS_WITH_AS(Trainer(wrong, data().train, data().test), doctest::Contains("for CPU devices"),
                       pmap::ValueError);
}

TEST_CASE("reporting every few steps changes no result, and every step is still reported in order") {
  std::vector<std::pair<int, double>> every, sparse;
  TrainConfig one = small_config(2, 2), three = small_config(2, 2);
  three.report_every = 3;  // 10 steps: reports after steps 3, 6, 9 and 10
  Trainer a(one, data().train, data().test), b(three, data().train, data().test);
  CHECK(a.config().report_every == 1);  // the CPU default
  const EpochMetrics ma = a.run_epoch([&](const pmap::ensemble::StepReport& r) { every.emplace_back(r.step, r.running_loss); });
  const EpochMetrics mb = b.run_epoch([&](const pmap::ensemble::StepReport& r) { sparse.emplace_back(r.step, r.running_loss); });
  CHECK(every == sparse);
  CHECK(every.size() == 10);
  // The running accuracy at the last step is the epoch's; the evaluation is announced once, after the steps.
  std::vector<double> accuracy;
  int evaluations = 0;
  Trainer c(one, data().train, data().test);
  const EpochMetrics mc = c.run_epoch(
      [&](const pmap::ensemble::StepReport& r) {
        CHECK(evaluations == 0);
        accuracy.push_back(r.running_accuracy);
      },
      [&] { ++evaluations; });
  CHECK(evaluations == 1);
  REQUIRE(accuracy.size() == 10);
  CHECK(accuracy.back() == doctest::Approx(mc.train_accuracy).epsilon(1e-12));
  for (double v : accuracy) CHECK((v >= 0 && v <= 1));
  CHECK(a.params() == b.params());
  CHECK(ma.train_loss == mb.train_loss);
  CHECK(ma.train_accuracy == mb.train_accuracy);
  TrainConfig bad = small_config(1, 1);
  bad.report_every = -1;
  CHECK_THROWS_WITH_AS(Trainer(bad, data().train, data().test), doctest::Contains("report_every"), pmap::ValueError);
}

TEST_CASE("training on CUDA devices where no GPU is usable says so") {
  if (pmap::cuda_device_count() > 0) return;  // a GPU machine trains (tests/test_cuda_train.cpp)
  TrainConfig c = small_config(1, 1);
  c.backend = pmap::DeviceKind::cuda;
  if (pmap::cuda_status().problem.empty()) {
    CHECK_THROWS_WITH_AS(Trainer(c, data().train, data().test), doctest::Contains("no GPU is usable here"),
                         pmap::NotAvailable);
  } else {
    CHECK_THROWS_WITH_AS(Trainer(c, data().train, data().test), doctest::Contains("cannot use the GPU"),
                         pmap::CudaError);
  }
}

TEST_CASE("calibration and the ensemble-size curve come from the same probabilities as accuracy") {
  TrainConfig c = small_config(1, 3);
  Trainer t(c, data().train, data().test);
  t.run_epoch();
  const EpochMetrics& epoch = t.history().back();
  EpochMetrics again;
  const EnsembleReport report = t.evaluate_report(again);
  // The report's evaluation is the epoch's, bit for bit.
  CHECK(again.member_test_accuracy == epoch.member_test_accuracy);
  CHECK(again.ensemble_test_accuracy == epoch.ensemble_test_accuracy);
  CHECK(again.ensemble_calibration.nll == epoch.ensemble_calibration.nll);
  CHECK(again.ensemble_calibration.ece == epoch.ensemble_calibration.ece);
  REQUIRE(epoch.member_calibration.size() == 3);
  // Member NLL from the probabilities is the cross-entropy test loss, to float rounding.
  double nll_mean = 0;
  for (const auto& m : epoch.member_calibration) nll_mean += m.nll / 3;
  CHECK(nll_mean == doctest::Approx(epoch.test_loss).epsilon(1e-5));
  // The curve: k = 1 is member 0, k = 3 the whole ensemble. The ensemble's sums are the same on one device, so
  // the same bits; a member's calibration is summed per piece of training-batch rows in the evaluation (64 of
  // the 128) and over the whole batch in the curve, so its double sums agree to rounding.
  REQUIRE(report.size_curve.size() == 3);
  CHECK(report.size_curve[0].members == 1);
  CHECK(report.size_curve[0].accuracy == epoch.member_test_accuracy[0]);
  CHECK(report.size_curve[0].calibration.nll == doctest::Approx(epoch.member_calibration[0].nll).epsilon(1e-12));
  CHECK(report.size_curve[2].accuracy == epoch.ensemble_test_accuracy);
  CHECK(report.size_curve[2].calibration.nll == epoch.ensemble_calibration.nll);
  CHECK(report.size_curve[2].calibration.brier == epoch.ensemble_calibration.brier);
  CHECK(report.size_curve[2].calibration.ece == epoch.ensemble_calibration.ece);
  // Per-image results: the ensemble's hits are its accuracy; each member's votes its accuracy.
  const Predictions& p = report.predictions;
  REQUIRE(p.predicted.size() == static_cast<std::size_t>(data().test.count));
  REQUIRE(p.votes.size() == 3);
  int hits = 0;
  std::vector<int> member_hits(3, 0);
  for (std::size_t i = 0; i < p.predicted.size(); ++i) {
    CHECK(p.label[i] == data().test.labels[i]);
    hits += p.predicted[i] == p.label[i];
    for (std::size_t m = 0; m < 3; ++m) member_hits[m] += p.votes[m][i] == p.label[i];
    CHECK(p.probability[i] > 0.0f);
    CHECK(p.probability[i] <= 1.0f);
    CHECK(p.entropy[i] >= 0.0f);
  }
  CHECK(hits == static_cast<int>(std::lround(epoch.ensemble_test_accuracy * data().test.count)));
  for (std::size_t m = 0; m < 3; ++m)
    CHECK(member_hits[m] == static_cast<int>(std::lround(epoch.member_test_accuracy[m] * data().test.count)));
}

TEST_CASE("a saved ensemble evaluates alone, as a whole or a subset of its members, on any device count") {
  const auto path = temp_path("evaluate.safetensors");
  Trainer t(small_config(2, 4), data().train, data().test);
  t.run_epoch();
  t.save_checkpoint(path);
  const EpochMetrics& trained = t.history().back();
  CHECK(inspect_checkpoint(path).members == 4);
  CHECK(inspect_checkpoint(path).epochs_done == 1);
  // All members on the same devices: the training run's own evaluation, bit for bit.
  TrainConfig all = small_config(2, 4);
  all.epochs = 0;
  Trainer whole(all, data().test, data().test);
  whole.load_members(path, {});
  EpochMetrics m;
  whole.evaluate(m);
  CHECK(m.member_test_accuracy == trained.member_test_accuracy);
  CHECK(m.ensemble_test_accuracy == trained.ensemble_test_accuracy);
  CHECK(m.ensemble_calibration.nll == trained.ensemble_calibration.nll);
  CHECK(m.test_loss == trained.test_loss);
  // Members 3 and 1 on one device: their own accuracies.
  TrainConfig two = small_config(1, 2);
  two.epochs = 0;
  Trainer pair(two, data().test, data().test);
  pair.load_members(path, {3, 1});
  EpochMetrics mp;
  pair.evaluate(mp);
  CHECK(mp.member_test_accuracy == std::vector<double>{trained.member_test_accuracy[3], trained.member_test_accuracy[1]});
  CHECK_THROWS_WITH_AS(pair.load_members(path, {0, 4}), doctest::Contains("member 4 is not among the checkpoint's 4"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(pair.load_members(path, {1, 1}), doctest::Contains("named twice"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pair.load_members(path, {}), doctest::Contains("needs a trainer of 4 members"), pmap::ValueError);
  // A checkpoint of another model (other image size) does not fit.
  const Dataset big_test = pmap::testing::synthetic_dataset(50, 16, 3);  // 16x16 images, not 12x12
  Trainer other(two, big_test, big_test);
  CHECK_THROWS_WITH_AS(other.load_members(path, {0, 1}),
                       doctest::Contains("the checkpoint's model has input (12, 12, 1) where this run's has (16, 16, 1)"),
                       pmap::DataError);
}

TEST_CASE("the configuration is recorded as given: lr 0.1, not 0.10000000149011612") {
  TrainConfig c = small_config(1, 1);
  c.optimizer.momentum = 0.95f;
  Trainer t(c, data().train, data().test);
  const std::string text = t.config().to_json().dump();
  CHECK(text.find("\"lr\":0.1,") != std::string::npos);
  CHECK(text.find("\"momentum\":0.95,") != std::string::npos);
  CHECK(text.find("\"dataset\":\"mnist\"") != std::string::npos);
}

}  // namespace PMAPCC_TEST_FILE
