// EpochMetrics <-> JSON, shared by the metrics file and the training history kept in checkpoints.
#include "ensemble/metrics.h"

#include <cmath>
#include <limits>

namespace pmap::ensemble {
namespace {

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

double number_or_nan(const JsonView& v) {
  return v.type() == Json::Type::null ? std::numeric_limits<double>::quiet_NaN() : v.as_double();
}

}  // namespace

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
  return m;
}

}  // namespace pmap::ensemble
