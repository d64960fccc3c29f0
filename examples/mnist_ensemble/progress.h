// Training progress on the terminal: a Keras-style bar redrawn in place on a TTY, or one summary line per
// epoch in logs. The clock is injectable so tests can drive the redraw throttle.
#pragma once

#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <string_view>

#include "examples/mnist_ensemble/config.h"

namespace pmap::ensemble {

// automatic: bar when the stream is a TTY, plain otherwise. bar: per-step line redrawn with '\r' (plus
// the summary line). plain: only the per-epoch summary line. none: nothing.
enum class ProgressMode { automatic, bar, plain, none };

// "auto", "bar", "plain", "none" (exact, lower case). Throws pmap::ValueError naming the value otherwise.
ProgressMode parse_progress_mode(std::string_view text);

// The epoch summary line, without newline:
// "epoch 3/10  train_loss 0.0312  train_acc 99.01%  test_loss 0.0290  test_acc [99.10 99.05]
//  ensemble 99.31%  12.3 s  20480 img/s" (one line; accuracies in percent, seconds = training time).
std::string epoch_summary_line(const EpochMetrics& m, int epochs);

// Writes progress to a C stream (not owned; must outlive the bar). Single-threaded: call from the thread
// that drives training. Every write is flushed. Never throws from the destructor, which ends an open
// bar line with a newline.
class ProgressBar {
 public:
  // Monotonic time in seconds; only differences are used.
  using Clock = std::function<double()>;
  // Minimum time between two redraws of the bar, in seconds (the final step is always drawn).
  static constexpr double redraw_interval = 0.1;
  // Cells of the bar between its brackets (fewer when the terminal is too narrow).
  static constexpr int kBarWidth = 30;

  // `epochs`: the total, shown as "Epoch e/epochs". mode automatic is resolved here with isatty.
  // `clock` defaults to std::chrono::steady_clock. Throws pmap::ValueError for a null stream (unless
  // mode is none) or epochs < 1.
  ProgressBar(std::FILE* out, ProgressMode mode, int epochs, Clock clock = {});
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  ~ProgressBar();

  // The mode in effect (never automatic).
  ProgressMode mode() const noexcept { return mode_; }

  // Starts epoch `epoch` (1-based) of `steps` steps (> 0, else pmap::ValueError); restarts the timer.
  void begin_epoch(int epoch, int steps);
  // Reports that `step` (1..steps) steps are done, with the running mean loss, the model throughput
  // (members * images / s) and, when not NaN, the running training accuracy (a fraction). Bar mode redraws
  // if redraw_interval has passed since the last redraw, or on the first and the final step; other modes
  // do nothing.
  void update(int step, double running_loss, double images_per_second_model,
              double running_accuracy = std::numeric_limits<double>::quiet_NaN());
  // The epoch's steps are done and its evaluation of `set` ("test", "validation") runs: bar mode shows it on
  // the bar line until end_epoch; plain mode prints nothing (its one line per epoch follows at end_epoch).
  void evaluating(const std::string& set = "test");
  // Ends the epoch: closes the bar line (drawing the final state if it was not drawn yet) and prints
  // epoch_summary_line(m) (bar and plain modes).
  void end_epoch(const EpochMetrics& m);
  // Ends an open bar line with a newline so other output can follow; the next update redraws below.
  void break_line();

 private:
  void draw(double now);
  std::string bar_line(double now);  // may narrow bar_width_ to fit the terminal

  std::FILE* out_;
  ProgressMode mode_;
  int epochs_;
  Clock clock_;
  int epoch_ = 0;
  int steps_ = 0;
  int step_ = 0;
  double loss_ = 0;
  double accuracy_ = std::numeric_limits<double>::quiet_NaN();
  double images_per_second_ = 0;
  bool evaluating_ = false;     // the bar line says that the evaluation runs
  std::string evaluated_set_ = "test";
  double epoch_start_ = 0;
  double last_draw_ = 0;
  int drawn_step_ = -1;         // the step shown by the last redraw, -1 when none this epoch
  bool line_open_ = false;      // a bar line is on screen without its newline
  std::size_t last_width_ = 0;  // characters of the last bar line, to blank leftovers
  int bar_width_ = kBarWidth;   // cells between the brackets
};

}  // namespace pmap::ensemble
