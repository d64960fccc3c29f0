// EpochMetrics <-> JSON, shared by the metrics file and the training history kept in checkpoints.
#include <pmapcc/io/metrics.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace pmap::io {
namespace {

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

double number_or_nan(const JsonView& v) {
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.as_double();
}

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
  o["count"] = numbers(count);
  o["confidence"] = numbers(confidence);
  o["accuracy"] = numbers(accuracy);
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
  for (std::size_t i = 0; i < nll.size(); ++i)
    m.member_calibration.push_back({nll[i], brier[i], ece[i], entropy[i], {}});
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

std::size_t best_member(const EpochMetrics& m) {
  const auto& a = m.member_test_accuracy;
  return a.empty() ? 0 : static_cast<std::size_t>(std::max_element(a.begin(), a.end()) - a.begin());
}

Json size_curve_json(const std::vector<SizePoint>& curve) {
  Json a = Json::array();
  for (const SizePoint& p : curve) {
    Json o = Json::object();
    o["members"] = p.members;
    o["test_accuracy"] = number_or_null(p.accuracy);
    o["test_nll"] = number_or_null(p.calibration.nll);
    o["test_brier"] = number_or_null(p.calibration.brier);
    o["test_ece"] = number_or_null(p.calibration.ece);
    o["test_entropy"] = number_or_null(p.calibration.entropy);
    a.push_back(std::move(o));
  }
  return a;
}

Json epoch_json(const EpochMetrics& m) {
  Json o = Json::object();
  o["epoch"] = m.epoch;
  o["train_loss"] = number_or_null(m.train_loss);
  o["train_accuracy"] = number_or_null(m.train_accuracy);
  o["test_loss"] = number_or_null(m.test_loss);
  Json members = Json::array();
  for (double a : m.member_test_accuracy) members.push_back(number_or_null(a));
  o["member_test_accuracy"] = std::move(members);
  o["ensemble_test_accuracy"] = number_or_null(m.ensemble_test_accuracy);
  o["seconds"] = number_or_null(m.seconds);
  o["eval_seconds"] = number_or_null(m.eval_seconds);
  o["model_images_per_second"] = number_or_null(m.model_images_per_second);
  if (m.evaluated_on != "test") o["evaluated_on"] = m.evaluated_on;
  if (m.member_calibration.empty()) return o;
  const auto& c = m.member_calibration;
  o["member_test_nll"] = numbers(per_member(c, [](const Calibration& x) { return x.nll; }));
  o["member_test_brier"] = numbers(per_member(c, [](const Calibration& x) { return x.brier; }));
  o["member_test_ece"] = numbers(per_member(c, [](const Calibration& x) { return x.ece; }));
  o["member_test_entropy"] = numbers(per_member(c, [](const Calibration& x) { return x.entropy; }));
  o["ensemble_test_nll"] = number_or_null(m.ensemble_calibration.nll);
  o["ensemble_test_brier"] = number_or_null(m.ensemble_calibration.brier);
  o["ensemble_test_ece"] = number_or_null(m.ensemble_calibration.ece);
  o["ensemble_test_entropy"] = number_or_null(m.ensemble_calibration.entropy);
  o["ensemble_reliability"] = reliability_json(m.ensemble_calibration);
  const std::size_t best = best_member(m);
  Json b = Json::object();
  b["member"] = static_cast<std::int64_t>(best);
  const Json bins = reliability_json(best < c.size() ? c[best] : Calibration{});
  for (const auto& [key, value] : bins.items()) b[key] = value;
  o["best_member_reliability"] = std::move(b);
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
  if (v.contains("evaluated_on")) {
    m.evaluated_on = v["evaluated_on"].as_string();
    if (m.evaluated_on != "test" && m.evaluated_on != "validation") v["evaluated_on"].fail("is not test or validation");
  }
  if (v.contains("member_test_nll")) read_calibration(v, m);
  return m;
}

}  // namespace pmap::io
