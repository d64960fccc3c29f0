// What a training run reports, as plain records (one EpochMetrics per epoch: train and test figures,
// calibration, timings), and their JSON form: the metrics file the mnist_ensemble program writes and the
// training history a checkpoint keeps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <pmapcc/io/json.h>

namespace pmap::io {

// One confidence bin of a reliability diagram: its rows, their mean confidence and their accuracy (both
// NaN for an empty bin).
struct ReliabilityBin {
  double count = 0;
  double confidence = 0;
  double accuracy = 0;
};

// How well a predictor's probabilities are calibrated on the test set (Lakshminarayanan et al., 2017):
// means over the test images of the negative log-likelihood of the true class, the Brier score
// (sum over classes of (p - onehot)^2, 0..2) and the predictive entropy (nats); the expected calibration
// error over 15 equal-width confidence bins of the top label; and those bins.
struct Calibration {
  double nll = 0;
  double brier = 0;
  double ece = 0;
  double entropy = 0;
  std::vector<ReliabilityBin> bins;  // kernels::kCalibrationBins, lowest confidence first
};

// The ensemble of the first k members (k = 1..M), evaluated on the test set.
struct SizePoint {
  int members = 0;
  double accuracy = 0;
  Calibration calibration;
};

// Per test image (in test-set order): its label, the ensemble's predicted class, that class's probability,
// the predictive entropy (nats), and each member's predicted class (votes[member][image]).
struct Predictions {
  std::vector<std::int32_t> label, predicted;
  std::vector<float> probability, entropy;
  std::vector<std::vector<std::int32_t>> votes;
};

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
  std::vector<Calibration> member_calibration;  // per member, in member order (empty: not measured)
  Calibration ensemble_calibration;             // of the members' mean probabilities
  // The set the "test" fields above were measured on: "test", or "validation" for the epochs of a run with a
  // validation split (TrainConfig::validation_split), whose test set is evaluated once, at the end.
  std::string evaluated_on = "test";
};

// The JSON object of one epoch: {"epoch", "train_loss", "train_accuracy", "test_loss",
// "member_test_accuracy": [...], "ensemble_test_accuracy", "seconds", "eval_seconds",
// "model_images_per_second", then, when the calibration was measured, "member_test_nll",
// "member_test_brier", "member_test_ece", "member_test_entropy" (arrays, per member),
// "ensemble_test_nll", "ensemble_test_brier", "ensemble_test_ece", "ensemble_test_entropy",
// "ensemble_reliability" and "best_member_reliability" (objects {"member" (best only), "count",
// "confidence", "accuracy"}, arrays over the 15 confidence bins)}. "epoch" is an integer, the rest
// doubles; a NaN or infinite value (a diverged run, an empty bin) becomes null. "evaluated_on" follows when it is
// not "test" (the fields then hold the validation set's values).
Json epoch_json(const EpochMetrics& m);
// The inverse of epoch_json (null reads back as NaN); DataError naming the source and field on a
// missing or mistyped field. The calibration keys are optional (older checkpoints' histories lack them).
EpochMetrics epoch_metrics_from_json(const JsonView& v);

// [{"members": k, "test_accuracy", "test_nll", "test_brier", "test_ece", "test_entropy"}, ...].
Json size_curve_json(const std::vector<SizePoint>& curve);
// The member with the highest test accuracy (the first on ties); 0 without members.
std::size_t best_member(const EpochMetrics& m);

}  // namespace pmap::io
