// What mnist_ensemble writes after each epoch: metrics as JSON and CSV, an SVG plot of the curves, and
// the final per-member table; every file is replaced atomically so a reader never sees a torn one.
// Accuracies in EpochMetrics are fractions (0..1); files keep them so, plots and tables show percent.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <pmapcc/io/json.h>

#include "examples/mnist_ensemble/config.h"

namespace pmap::ensemble {

// {"config": config, "epochs": [epoch_json(e) for e in epochs], "final": epoch_json(epochs.back())},
// "final" null when there are no epochs, and "ensemble_size_curve": size_curve_json(size_curve) when
// there is a curve. `config` is copied as given (normally an object). The members of `extra` (an object)
// are set last, replacing any of the above: the program's "final" test evaluation after a run whose epochs
// were evaluated on a validation set, and "early_stopping".
io::Json metrics_json(const io::Json& config, const std::vector<EpochMetrics>& epochs,
                  const std::vector<SizePoint>& size_curve = {}, const io::Json& extra = {});

// CSV text, one header line and one line per epoch, '\n'-terminated:
// epoch,train_loss,train_accuracy,test_loss,ensemble_test_accuracy,seconds,eval_seconds,
// model_images_per_second,member_0_test_accuracy,...,member_<n-1>_test_accuracy
// with n the largest member count of any epoch (an epoch with fewer members leaves those cells empty);
// when some epoch has calibration metrics, then ensemble_test_{nll,brier,ece,entropy} and
// member_<i>_test_nll for every i, then _brier, _ece and _entropy likewise. Epochs evaluated on a validation
// set (EpochMetrics::evaluated_on) name those columns val_loss, ensemble_val_accuracy, member_0_val_nll, ...
// Doubles in the shortest form that reads back bit-exact with strtod ("nan"/"inf" if not finite).
std::string metrics_csv(const std::vector<EpochMetrics>& epochs);

// One line per test image: index,label,prediction,probability,entropy,member_0,...,member_<M-1> (the
// members' predicted classes), with a header line. ids: the members' own indices for the headers (an
// evaluated subset of a checkpoint's members: member_0,member_2,member_5); empty: 0..M-1.
std::string predictions_csv(const Predictions& p, const std::vector<int>& ids = {});
void write_predictions_csv(const std::filesystem::path& path, const Predictions& p, const std::vector<int>& ids = {});

// Replaces `path` with `contents` atomically: the bytes go to a uniquely named temp file in the same
// directory ("<path>.tmp-<pid>-<n>"), which is fsynced and renamed over `path`. On failure `path` keeps
// its previous content (or stays absent), the temp file is removed, and pmap::IoError
// "<path>: <what failed>: <strerror>" is thrown. Blocking.
void write_text_file_atomic(const std::filesystem::path& path, std::string_view contents);

// metrics_json(config, epochs, size_curve, extra).dump(2) plus a newline, written with write_text_file_atomic.
void write_metrics_json(const std::filesystem::path& path, const io::Json& config,
                        const std::vector<EpochMetrics>& epochs, const std::vector<SizePoint>& size_curve = {},
                        const io::Json& extra = {});
// metrics_csv(epochs), written with write_text_file_atomic.
void write_metrics_csv(const std::filesystem::path& path, const std::vector<EpochMetrics>& epochs);

// A self-contained SVG document (no scripts, no external fonts or images) with two panels:
// (a) test accuracy in percent per epoch: one thin colored polyline per member (class "member", fixed
//     palette, cycling with a dash pattern past its size) and a thick black one for the ensemble (class
//     "ensemble"), y range from the lowest value rounded down to 0.1 % to the highest rounded up,
//     widened to whole ticks; a legend with each line's last value;
// (b) loss per epoch: train loss (class "train-loss") and mean member test loss (class "test-loss").
// A point marker is drawn at each epoch when there are few epochs, so a single epoch still shows.
// Non-finite values are left out. With no epochs, a small placeholder reading "no epochs yet".
// With calibration metrics in the last epoch, (c) a reliability diagram of that epoch: per confidence bin
// the accuracy against the mean confidence, for the ensemble (class "reliability-ensemble") and the best
// member (class "reliability-member"), beside the diagonal of perfect calibration; with a size curve,
// (d) test accuracy and (e) NLL and ECE of the ensemble of the first k members, k = 1..M
// (classes "size-accuracy", "size-nll", "size-ece"). The title names extras.dataset.
struct PlotExtras {
  std::string dataset = "MNIST";
  std::vector<SizePoint> size_curve;
};
std::string accuracy_plot_svg(const std::vector<EpochMetrics>& epochs, const PlotExtras& extras = {});
// accuracy_plot_svg(epochs, extras), written with write_text_file_atomic.
void write_plot_svg(const std::filesystem::path& path, const std::vector<EpochMetrics>& epochs,
                    const PlotExtras& extras = {});

// A plain-text table (lines end in '\n') of the last epoch: each member's test accuracy, the best
// member, the mean over members and the ensemble with its gain over the best member, in percent with two
// decimals, columns right-aligned; when the epoch has calibration metrics, also NLL, Brier, ECE and
// predictive entropy (4 decimals; the mean row averages the members'). With members_per_device > 0 a
// "device" column shows the index of the device holding each member (member / members_per_device); 0
// leaves it out. ids: the members' own indices (an evaluated subset), as predictions_csv's; empty: 0..M-1.
std::string final_table(const EpochMetrics& last, int members_per_device = 0, const std::vector<int>& ids = {});

}  // namespace pmap::ensemble
