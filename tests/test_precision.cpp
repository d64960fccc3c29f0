// bf16 mixed precision (kernels::Precision, train::TrainerOptions::precision, the program's --precision): the
// CPU's conv and dense ops in bf16 are the fp32 ops on bf16-rounded operands up to fp32 rounding, for every
// product (forward, weight and input gradients); a Trainer in bf16 trains reproducibly bit for bit and follows
// fp32's losses closely, on the CPU kernels and on the CUDA kernels' host run (TrainerOptions::cpu_backend); and
// bf16 is refused, naming what to do, wherever it cannot run: by the kernels, the Trainer's step and the
// program's check of --precision (check_precision).
#include <doctest/doctest.h>

#include <pmap/error.h>

#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu_backend.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "examples/mnist_ensemble/config.h"
#include "examples/mnist_ensemble/recipe.h"
#include "examples/mnist_ensemble/run_checks.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

namespace k = pmap::kernels;
using k::Precision;

std::vector<float> randoms(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = k::bf16::round(x);
  return v;
}

// max |a - b| / max |b|.
double relative(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

namespace train = pmap::train;

// The program's default recipe (flax-cnn, SGD with momentum 0.9 at 0.1, batches of 64) for `members` members
// on `devices` CPU devices, at `precision`, computed by `kernels` (null: the CPU kernels).
std::unique_ptr<train::Trainer> make_trainer(int devices, int members, Precision precision,
                                             const k::Backend* kernels = nullptr) {
  return std::make_unique<train::Trainer>(
      train::flax_cnn({12, 12, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
      pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "ensemble"),
      train::TrainerOptions{.members = members, .batch_size = 64, .precision = precision, .cpu_backend = kernels});
}

// The members' parameters as one vector, tensor after tensor in the model's order.
std::vector<float> all_params(const train::Trainer& t) {
  return pmap::testing::stacked(t.params(), t.model().param_names());
}

// One epoch on the training data; each step's loss.
std::vector<double> step_losses(train::Trainer& t, train::EpochReport* report = nullptr) {
  std::vector<double> out;
  const train::EpochReport e =
      t.run_epoch(pmap::testing::training_data().train, [&](const train::StepReport& r) { out.push_back(r.loss); });
  if (report != nullptr) *report = e;
  return out;
}

// The largest relative difference of two loss trajectories of one length.
double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / b[i]);
  return worst;
}

// Restores the CPU kernel variant active when the test began.
struct IsaGuard {
  std::string saved = k::cpu::isa();
  ~IsaGuard() { k::cpu::set_isa(saved); }
};

// Outputs of one op family's three products, as a list of buffers.
struct Results {
  std::vector<float> y, dx, dw, db;
};

Results run_dense(const k::DenseParams& p, const std::vector<float>& x, const std::vector<float>& w,
                  const std::vector<float>& b, const std::vector<float>& dy) {
  const k::Backend& be = k::cpu_backend();
  std::vector<unsigned char> ws(be.dense().dense_workspace_bytes(p));
  Results r;
  r.y.resize(static_cast<std::size_t>(p.members) * p.batch * p.out_features);
  r.dx.resize(x.size());
  r.dw.resize(w.size());
  r.db.resize(b.size());
  be.dense().dense_forward(p, x.data(), w.data(), b.data(), r.y.data(), ws.data());
  be.dense().dense_backward(p, x.data(), w.data(), dy.data(), r.dx.data(), r.dw.data(), r.db.data(), ws.data());
  return r;
}

Results run_conv(const k::Conv2dParams& p, const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& b, const std::vector<float>& dy) {
  const k::Backend& be = k::cpu_backend();
  std::vector<unsigned char> ws(be.conv().conv2d_workspace_bytes(p));
  Results r;
  r.y.resize(dy.size());
  r.dx.resize(x.size());
  r.dw.resize(w.size());
  r.db.resize(b.size());
  be.conv().conv2d_forward(p, x.data(), w.data(), b.data(), r.y.data(), ws.data());
  be.conv().conv2d_backward(p, x.data(), w.data(), dy.data(), r.dx.data(), r.dw.data(), r.db.data(), ws.data());
  return r;
}

// bf16 against fp32 on the rounded operands (the forward's x and w; the gradients' dy with x or w): the
// same products, summed in another order, so within fp32 rounding; and farther from fp32 on the operands
// as given, which shows that the rounding happened.
void check_against_fp32(const char* what, const Results& bf, const Results& on_rounded, const Results& plain) {
  const std::string op = what;
  CAPTURE(op);
  const std::pair<std::string, const std::vector<float>*> outs[] = {{"y", &bf.y}, {"dx", &bf.dx}, {"dw", &bf.dw}};
  const std::vector<float>* refs[] = {&on_rounded.y, &on_rounded.dx, &on_rounded.dw};
  const std::vector<float>* fp32[] = {&plain.y, &plain.dx, &plain.dw};
  for (int i = 0; i < 3; ++i) {
    const std::string& output = outs[i].first;
    CAPTURE(output);
    const double to_rounded = relative(*outs[i].second, *refs[i]), to_plain = relative(*outs[i].second, *fp32[i]);
    CAPTURE(to_rounded);
    CAPTURE(to_plain);
    CHECK(to_rounded <= 2e-6);
    CHECK(to_plain >= 1e-4);  // bf16's 8 bits of mantissa: about 4e-3 per operand
    CHECK(to_plain <= 2e-2);
  }
  CHECK(bf.db == plain.db);  // the bias gradient is a sum of dy, no product: fp32 in both
}

}  // namespace

TEST_CASE("bf16 conv and dense ops are the fp32 ops on bf16-rounded operands, to fp32 rounding") {
  if (!k::bf16::supported()) {
    MESSAGE("this CPU lacks AVX512_BF16: bf16 ops are not run (the refusal is checked below)");
    return;
  }
  IsaGuard guard;
  k::cpu::set_isa("avx512");
  for (bool shared : {false, true}) {
    CAPTURE(shared);
    k::DenseParams d;
    d.members = 2, d.batch = 19, d.in_features = 150, d.out_features = 37, d.shared_input = shared;
    const std::size_t xn = static_cast<std::size_t>((shared ? 1 : d.members) * d.batch * d.in_features);
    const auto x = randoms(xn, 1), w = randoms(static_cast<std::size_t>(d.members * d.in_features * d.out_features), 2);
    const auto b = randoms(static_cast<std::size_t>(d.members * d.out_features), 3);
    const auto dy = randoms(static_cast<std::size_t>(d.members * d.batch * d.out_features), 4);
    k::DenseParams d16 = d;
    d16.precision = Precision::bf16;
    const Results bf = run_dense(d16, x, w, b, dy);
    // y from rounded x and w; dw from rounded x and dy; dx from rounded dy and w.
    const Results fwd = run_dense(d, rounded(x), rounded(w), b, rounded(dy));
    check_against_fp32("dense", bf, fwd, run_dense(d, x, w, b, dy));

    // The first layer (a 3x3 patch of one channel: fp32 takes the direct path, bf16 the GEMM) and deeper
    // ones, strided with valid padding; the last with an odd number of patch rows per backward chunk (25
    // images of 3 x 3 pixels, then a ragged 2), whose last pair of rows has no second row.
    for (int layer = 0; layer < 3; ++layer) {
      CAPTURE(layer);
      k::Conv2dParams c;
      c.members = 2, c.batch = layer == 2 ? 27 : 3, c.height = c.width = layer == 0 ? 12 : layer == 1 ? 9 : 7;
      c.in_channels = layer == 0 ? 1 : layer == 1 ? 5 : 64;
      c.out_channels = 7, c.shared_input = shared;
      if (layer > 0) c.stride_h = c.stride_w = 2, c.padding = k::Padding::valid;
      const k::ConvGeometry g = k::conv2d_geometry(c);
      const std::size_t cx = static_cast<std::size_t>((shared ? 1 : c.members) * c.batch * c.height * c.width *
                                                      c.in_channels);
      const auto cxv = randoms(cx, 5), cw = randoms(static_cast<std::size_t>(c.members * 9 * c.in_channels * 7), 6);
      const auto cb = randoms(static_cast<std::size_t>(c.members * 7), 7);
      const auto cdy = randoms(static_cast<std::size_t>(c.members * c.batch * g.out_height * g.out_width * 7), 8);
      k::Conv2dParams c16 = c;
      c16.precision = Precision::bf16;
      const Results cbf = run_conv(c16, cxv, cw, cb, cdy);
      check_against_fp32("conv2d", cbf, run_conv(c, rounded(cxv), rounded(cw), cb, rounded(cdy)),
                         run_conv(c, cxv, cw, cb, cdy));
      // Run after run, the same bits.
      const Results again = run_conv(c16, cxv, cw, cb, cdy);
      CHECK(again.y == cbf.y);
      CHECK(again.dw == cbf.dw);
      CHECK(again.dx == cbf.dx);
    }
  }
}

TEST_CASE("bf16 is refused where it cannot run, naming what to do") {
  IsaGuard guard;
  k::DenseParams d;
  d.members = 1, d.batch = 2, d.in_features = 3, d.out_features = 4, d.precision = Precision::bf16;
  k::Conv2dParams c;
  c.batch = 1, c.height = c.width = 4, c.in_channels = 2, c.out_channels = 3, c.precision = Precision::bf16;
  for (const std::string& isa : k::cpu::available_isas()) {
    if (isa == "avx512" && k::bf16::supported()) continue;  // the one that runs it
    CAPTURE(isa);
    k::cpu::set_isa(isa);
    CHECK_THROWS_WITH_AS(k::cpu_backend().dense().dense_workspace_bytes(d), doctest::Contains("dense: bf16 precision"),
                         pmap::ValueError);
    CHECK_THROWS_WITH_AS(k::cpu_backend().conv().conv2d_workspace_bytes(c), doctest::Contains("use fp32"),
                         pmap::ValueError);
  }
  // The CUDA kernels (here run on the host) run bf16 whatever the CPU: their bf16 space is in the workspace.
  k::DenseParams d32 = d;
  d32.precision = Precision::fp32;
  CHECK(k::cuda_backend_on_host().dense().dense_workspace_bytes(d) >
        k::cuda_backend_on_host().dense().dense_workspace_bytes(d32));
  k::Conv2dParams c32 = c;
  c32.precision = Precision::fp32;
  CHECK(k::cuda_backend_on_host().conv().conv2d_workspace_bytes(c) >
        k::cuda_backend_on_host().conv().conv2d_workspace_bytes(c32));
  CHECK(k::parse_precision("bf16", "--precision") == Precision::bf16);
  CHECK(k::parse_precision("fp32", "--precision") == Precision::fp32);
  CHECK_THROWS_WITH_AS(k::parse_precision("fp16", "--precision"),
                       doctest::Contains("--precision: expected fp32 or bf16"), pmap::ValueError);

  // The program names the flag, before anything runs; the Trainer's first step names the op.
  const auto& data = pmap::testing::training_data();
  pmap::ensemble::TrainConfig config = pmap::testing::small_config(1, 1);
  config.precision = Precision::bf16;
  k::cpu::set_isa(k::cpu::available_isas().front());  // generic
  CHECK_THROWS_WITH_AS(pmap::ensemble::check_precision(config), doctest::Contains("--precision bf16: "),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make_trainer(1, 1, Precision::bf16)->run_epoch(data.train),
                       doctest::Contains("bf16 precision"), pmap::ValueError);
  // The CUDA kernels' host run takes it on any CPU.
  config.cuda_kernels_on_host = true;
  CHECK_NOTHROW(pmap::ensemble::check_precision(config));
}

TEST_CASE("bf16 training is reproducible bit for bit and follows fp32's losses") {
  if (!k::bf16::supported()) {
    MESSAGE("this CPU lacks AVX512_BF16: bf16 training is not run");
    return;
  }
  IsaGuard guard;
  k::cpu::set_isa("avx512");
  // flax-cnn, 2 members on 2 devices, one epoch of 10 steps: twice in bf16, once in fp32.
  const auto a = make_trainer(2, 2, Precision::bf16), b = make_trainer(2, 2, Precision::bf16);
  const auto f = make_trainer(2, 2, Precision::fp32);
  CHECK(all_params(*a) == all_params(*f));  // the same initial members: precision changes the arithmetic only
  train::EpochReport ea, eb;
  const std::vector<double> la = step_losses(*a, &ea), lb = step_losses(*b, &eb), lf = step_losses(*f);
  CHECK(all_params(*a) == all_params(*b));
  CHECK(la == lb);
  CHECK(ea.train_loss == eb.train_loss);
  const auto& test = pmap::testing::training_data().test;
  const train::Evaluation va = a->evaluate(test), vb = b->evaluate(test), vf = f->evaluate(test);
  CHECK(va.ensemble_accuracy == vb.ensemble_accuracy);
  CHECK(va.ensemble_calibration.nll == vb.ensemble_calibration.nll);
  CHECK(all_params(*a) != all_params(*f));
  REQUIRE(la.size() == lf.size());
  const double worst = worst_relative(la, lf);
  MESSAGE("bf16 vs fp32, " << la.size() << " steps: worst relative loss difference " << worst << ", last loss "
                           << la.back() << " vs " << lf.back() << "; test accuracy " << va.ensemble_accuracy
                           << " vs " << vf.ensemble_accuracy);
  CHECK(worst > 0);
  CHECK(worst <= 0.05);
  // The program's --precision reaches the Trainer's options, and its record.
  pmap::ensemble::TrainConfig config = pmap::testing::small_config(2, 2);
  CHECK(pmap::ensemble::recipe_options(config, 2).precision == Precision::fp32);
  CHECK(config.to_json().at("precision").get<std::string>() == "fp32");
  config.precision = Precision::bf16;
  CHECK(pmap::ensemble::recipe_options(config, 2).precision == Precision::bf16);
  CHECK(config.to_json().at("precision").get<std::string>() == "bf16");
  CHECK_NOTHROW(pmap::ensemble::check_precision(config));
}

TEST_CASE("bf16 training on the CUDA kernels (their host run) is reproducible and follows fp32's losses") {
  const k::Backend& on_host = k::cuda_backend_on_host();
  const auto a = make_trainer(1, 2, Precision::bf16, &on_host), b = make_trainer(1, 2, Precision::bf16, &on_host);
  const auto f = make_trainer(1, 2, Precision::fp32, &on_host);
  const std::vector<double> la = step_losses(*a), lb = step_losses(*b), lf = step_losses(*f);
  CHECK(all_params(*a) == all_params(*b));
  CHECK(la == lb);
  CHECK(all_params(*a) != all_params(*f));
  REQUIRE(la.size() == lf.size());
  const double worst = worst_relative(la, lf);
  MESSAGE("CUDA kernels on the host, bf16 vs fp32, " << la.size() << " steps: worst relative loss difference "
                                                      << worst);
  CHECK(worst > 0);
  CHECK(worst <= 0.05);
}

}  // namespace PMAPCC_TEST_FILE
