// EpochMetrics <-> JSON, shared by the metrics file and the training history kept in checkpoints.
#include "ensemble/metrics.h"

namespace pmap::ensemble {

Json to_json(const EpochMetrics& m) {
  Json j = Json::object();
  j.set("epoch", m.epoch);
  j.set("train_loss", m.train_loss);
  j.set("train_accuracy", m.train_accuracy);
  j.set("test_loss", m.test_loss);
  Json acc = Json::array();
  for (double a : m.member_test_accuracy) acc.push_back(a);
  j.set("member_test_accuracy", std::move(acc));
  j.set("ensemble_test_accuracy", m.ensemble_test_accuracy);
  j.set("seconds", m.seconds);
  j.set("eval_seconds", m.eval_seconds);
  j.set("model_images_per_second", m.model_images_per_second);
  return j;
}

EpochMetrics epoch_metrics_from_json(const JsonView& v) {
  EpochMetrics m;
  m.epoch = static_cast<int>(v["epoch"].as_int());
  m.train_loss = v["train_loss"].as_double();
  m.train_accuracy = v["train_accuracy"].as_double();
  m.test_loss = v["test_loss"].as_double();
  const JsonView acc = v["member_test_accuracy"];
  for (std::size_t i = 0; i < acc.size(); ++i) m.member_test_accuracy.push_back(acc[i].as_double());
  m.ensemble_test_accuracy = v["ensemble_test_accuracy"].as_double();
  m.seconds = v["seconds"].as_double();
  m.eval_seconds = v["eval_seconds"].as_double();
  m.model_images_per_second = v["model_images_per_second"].as_double();
  return m;
}

}  // namespace pmap::ensemble
