// ProgressBar: the Keras-style per-step bar (TTY) and the per-epoch summary line (TTY and logs).
#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include <pmap/error.h>

namespace pmap::ensemble {
namespace {

constexpr int kMinBarWidth = 10;

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// "h:mm:ss" of a non-negative duration in seconds (rounded to whole seconds).
std::string clock_time(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-:--:--";
  const long s = std::lround(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

// "[=====>....]" with `width` cells for `done` of `total`.
std::string bar_cells(int done, int total, int width) {
  const int filled = total > 0 ? static_cast<int>(static_cast<long long>(width) * done / total) : 0;
  std::string s = "[";
  s.append(static_cast<std::size_t>(filled), '=');
  if (filled < width) {
    s += '>';
    s.append(static_cast<std::size_t>(width - filled - 1), '.');
  }
  return s + "]";
}

// Columns of the terminal behind `out`, or 0 when unknown.
int terminal_columns(std::FILE* out) {
  winsize ws{};
  if (::ioctl(::fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 0;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ProgressMode parse_progress_mode(std::string_view text) {
  if (text == "auto") return ProgressMode::automatic;
  if (text == "bar") return ProgressMode::bar;
  if (text == "plain") return ProgressMode::plain;
  if (text == "none") return ProgressMode::none;
  throw ValueError("progress mode must be auto, bar, plain or none (got \"" + std::string(text) + "\")");
}

std::string epoch_summary_line(const EpochMetrics& m, int epochs) {
  std::string s = "epoch " + std::to_string(m.epoch) + "/" + std::to_string(epochs);
  s += "  train_loss " + format("%.4f", m.train_loss);
  s += "  train_acc " + format("%.2f", 100 * m.train_accuracy) + "%";
  const std::string set = m.evaluated_on == "validation" ? "val" : "test";  // what the epoch was evaluated on
  s += "  " + set + "_loss " + format("%.4f", m.test_loss);
  s += "  " + set + "_acc [";
  for (std::size_t i = 0; i < m.member_test_accuracy.size(); ++i)
    s += (i ? " " : "") + format("%.2f", 100 * m.member_test_accuracy[i]);
  s += "]  ensemble " + format("%.2f", 100 * m.ensemble_test_accuracy) + "%";
  s += "  " + format("%.1f", m.seconds) + " s";
  s += "  " + format("%.0f", m.model_images_per_second) + " img/s";
  return s;
}

ProgressBar::ProgressBar(std::FILE* out, ProgressMode mode, int epochs, Clock clock)
    : out_(out), mode_(mode), epochs_(epochs), clock_(clock ? std::move(clock) : Clock(steady_seconds)) {
  if (epochs < 1) throw ValueError("ProgressBar: epochs must be >= 1 (got " + std::to_string(epochs) + ")");
  if (mode_ == ProgressMode::none) return;
  if (out_ == nullptr) throw ValueError("ProgressBar: the output stream is null");
  if (mode_ == ProgressMode::automatic)
    mode_ = ::isatty(::fileno(out_)) ? ProgressMode::bar : ProgressMode::plain;
}

ProgressBar::~ProgressBar() {
  if (line_open_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

void ProgressBar::begin_epoch(int epoch, int steps) {
  if (steps < 1)
    throw ValueError("ProgressBar::begin_epoch: steps must be >= 1 (got " + std::to_string(steps) + ")");
  break_line();
  epoch_ = epoch;
  steps_ = steps;
  step_ = 0;
  loss_ = 0;
  accuracy_ = std::numeric_limits<double>::quiet_NaN();
  evaluating_ = false;
  images_per_second_ = 0;
  epoch_start_ = clock_();
  drawn_step_ = -1;
  bar_width_ = kBarWidth;
}

void ProgressBar::update(int step, double running_loss, double images_per_second_model, double running_accuracy) {
  if (mode_ != ProgressMode::bar) return;
  step_ = std::clamp(step, 0, steps_);
  loss_ = running_loss;
  accuracy_ = running_accuracy;
  images_per_second_ = images_per_second_model;
  const double now = clock_();
  if (drawn_step_ < 0 || step_ >= steps_ || now - last_draw_ >= redraw_interval) draw(now);
}

void ProgressBar::evaluating(const std::string& set) {
  if (mode_ != ProgressMode::bar || step_ < 1) return;
  evaluating_ = true;
  evaluated_set_ = set;
  draw(clock_());
}

void ProgressBar::end_epoch(const EpochMetrics& m) {
  if (mode_ == ProgressMode::none) return;
  // The final state, without the evaluation's note once it is over.
  if (mode_ == ProgressMode::bar && step_ > 0 && (drawn_step_ != step_ || evaluating_)) {
    evaluating_ = false;
    draw(clock_());
  }
  break_line();
  std::fprintf(out_, "%s\n", epoch_summary_line(m, epochs_).c_str());
  std::fflush(out_);
}

void ProgressBar::break_line() {
  if (!line_open_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  line_open_ = false;
  last_width_ = 0;
}

void ProgressBar::draw(double now) {
  std::string line = bar_line(now);
  const std::size_t width = line.size();
  if (width < last_width_) line.append(last_width_ - width, ' ');  // blank what the longer line left
  std::fprintf(out_, "\r%s", line.c_str());
  std::fflush(out_);
  last_width_ = width;
  last_draw_ = now;
  drawn_step_ = step_;
  line_open_ = true;
}

// "Epoch 3/10  234/468 [=====>....] - ETA: 0:00:12 - 25 ms/step - 20480 img/s - loss: 0.0312"; at the
// final step the ETA gives way to the epoch's elapsed time. Shortened to fit a known terminal width.
std::string ProgressBar::bar_line(double now) {
  const double elapsed = now - epoch_start_;
  const double per_step = step_ > 0 ? elapsed / step_ : 0;
  const std::string head = "Epoch " + std::to_string(epoch_) + "/" + std::to_string(epochs_) + "  " +
                           std::to_string(step_) + "/" + std::to_string(steps_) + " ";
  std::string tail = step_ >= steps_ ? " - " + format("%.1f", elapsed) + " s"
                                     : " - ETA: " + clock_time(per_step * (steps_ - step_));
  tail += " - " + format("%.0f", per_step * 1000) + " ms/step";
  tail += " - " + format("%.0f", images_per_second_) + " img/s";
  tail += " - loss: " + format("%.4f", loss_);
  if (!std::isnan(accuracy_)) tail += " - accuracy: " + format("%.4f", accuracy_);
  if (evaluating_) tail += " - evaluating the " + evaluated_set_ + " set";
  const int columns = terminal_columns(out_);
  if (columns > 0) {  // shrink the bar to fit, never grow it back within the epoch (no jitter)
    const int room = columns - 1 - static_cast<int>(head.size() + tail.size()) - 2;
    bar_width_ = std::max(kMinBarWidth, std::min(bar_width_, room));
  }
  std::string line = head + bar_cells(step_, steps_, bar_width_) + tail;
  if (columns > 0 && line.size() > static_cast<std::size_t>(columns - 1))
    line.resize(static_cast<std::size_t>(columns - 1));
  return line;
}

}  // namespace pmap::ensemble
