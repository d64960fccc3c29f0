// EpochMetrics <-> JSON, shared by the metrics file and the training history kept in checkpoints.
#include <pmapcc/ensemble/metrics.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <pmapcc/kernels/ops.h>

namespace pmap::ensemble {
namespace {

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

double number_or_nan(const JsonView& v) {
  return v.type() == Json::Type::null ? std::numeric_limits<double>::quiet_NaN() : v.as_double();
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Json numbers(const std::vector<double>& values) {
  Json a = Json::array();
  for (double v : values) a.push_back(number_or_null(v));
  return a;
}

template <class F> std::vector<double> per_member(const std::vector<Calibration>& c, F field) {
  std::vector<double> out;
  for (const Calibration& x : c) out.push_back(field(x));
  return out;
}

Json reliability_json(const Calibration& c) {
  std::vector<double> count, confidence, accuracy;
  for (const ReliabilityBin& b : c.bins) {
    count.push_back(b.count);
    confidence.push_back(b.confidence);
    accuracy.push_back(b.accuracy);
  }
  Json o = Json::object();
  o.set("count", numbers(count));
  o.set("confidence", numbers(confidence));
  o.set("accuracy", numbers(accuracy));
  return o;
}

std::vector<double> doubles(const JsonView& v) {
  std::vector<double> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(number_or_nan(v[i]));
  return out;
}

void read_reliability(const JsonView& v, Calibration& c) {
  const auto count = doubles(v["count"]), confidence = doubles(v["confidence"]), accuracy = doubles(v["accuracy"]);
  if (confidence.size() != count.size() || accuracy.size() != count.size())
    v.fail("count, confidence and accuracy must have one entry per bin");
  c.bins.clear();
  for (std::size_t b = 0; b < count.size(); ++b) c.bins.push_back({count[b], confidence[b], accuracy[b]});
}

void read_calibration(const JsonView& v, EpochMetrics& m) {
  const auto nll = doubles(v["member_test_nll"]), brier = doubles(v["member_test_brier"]),
             ece = doubles(v["member_test_ece"]), entropy = doubles(v["member_test_entropy"]);
  if (brier.size() != nll.size() || ece.size() != nll.size() || entropy.size() != nll.size())
    v.fail("the member calibration arrays differ in length");
  m.member_calibration.clear();
  for (std::size_t i = 0; i < nll.size(); ++i) m.member_calibration.push_back({nll[i], brier[i], ece[i], entropy[i], {}});
  Calibration& e = m.ensemble_calibration;
  e.nll = number_or_nan(v["ensemble_test_nll"]);
  e.brier = number_or_nan(v["ensemble_test_brier"]);
  e.ece = number_or_nan(v["ensemble_test_ece"]);
  e.entropy = number_or_nan(v["ensemble_test_entropy"]);
  read_reliability(v["ensemble_reliability"], e);
  const JsonView best = v["best_member_reliability"];
  const auto index = static_cast<std::size_t>(best["member"].as_int());
  if (index < m.member_calibration.size()) read_reliability(best, m.member_calibration[index]);
}

}  // namespace

Calibration calibration_from_sums(const std::vector<double>& slots) {
  Calibration c;
  double rows = 0, gap = 0;
  for (int b = 0; b < kernels::kCalibrationBins; ++b) {
    const double count = slots.at(4 + 3 * static_cast<std::size_t>(b)), confidence = slots.at(5 + 3 * b),
                 hits = slots.at(6 + 3 * b);
    rows += count;
    gap += std::abs(hits - confidence);
    c.bins.push_back({count, count > 0 ? confidence / count : kNaN, count > 0 ? hits / count : kNaN});
  }
  c.nll = rows > 0 ? slots.at(0) / rows : kNaN;
  c.brier = rows > 0 ? slots.at(1) / rows : kNaN;
  c.entropy = rows > 0 ? slots.at(2) / rows : kNaN;
  c.ece = rows > 0 ? gap / rows : kNaN;
  return c;
}

double accuracy_from_sums(const std::vector<double>& slots) {
  double rows = 0;
  for (int b = 0; b < kernels::kCalibrationBins; ++b) rows += slots.at(4 + 3 * static_cast<std::size_t>(b));
  return rows > 0 ? slots.at(3) / rows : kNaN;
}

std::size_t best_member(const EpochMetrics& m) {
  const auto& a = m.member_test_accuracy;
  return a.empty() ? 0 : static_cast<std::size_t>(std::max_element(a.begin(), a.end()) - a.begin());
}

Json size_curve_json(const std::vector<SizePoint>& curve) {
  Json a = Json::array();
  for (const SizePoint& p : curve) {
    Json o = Json::object();
    o.set("members", p.members);
    o.set("test_accuracy", number_or_null(p.accuracy));
    o.set("test_nll", number_or_null(p.calibration.nll));
    o.set("test_brier", number_or_null(p.calibration.brier));
    o.set("test_ece", number_or_null(p.calibration.ece));
    o.set("test_entropy", number_or_null(p.calibration.entropy));
    a.push_back(std::move(o));
  }
  return a;
}

Json epoch_json(const EpochMetrics& m) {
  Json o = Json::object();
  o.set("epoch", m.epoch);
  o.set("train_loss", number_or_null(m.train_loss));
  o.set("train_accuracy", number_or_null(m.train_accuracy));
  o.set("test_loss", number_or_null(m.test_loss));
  Json members = Json::array();
  for (double a : m.member_test_accuracy) members.push_back(number_or_null(a));
  o.set("member_test_accuracy", std::move(members));
  o.set("ensemble_test_accuracy", number_or_null(m.ensemble_test_accuracy));
  o.set("seconds", number_or_null(m.seconds));
  o.set("eval_seconds", number_or_null(m.eval_seconds));
  o.set("model_images_per_second", number_or_null(m.model_images_per_second));
  if (m.member_calibration.empty()) return o;
  const auto& c = m.member_calibration;
  o.set("member_test_nll", numbers(per_member(c, [](const Calibration& x) { return x.nll; })));
  o.set("member_test_brier", numbers(per_member(c, [](const Calibration& x) { return x.brier; })));
  o.set("member_test_ece", numbers(per_member(c, [](const Calibration& x) { return x.ece; })));
  o.set("member_test_entropy", numbers(per_member(c, [](const Calibration& x) { return x.entropy; })));
  o.set("ensemble_test_nll", number_or_null(m.ensemble_calibration.nll));
  o.set("ensemble_test_brier", number_or_null(m.ensemble_calibration.brier));
  o.set("ensemble_test_ece", number_or_null(m.ensemble_calibration.ece));
  o.set("ensemble_test_entropy", number_or_null(m.ensemble_calibration.entropy));
  o.set("ensemble_reliability", reliability_json(m.ensemble_calibration));
  const std::size_t best = best_member(m);
  Json b = Json::object();
  b.set("member", static_cast<std::int64_t>(best));
  const Json bins = reliability_json(best < c.size() ? c[best] : Calibration{});
  for (const auto& [key, value] : bins.as_object()) b.set(key, value);
  o.set("best_member_reliability", std::move(b));
  return o;
}

EpochMetrics epoch_metrics_from_json(const JsonView& v) {
  EpochMetrics m;
  m.epoch = static_cast<int>(v["epoch"].as_int());
  m.train_loss = number_or_nan(v["train_loss"]);
  m.train_accuracy = number_or_nan(v["train_accuracy"]);
  m.test_loss = number_or_nan(v["test_loss"]);
  const JsonView acc = v["member_test_accuracy"];
  for (std::size_t i = 0; i < acc.size(); ++i) m.member_test_accuracy.push_back(number_or_nan(acc[i]));
  m.ensemble_test_accuracy = number_or_nan(v["ensemble_test_accuracy"]);
  m.seconds = number_or_nan(v["seconds"]);
  m.eval_seconds = number_or_nan(v["eval_seconds"]);
  m.model_images_per_second = number_or_nan(v["model_images_per_second"]);
  if (v.contains("member_test_nll")) read_calibration(v, m);
  return m;
}

}  // namespace pmap::ensemble
