// The calibration statistics (kernels::calibration_sums, train::calibration_from_sums) and per-image
// predictions on hand-made probability arrays with computed expectations: NLL, Brier score, predictive
// entropy, top-label ECE over 15 bins (bins with no samples, a confidence of exactly 1, a probability that
// underflowed to 0, ties); the CUDA kernels (host run, and a GPU when usable) give the CPU op's bits.
#include "cuda_testing.h"

#include <cmath>

#include <pmapcc/kernels/backend.h>
#include <pmapcc/train/metrics.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

namespace k = pmap::kernels;
using pmap::train::Calibration;

// Four rows over 3 classes:
//   A [0.7, 0.2, 0.1] label 0: hit, confidence 0.7 (bin 10)
//   B [0.5, 0.5, 0.0] label 1: a tie, the first index (0) is predicted: a miss, confidence 0.5 (bin 7)
//   C [0.0, 0.0, 1.0] label 2: hit, confidence 1 (bin 14, the top bin holds 1)
//   D [1.0, 0.0, 0.0] label 2: miss, p[label] = 0 (NLL floored at -log(1e-30)), confidence 1 (bin 14)
const std::vector<float> kProbs = {0.7f, 0.2f, 0.1f, 0.5f, 0.5f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f};
const std::vector<std::int32_t> kLabels = {0, 1, 2, 2};

double d(float v) { return static_cast<double>(v); }

std::vector<double> expected_slots() {
  std::vector<double> s(k::kCalibrationSlots, 0.0);
  s[0] = -std::log(d(0.7f)) - std::log(d(0.5f)) + 0.0 - std::log(1e-30);
  s[1] = (d(0.7f) - 1) * (d(0.7f) - 1) + d(0.2f) * d(0.2f) + d(0.1f) * d(0.1f)  // A
         + 0.25 + 0.25                                                        // B
         + 0.0                                                                // C
         + 1.0 + 1.0;                                                         // D
  s[2] = -(d(0.7f) * std::log(d(0.7f)) + d(0.2f) * std::log(d(0.2f)) + d(0.1f) * std::log(d(0.1f))) -
         2 * (0.5 * std::log(0.5));
  s[3] = 2;                                              // A and C
  s[4 + 3 * 10] = 1, s[5 + 3 * 10] = d(0.7f), s[6 + 3 * 10] = 1;   // bin 10: A
  s[4 + 3 * 7] = 1, s[5 + 3 * 7] = 0.5, s[6 + 3 * 7] = 0;          // bin 7: B
  s[4 + 3 * 14] = 2, s[5 + 3 * 14] = 2, s[6 + 3 * 14] = 1;         // bin 14: C and D
  return s;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("calibration sums of hand-made rows: NLL, Brier, entropy, hits and the 15 confidence bins") {
  const auto& cpu = k::backend_for(pmap::DeviceKind::cpu).metrics();
  std::vector<double> sums(k::kCalibrationSlots, 0.0);
  cpu.calibration_sums({1, 4, 3}, kProbs.data(), kLabels.data(), sums.data(), nullptr);
  check_close(sums, expected_slots());
  // Bins without rows stay exactly 0.
  for (int b : {0, 1, 2, 3, 4, 5, 6, 8, 9, 11, 12, 13})
    for (int j = 0; j < 3; ++j) CHECK(sums[static_cast<std::size_t>(4 + 3 * b + j)] == 0.0);
  // The sums accumulate: a second call adds the same again.
  cpu.calibration_sums({1, 4, 3}, kProbs.data(), kLabels.data(), sums.data(), nullptr);
  std::vector<double> twice = expected_slots();
  for (double& v : twice) v *= 2;
  check_close(sums, twice);

  const Calibration c = pmap::train::calibration_from_sums(expected_slots());
  CHECK(c.nll == doctest::Approx((-std::log(0.7) - std::log(0.5) - std::log(1e-30)) / 4).epsilon(1e-7));
  CHECK(c.brier == doctest::Approx((0.14 + 0.5 + 0 + 2) / 4).epsilon(1e-7));
  const double entropy_a = -(0.7 * std::log(0.7) + 0.2 * std::log(0.2) + 0.1 * std::log(0.1));
  CHECK(c.entropy == doctest::Approx((entropy_a + std::log(2.0)) / 4).epsilon(1e-7));
  // ECE = (|1 - 0.7| + |0 - 0.5| + |1 - 2|) / 4: each bin's |hits - confidence sum| over all rows.
  CHECK(c.ece == doctest::Approx((0.3 + 0.5 + 1.0) / 4).epsilon(1e-7));
  CHECK(pmap::train::accuracy_from_sums(expected_slots()) == 0.5);
  REQUIRE(c.bins.size() == 15);
  CHECK(c.bins[14].count == 2);
  CHECK(c.bins[14].confidence == 1.0);
  CHECK(c.bins[14].accuracy == 0.5);
  CHECK(c.bins[10].accuracy == 1.0);
  CHECK(c.bins[7].accuracy == 0.0);
  CHECK(std::isnan(c.bins[0].confidence));  // an empty bin has no mean
  CHECK(std::isnan(c.bins[0].accuracy));
  // No rows at all: every mean is NaN, not a division by zero's inf.
  const Calibration none = pmap::train::calibration_from_sums(std::vector<double>(k::kCalibrationSlots, 0.0));
  CHECK(std::isnan(none.nll));
  CHECK(std::isnan(none.ece));
}

TEST_CASE("calibration sums of several predictors, and a label out of range") {
  const auto& cpu = k::backend_for(pmap::DeviceKind::cpu).metrics();
  // Predictor 1 is perfectly confident and right on every row: NLL, Brier, entropy 0, ECE 0.
  std::vector<float> two = kProbs;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) two.push_back(c == kLabels[static_cast<std::size_t>(r)] ? 1.0f : 0.0f);
  std::vector<double> sums(2 * k::kCalibrationSlots, 0.0);
  cpu.calibration_sums({2, 4, 3}, two.data(), kLabels.data(), sums.data(), nullptr);
  check_close(std::vector<double>(sums.begin(), sums.begin() + k::kCalibrationSlots), expected_slots());
  const Calibration perfect =
      pmap::train::calibration_from_sums(std::vector<double>(sums.begin() + k::kCalibrationSlots, sums.end()));
  CHECK(perfect.nll == 0.0);
  CHECK(perfect.brier == 0.0);
  CHECK(perfect.entropy == 0.0);
  CHECK(perfect.ece == 0.0);
  const std::vector<std::int32_t> bad = {0, 3, 2, 2};
  CHECK_THROWS_WITH_AS(cpu.calibration_sums({1, 4, 3}, kProbs.data(), bad.data(), sums.data(), nullptr),
                       doctest::Contains("label 3 at row 1"), pmap::ValueError);
}

TEST_CASE("cuda calibration sums and predictions: the CPU op's bits, on the host run and a GPU") {
  using namespace cuda_testing;
  const auto& cpu = k::backend_for(pmap::DeviceKind::cpu).metrics();
  // 3 predictors x 37 rows x 10 classes of softmax-like rows (random, normalized), and random labels.
  const int predictors = 3, rows = 37, classes = 10;
  auto probs = random_floats(static_cast<std::size_t>(predictors * rows * classes), 31, 0.0f, 1.0f);
  for (int r = 0; r < predictors * rows; ++r) {
    float sum = 0;
    for (int c = 0; c < classes; ++c) sum += probs[static_cast<std::size_t>(r * classes + c)];
    for (int c = 0; c < classes; ++c) probs[static_cast<std::size_t>(r * classes + c)] /= sum;
  }
  probs[5] = probs[6] = 0.9f;  // a tie
  const auto labels = random_labels(static_cast<std::size_t>(rows), classes, 32);
  std::vector<double> want(static_cast<std::size_t>(predictors) * k::kCalibrationSlots, 0.5);
  cpu.calibration_sums({predictors, rows, classes}, probs.data(), labels.data(), want.data(), nullptr);
  std::vector<std::int32_t> pred(static_cast<std::size_t>(rows));
  std::vector<float> prob(pred.size()), entropy(pred.size());
  cpu.predictions(rows, classes, probs.data(), pred.data(), prob.data(), entropy.data());
  CHECK(pred[0] == 5);  // the first of the tied classes
  for (const Target& t : targets()) {
    CAPTURE(t.name);
    const k::MetricOps& be = t.backend->metrics();
    auto gp = on(t.device, probs), gl = on(t.device, labels);
    auto gs = on(t.device, std::vector<double>(want.size(), 0.5));
    auto ws = zeros(t.device, be.calibration_workspace_bytes({predictors, rows, classes}), pmap::DType::u8);
    be.calibration_sums({predictors, rows, classes}, gp.data<float>(), gl.data<std::int32_t>(), gs.data<double>(),
                        ws.raw_data());
    auto gpred = zeros(t.device, pred.size(), pmap::DType::i32), gprob = zeros(t.device, pred.size());
    auto gent = zeros(t.device, pred.size());
    be.predictions(rows, classes, gp.data<float>(), gpred.data<std::int32_t>(), gprob.data<float>(),
                   gent.data<float>());
    CHECK(gpred.to_vector<std::int32_t>() == pred);
    CHECK(gprob.to_vector<float>() == prob);
    if (t.device.is_cpu()) {  // the host run: the same arithmetic and the same libm, so the same bits
      CHECK(gs.to_vector<double>() == want);
      CHECK(gent.to_vector<float>() == entropy);
    } else {  // CUDA's log is not glibc's: within a few ulp
      check_close(gs.to_vector<double>(), want);
      CHECK(relative_error(gent.to_vector<float>(), entropy) <= 1e-6);
    }
  }
}

}  // namespace PMAPCC_TEST_FILE
