// What training reports: one EpochMetrics per epoch (train and test figures, timings), and the
// configuration they came from, as the mnist_ensemble program writes them (JSON, CSV, SVG, terminal).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pmap::ensemble {

struct EpochMetrics {
  int epoch = 0;                       // 1-based
  double train_loss = 0;               // mean over the epoch's steps and over members
  double train_accuracy = 0;           // fraction of training examples classified right, mean over members
  double test_loss = 0;                // mean over members of each member's mean test loss
  std::vector<double> member_test_accuracy;  // per member, in member order
  double ensemble_test_accuracy = 0;   // accuracy of the mean of the members' predicted probabilities
  double seconds = 0;                  // training time of the epoch (evaluation excluded)
  double eval_seconds = 0;             // evaluation time of the epoch
  double model_images_per_second = 0;  // members * training images / seconds
};

}  // namespace pmap::ensemble

#include "ensemble/json.h"

namespace pmap::ensemble {

// The JSON object of one epoch: {"epoch", "train_loss", "train_accuracy", "test_loss",
// "member_test_accuracy": [...], "ensemble_test_accuracy", "seconds", "eval_seconds",
// "model_images_per_second"}, in that order. "epoch" is an integer, the rest doubles; a NaN or
// infinite value (a diverged run) becomes null so the file can still be written.
Json epoch_json(const EpochMetrics& m);
// The inverse of epoch_json (null reads back as NaN); DataError naming the source and field on a
// missing or mistyped field.
EpochMetrics epoch_metrics_from_json(const JsonView& v);

}  // namespace pmap::ensemble
