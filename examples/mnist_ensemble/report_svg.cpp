// The SVG plot of a run: test accuracy per member and for the ensemble, and the losses, per epoch; the last
// epoch's reliability diagram and the ensemble-size curve when they are known.
// Plain string building: axes with "nice" ticks (1, 2, 5 x 10^k), no dependencies, no external fonts.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "report.h"

namespace pmap::ensemble {
namespace {

// Distinct, colorblind-friendly member colors (Tableau 10); members past it repeat a color, dashed.
constexpr std::array<const char*, 10> kPalette = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                                  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr std::array<const char*, 3> kDashes = {"", "6 3", "2 2"};

constexpr double kWidth = 1000;  // the page, in px
constexpr double kHeight = 790;
constexpr double kTopPanelTop = 70;  // (a) accuracy
constexpr double kTopPanelHeight = 390;
constexpr double kBottomPanelTop = 540;  // (b) loss
constexpr double kBottomPanelHeight = 190;
constexpr double kPlotLeft = 80;
constexpr double kPlotWidth = 660;
constexpr double kLegendLeft = kPlotLeft + kPlotWidth + 24;
constexpr double kLegendRow = 17;
constexpr double kLegendValueRight = kLegendLeft + 215;  // legend values right-aligned here
constexpr int kMarkerMaxEpochs = 40;                     // markers at each point up to this many epochs
// The calibration row below the loss panel: (c) the reliability diagram on the left, (d) and (e) the
// ensemble-size curve stacked on the right, each with its legend beneath.
constexpr double kCalibrationTop = 830;
constexpr double kReliabilityLeft = 80, kReliabilityWidth = 300, kReliabilityHeight = 300;
constexpr double kSizeLeft = 520, kSizeWidth = 300, kSizeHeight = 110, kSizeGap = 185;
constexpr double kCalibrationHeight = kCalibrationTop + kReliabilityHeight + 110;

std::string num(double v, int decimals = 1) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, decimals);
  return std::string(buf, r.ptr);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A tick step of 1, 2 or 5 times a power of ten giving about `target` intervals over `span`.
double nice_step(double span, int target) {
  const double raw = span / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0})
    if (raw <= f * magnitude * (1 + 1e-9)) return f * magnitude;
  return 10 * magnitude;
}

// Decimals needed to print multiples of `step` exactly.
int decimals_for(double step) { return std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9))); }

// One axis: the shown range [lo, hi] and the tick spacing.
struct Axis {
  double lo = 0, hi = 1, step = 1;
};

// [lo, hi] widened outward to whole ticks. `lo`/`hi` must be finite with lo < hi.
Axis nice_axis(double lo, double hi, int target_ticks) {
  Axis a;
  a.step = nice_step(hi - lo, target_ticks);
  a.lo = std::floor(lo / a.step + 1e-9) * a.step;
  a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  return a;
}

// Epoch axis: integer ticks, the range padded by half an epoch when there is only one.
Axis epoch_axis(int first, int last) {
  if (first == last) return {first - 0.5, last + 0.5, 1};
  Axis a{static_cast<double>(first), static_cast<double>(last), 1};
  a.step = std::max(1.0, nice_step(last - first, 10));
  return a;
}

// Accuracy axis in percent: min rounded down to 0.1 %, max rounded up, then to whole ticks.
Axis percent_axis(double min_pct, double max_pct) {
  double lo = std::floor(min_pct * 10 + 1e-6) / 10;
  double hi = std::ceil(max_pct * 10 - 1e-6) / 10;
  if (hi - lo < 0.2) {
    lo -= 0.1;
    hi += 0.1;
  }
  Axis a = nice_axis(lo, hi, 6);
  if (max_pct <= 100 && a.hi > 100) a.hi = 100;
  if (min_pct >= 0 && a.lo < 0) a.lo = 0;
  return a;
}

// Loss axis: [lo, hi] to whole ticks; a flat series gets a band around its value.
Axis value_axis(double lo, double hi) {
  if (!(lo < hi)) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  return nice_axis(lo, hi, 4);
}

// A line to draw: y values per epoch (NaN where missing), its style and legend entry.
struct Series {
  std::vector<double> y;
  std::string css_class, color, dash, label, value;  // value: the last one, shown in the legend
  double width = 1.3;
  double marker = 2.2;
};

Series make_series(std::string css_class, std::string color, std::string dash, double width, double marker) {
  Series s;
  s.css_class = std::move(css_class);
  s.color = std::move(color);
  s.dash = std::move(dash);
  s.width = width;
  s.marker = marker;
  return s;
}

// Where a panel sits on the page, and its x axis's title.
struct Frame {
  double top, height;
  double left = kPlotLeft, width = kPlotWidth;
  std::string x_title = "epoch";
};

// A rectangle of the page showing one x and one y axis.
class Panel {
 public:
  // The frame shows the axes' ranges plus a small margin, so points on the range's ends stay clear of it.
  Panel(Frame f, Axis x, Axis y)
      : top_(f.top),
        height_(f.height),
        left_(f.left),
        width_(f.width),
        x_title_(std::move(f.x_title)),
        x_(x),
        y_(y),
        x_pad_(kMargin * (x.hi - x.lo)),
        y_pad_(kMargin * (y.hi - y.lo)) {}
  Panel(double top, double height, Axis x, Axis y) : Panel(Frame{top, height}, x, y) {}
  double px(double x) const { return left_ + (x - x_.lo + x_pad_) / (x_.hi - x_.lo + 2 * x_pad_) * width_; }
  double py(double y) const {
    return top_ + height_ - (y - y_.lo + y_pad_) / (y_.hi - y_.lo + 2 * y_pad_) * height_;
  }

  // Frame, grid, ticks, tick labels, the panel's title and the axis titles.
  void axes(std::string& out, const std::string& title, const std::string& y_title) const {
    out += "<text x=\"" + num(left_) + "\" y=\"" + num(top_ - 10) +
           "\" font-size=\"15\" font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
    out += "<text transform=\"translate(" + num(left_ - 56) + " " + num(top_ + height_ / 2) +
           ") rotate(-90)\" text-anchor=\"middle\">" + xml_escape(y_title) + "</text>\n";
    const int yd = decimals_for(y_.step);
    const long y_ticks = std::lround((y_.hi - y_.lo) / y_.step);
    for (long k = 0; k <= y_ticks; ++k) {
      const double v = y_.lo + static_cast<double>(k) * y_.step;
      const std::string y = num(py(v));
      out += "<line x1=\"" + num(left_) + "\" y1=\"" + y + "\" x2=\"" + num(left_ + width_) + "\" y2=\"" + y +
             "\" stroke=\"#e3e3e3\"/>\n";
      out += "<text x=\"" + num(left_ - 8) + "\" y=\"" + num(py(v) + 4) + "\" text-anchor=\"end\">" +
             num(v, yd) + "</text>\n";
    }
    const int xd = decimals_for(x_.step);
    const long x_ticks = std::lround((x_.hi - x_.lo) / x_.step);
    const double first = std::ceil(x_.lo / x_.step - 1e-9) * x_.step;
    const std::string bottom = num(top_ + height_);
    for (long k = 0; k <= x_ticks; ++k) {
      const double v = first + static_cast<double>(k) * x_.step;
      if (v > x_.hi + 1e-9) break;
      const std::string x = num(px(v));
      out += "<line x1=\"" + x + "\" y1=\"" + bottom + "\" x2=\"" + x + "\" y2=\"" + num(top_ + height_ + 5) +
             "\" stroke=\"#444\"/>\n";
      out += "<text x=\"" + x + "\" y=\"" + num(top_ + height_ + 19) + "\" text-anchor=\"middle\">" +
             num(v, xd) + "</text>\n";
    }
    out += "<rect x=\"" + num(left_) + "\" y=\"" + num(top_) + "\" width=\"" + num(width_) + "\" height=\"" +
           num(height_) + "\" fill=\"none\" stroke=\"#444\"/>\n";
    out += "<text x=\"" + num(left_ + width_ / 2) + "\" y=\"" + num(top_ + height_ + 38) +
           "\" text-anchor=\"middle\">" + xml_escape(x_title_) + "</text>\n";
  }

  // A dashed grey segment between two points (the diagonal of perfect calibration).
  void guide(std::string& out, double x0, double y0, double x1, double y1) const {
    out += "<line class=\"guide\" x1=\"" + num(px(x0)) + "\" y1=\"" + num(py(y0)) + "\" x2=\"" + num(px(x1)) +
           "\" y2=\"" + num(py(y1)) + "\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n";
  }

  // Legend rows beneath the panel (under its axis title), one per series.
  void legend_below(std::string& out, const std::vector<Series>& series) const {
    for (std::size_t i = 0; i < series.size(); ++i) {
      const Series& s = series[i];
      const double y = top_ + height_ + 58 + kLegendRow * static_cast<double>(i);
      out += "<line x1=\"" + num(left_) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left_ + 24) + "\" y2=\"" +
             num(y) + "\" stroke=\"" + s.color + "\" stroke-width=\"" + num(s.width) + "\"";
      if (!s.dash.empty()) out += " stroke-dasharray=\"" + s.dash + "\"";
      out += "/>\n<text x=\"" + num(left_ + 30) + "\" y=\"" + num(y + 4) + "\">" + xml_escape(s.label) +
             (s.value.empty() ? "" : ": " + xml_escape(s.value)) + "</text>\n";
    }
  }

  // The series as one polyline (non-finite points left out), with markers if there are few epochs.
  void line(std::string& out, const std::vector<double>& epochs, const Series& s) const {
    std::string points, markers;
    const bool mark = epochs.size() <= kMarkerMaxEpochs;
    for (std::size_t i = 0; i < epochs.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      const std::string x = num(px(epochs[i])), y = num(py(s.y[i]));
      points += (points.empty() ? "" : " ") + x + "," + y;
      if (mark) markers += "<circle cx=\"" + x + "\" cy=\"" + y + "\" r=\"" + num(s.marker) + "\"/>";
    }
    out += "<polyline class=\"" + s.css_class + "\" fill=\"none\" stroke=\"" + s.color +
           "\" stroke-width=\"" + num(s.width) + "\" stroke-linejoin=\"round\"";
    if (!s.dash.empty()) out += " stroke-dasharray=\"" + s.dash + "\"";
    out += " points=\"" + points + "\"/>\n";
    if (!markers.empty()) out += "<g fill=\"" + s.color + "\">" + markers + "</g>\n";
  }

  // Legend rows to the right of the panel, as many as fit; the rest summarized in one row.
  void legend(std::string& out, const std::vector<Series>& series) const {
    const auto fit = static_cast<std::size_t>(std::max(2.0, std::floor(height_ / kLegendRow)));
    const std::size_t shown = series.size() <= fit ? series.size() : fit - 1;
    for (std::size_t i = 0; i < shown; ++i) {
      const Series& s = series[i];
      const double y = top_ + 8 + kLegendRow * static_cast<double>(i);
      out += "<line x1=\"" + num(kLegendLeft) + "\" y1=\"" + num(y) + "\" x2=\"" + num(kLegendLeft + 24) +
             "\" y2=\"" + num(y) + "\" stroke=\"" + s.color + "\" stroke-width=\"" + num(s.width) + "\"";
      if (!s.dash.empty()) out += " stroke-dasharray=\"" + s.dash + "\"";
      out += "/>\n<text x=\"" + num(kLegendLeft + 30) + "\" y=\"" + num(y + 4) + "\">" + xml_escape(s.label) +
             "</text>\n<text x=\"" + num(kLegendValueRight) + "\" y=\"" + num(y + 4) +
             "\" text-anchor=\"end\">" + xml_escape(s.value) + "</text>\n";
    }
    if (shown < series.size())
      out += "<text x=\"" + num(kLegendLeft + 30) + "\" y=\"" +
             num(top_ + 12 + kLegendRow * static_cast<double>(shown)) + "\" fill=\"#666\">… " +
             std::to_string(series.size() - shown) + " more</text>\n";
  }

 private:
  static constexpr double kMargin = 0.03;  // of the range, on each side
  double top_, height_, left_, width_;
  std::string x_title_;
  Axis x_, y_;
  double x_pad_, y_pad_;
};

// The finite values of all series, as [min, max]; {+inf, -inf} when there are none.
std::pair<double, double> finite_range(const std::vector<Series>& series) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const Series& s : series)
    for (double v : s.y)
      if (std::isfinite(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  return {lo, hi};
}

// The last finite value of a series, formatted, or "–" when it has none.
std::string last_value(const std::vector<double>& y, int decimals, const std::string& suffix) {
  for (auto it = y.rbegin(); it != y.rend(); ++it)
    if (std::isfinite(*it)) return num(*it, decimals) + suffix;
  return "–";
}

std::vector<Series> accuracy_series(const std::vector<EpochMetrics>& epochs) {
  std::size_t members = 0;
  for (const EpochMetrics& m : epochs) members = std::max(members, m.member_test_accuracy.size());
  std::vector<Series> series;
  Series ens = make_series("ensemble", "#000000", "", 3.2, 3.6);
  for (const EpochMetrics& m : epochs) ens.y.push_back(100 * m.ensemble_test_accuracy);
  ens.label = "ensemble";
  ens.value = last_value(ens.y, 2, " %");
  series.push_back(ens);
  for (std::size_t i = 0; i < members; ++i) {
    Series s =
        make_series("member", kPalette[i % kPalette.size()], kDashes[(i / kPalette.size()) % kDashes.size()],
                    1.3, epochs.size() <= 3 ? 3.2 : 2.2);
    for (const EpochMetrics& m : epochs)
      s.y.push_back(i < m.member_test_accuracy.size() ? 100 * m.member_test_accuracy[i]
                                                      : std::numeric_limits<double>::quiet_NaN());
    s.label = "member " + std::to_string(i);
    s.value = last_value(s.y, 2, " %");
    series.push_back(s);
  }
  return series;
}

std::vector<Series> loss_series(const std::vector<EpochMetrics>& epochs) {
  Series train = make_series("train-loss", "#1f5fa8", "", 2.0, 3.0);
  Series test = make_series("test-loss", "#d2691e", "6 3", 2.0, 3.0);
  for (const EpochMetrics& m : epochs) {
    train.y.push_back(m.train_loss);
    test.y.push_back(m.test_loss);
  }
  train.label = "train";
  train.value = last_value(train.y, 4, "");
  test.label = epochs.empty() || epochs.front().evaluated_on == "test" ? "test (member mean)"
                                                                      : "validation (member mean)";
  test.value = last_value(test.y, 4, "");
  return {train, test};
}

// (c): per non-empty confidence bin, accuracy against mean confidence, for the ensemble and the best member.
void reliability_panel(std::string& out, const EpochMetrics& last) {
  const Panel panel(Frame{kCalibrationTop, kReliabilityHeight, kReliabilityLeft, kReliabilityWidth, "confidence"},
                    Axis{0, 1, 0.2}, Axis{0, 1, 0.2});
  panel.axes(out, "(c) Reliability, epoch " + std::to_string(last.epoch), "accuracy");
  // How many test images each of the ensemble's confidence bins holds: a grey bar per non-empty bin along
  // the bottom (a fifth of the panel for the fullest bin), its count above it and on hover.
  const std::vector<ReliabilityBin>& bins = last.ensemble_calibration.bins;
  double most = 0;
  for (const ReliabilityBin& b : bins) most = std::max(most, b.count);
  for (std::size_t i = 0; i < bins.size() && most > 0; ++i) {
    if (!(bins[i].count > 0)) continue;
    const double lo = static_cast<double>(i) / static_cast<double>(bins.size());
    const double hi = static_cast<double>(i + 1) / static_cast<double>(bins.size());
    const double top = panel.py(0.2 * bins[i].count / most);
    const std::string count = num(bins[i].count, 0);
    out += "<rect class=\"reliability-count\" x=\"" + num(panel.px(lo) + 1) + "\" y=\"" + num(top) + "\" width=\"" +
           num(panel.px(hi) - panel.px(lo) - 2) + "\" height=\"" + num(panel.py(0) - top) +
           "\" fill=\"#dcdcdc\"><title>" + count + " images with confidence in [" + num(lo, 3) + ", " + num(hi, 3) +
           ")</title></rect>\n";
    out += "<text class=\"reliability-count\" x=\"" + num((panel.px(lo) + panel.px(hi)) / 2) + "\" y=\"" +
           num(top - 3) + "\" text-anchor=\"middle\" font-size=\"9\" fill=\"#777777\">" + count + "</text>\n";
  }
  panel.guide(out, 0, 0, 1, 1);
  const std::size_t best = best_member(last);
  struct Curve {
    const Calibration* c;
    Series s;
  };
  std::vector<Curve> curves;
  Curve ens{&last.ensemble_calibration, make_series("reliability-ensemble", "#000000", "", 2.6, 3.2)};
  ens.s.label = "ensemble";
  ens.s.value = "ECE " + num(last.ensemble_calibration.ece, 4);
  curves.push_back(ens);
  if (best < last.member_calibration.size() && !last.member_calibration[best].bins.empty()) {
    Curve mem{&last.member_calibration[best], make_series("reliability-member", kPalette[best % kPalette.size()], "6 3",
                                                         1.8, 2.6)};
    mem.s.label = "best member (" + std::to_string(best) + ")";
    mem.s.value = "ECE " + num(last.member_calibration[best].ece, 4);
    curves.push_back(mem);
  }
  std::vector<Series> legend;
  for (Curve& c : curves) {
    std::vector<double> x;
    for (const ReliabilityBin& b : c.c->bins)
      if (b.count > 0) {
        x.push_back(b.confidence);
        c.s.y.push_back(b.accuracy);
      }
    panel.line(out, x, c.s);
    legend.push_back(c.s);
  }
  panel.legend_below(out, legend);
}

// (d) and (e): the ensemble of the first k members, k = 1..M: test accuracy, then NLL and ECE.
void size_panels(std::string& out, const std::vector<SizePoint>& curve) {
  std::vector<double> k;
  Series acc = make_series("size-accuracy", "#000000", "", 2.2, 3.0);
  Series nll = make_series("size-nll", "#1f5fa8", "", 2.0, 3.0);
  Series ece = make_series("size-ece", "#d2691e", "6 3", 2.0, 3.0);
  for (const SizePoint& p : curve) {
    k.push_back(p.members);
    acc.y.push_back(100 * p.accuracy);
    nll.y.push_back(p.calibration.nll);
    ece.y.push_back(p.calibration.ece);
  }
  acc.label = "test accuracy";
  acc.value = last_value(acc.y, 2, " %");
  nll.label = "NLL";
  nll.value = last_value(nll.y, 4, "");
  ece.label = "ECE";
  ece.value = last_value(ece.y, 4, "");
  const Axis k_axis = epoch_axis(curve.front().members, curve.back().members);
  auto [acc_lo, acc_hi] = finite_range({acc});
  if (acc_lo > acc_hi) acc_lo = acc_hi = 0;
  auto [v_lo, v_hi] = finite_range({nll, ece});
  if (v_lo > v_hi) v_lo = v_hi = 0;
  const Panel top(Frame{kCalibrationTop, kSizeHeight, kSizeLeft, kSizeWidth, "members in the ensemble"}, k_axis,
                  percent_axis(acc_lo, acc_hi));
  top.axes(out, "(d) Ensemble of the first k members", "accuracy (%)");
  top.line(out, k, acc);
  const Panel bottom(Frame{kCalibrationTop + kSizeGap, kSizeHeight, kSizeLeft, kSizeWidth, "members in the ensemble"},
                     k_axis, value_axis(std::min(0.0, v_lo), v_hi));
  bottom.axes(out, "(e) NLL and ECE of the first k members", "");
  bottom.line(out, k, nll);
  bottom.line(out, k, ece);
  bottom.legend_below(out, {acc, nll, ece});
}

std::string svg_open(double height) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
         num(kWidth, 0) + "\" height=\"" + num(height, 0) + "\" viewBox=\"0 0 " + num(kWidth, 0) + " " +
         num(height, 0) +
         "\" font-family=\"sans-serif\" font-size=\"12\" fill=\"#222\">\n<rect width=\"100%\" " +
         "height=\"100%\" fill=\"#ffffff\"/>\n";
}

}  // namespace

std::string accuracy_plot_svg(const std::vector<EpochMetrics>& epochs, const PlotExtras& extras) {
  if (epochs.empty())
    return svg_open(120) + "<text x=\"" + num(kWidth / 2) +
           "\" y=\"64\" text-anchor=\"middle\" font-size=\"16\" fill=\"#666\">no epochs yet</text>\n</svg>\n";
  std::vector<double> x;
  for (const EpochMetrics& m : epochs) x.push_back(m.epoch);
  const auto [first, last] = std::minmax_element(x.begin(), x.end());
  const Axis x_axis = epoch_axis(static_cast<int>(*first), static_cast<int>(*last));
  const std::vector<Series> acc = accuracy_series(epochs);
  const std::vector<Series> loss = loss_series(epochs);
  auto [acc_lo, acc_hi] = finite_range(acc);
  if (acc_lo > acc_hi) acc_lo = acc_hi = 0;
  auto [loss_lo, loss_hi] = finite_range(loss);
  if (loss_lo > loss_hi) loss_lo = loss_hi = 0;
  const Panel top(kTopPanelTop, kTopPanelHeight, x_axis, percent_axis(acc_lo, acc_hi));
  const Panel bottom(kBottomPanelTop, kBottomPanelHeight, x_axis, value_axis(loss_lo, loss_hi));

  const std::size_t members = acc.size() - 1;
  const std::string set = epochs.front().evaluated_on;  // "test", or "validation" (--validation-split)
  const bool reliability = !epochs.back().member_calibration.empty();
  const bool size_curve = !extras.size_curve.empty();
  std::string out = svg_open(reliability || size_curve ? kCalibrationHeight : kHeight);
  out += "<text x=\"" + num(kPlotLeft) + "\" y=\"28\" font-size=\"17\" font-weight=\"bold\">" +
         xml_escape(extras.dataset) + " ensemble: " + std::to_string(members) +
         (members == 1 ? " member, " : " members, ") + "epoch " + std::to_string(epochs.back().epoch) +
         " — ensemble " + set + " accuracy " + last_value(acc[0].y, 2, " %") + "</text>\n";
  top.axes(out, set == "test" ? "(a) Test accuracy" : "(a) Validation accuracy", set + " accuracy (%)");
  for (std::size_t i = 1; i < acc.size(); ++i) top.line(out, x, acc[i]);
  top.line(out, x, acc[0]);  // the ensemble on top
  top.legend(out, acc);
  bottom.axes(out, "(b) Loss", "cross-entropy");
  for (const Series& s : loss) bottom.line(out, x, s);
  bottom.legend(out, loss);
  if (reliability) reliability_panel(out, epochs.back());
  if (size_curve) size_panels(out, extras.size_curve);
  return out + "</svg>\n";
}

}  // namespace pmap::ensemble
