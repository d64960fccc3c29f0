// Metrics files (JSON, CSV), the atomic text-file writer they share, and the final per-member table.
// The SVG plot lives in report_svg.cpp.
#include "report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include <pmap/error.h>

namespace pmap::ensemble {
namespace {

// Shortest text that strtod reads back to the same double.
std::string shortest(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string fixed(double v, int decimals) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, decimals);
  return std::string(buf, r.ptr);
}

[[noreturn]] void io_error(const std::filesystem::path& path, const std::string& what, int err) {
  throw IoError(path.string() + ": " + what + ": " + std::strerror(err));
}

// Writes all of `data` to `fd`, retrying short writes and EINTR. Returns 0 or the errno.
int write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t w = ::write(fd, data.data(), data.size());
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    data.remove_prefix(static_cast<std::size_t>(w));
  }
  return 0;
}

std::string pad_left(std::string s, std::size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

}  // namespace

io::Json metrics_json(const io::Json& config, const std::vector<EpochMetrics>& epochs,
                      const std::vector<SizePoint>& size_curve, const io::Json& extra) {
  io::Json doc = io::Json::object();
  doc["config"] = config;
  io::Json list = io::Json::array();
  for (const EpochMetrics& m : epochs) list.push_back(io::epoch_json(m));
  doc["epochs"] = std::move(list);
  doc["final"] = epochs.empty() ? io::Json(nullptr) : io::epoch_json(epochs.back());
  if (!size_curve.empty()) doc["ensemble_size_curve"] = io::size_curve_json(size_curve);
  if (extra.is_object())
    for (const auto& [key, value] : extra.items()) doc[key] = value;
  return doc;
}

namespace {

// The calibration metrics of the CSV, their column names' suffixes and accessors.
struct CalibrationColumn {
  const char* name;
  double Calibration::*field;
};
constexpr CalibrationColumn kCalibrationColumns[] = {
    {"nll", &Calibration::nll}, {"brier", &Calibration::brier}, {"ece", &Calibration::ece},
    {"entropy", &Calibration::entropy}};

}  // namespace

std::string metrics_csv(const std::vector<EpochMetrics>& epochs) {
  std::size_t members = 0;
  bool calibrated = false;
  for (const EpochMetrics& m : epochs) {
    members = std::max(members, m.member_test_accuracy.size());
    calibrated = calibrated || !m.member_calibration.empty();
  }
  std::string out =
      "epoch,train_loss,train_accuracy,test_loss,ensemble_test_accuracy,seconds,eval_seconds,"
      "model_images_per_second";
  for (std::size_t i = 0; i < members; ++i) out += ",member_" + std::to_string(i) + "_test_accuracy";
  if (calibrated) {
    for (const auto& c : kCalibrationColumns) out += std::string(",ensemble_test_") + c.name;
    for (const auto& c : kCalibrationColumns)
      for (std::size_t i = 0; i < members; ++i) out += ",member_" + std::to_string(i) + "_test_" + c.name;
  }
  // Epochs measured on a validation set (--validation-split) name their columns val_... for test_...
  if (!epochs.empty() && epochs.front().evaluated_on == "validation")
    for (std::size_t at = out.find("test"); at != std::string::npos; at = out.find("test", at + 3))
      out.replace(at, 4, "val");
  out += '\n';
  for (const EpochMetrics& m : epochs) {
    out += std::to_string(m.epoch);
    for (double v : {m.train_loss, m.train_accuracy, m.test_loss, m.ensemble_test_accuracy, m.seconds,
                     m.eval_seconds, m.model_images_per_second})
      out += ',' + shortest(v);
    for (std::size_t i = 0; i < members; ++i) {
      out += ',';
      if (i < m.member_test_accuracy.size()) out += shortest(m.member_test_accuracy[i]);
    }
    if (calibrated) {
      const bool has = !m.member_calibration.empty();
      for (const auto& c : kCalibrationColumns) out += ',' + (has ? shortest(m.ensemble_calibration.*c.field) : "");
      for (const auto& c : kCalibrationColumns)
        for (std::size_t i = 0; i < members; ++i) {
          out += ',';
          if (i < m.member_calibration.size()) out += shortest(m.member_calibration[i].*c.field);
        }
    }
    out += '\n';
  }
  return out;
}

namespace {

// Member m's own index: ids[m], or m.
std::string member_id(const std::vector<int>& ids, std::size_t m) {
  return std::to_string(m < ids.size() ? static_cast<std::size_t>(ids[m]) : m);
}

}  // namespace

std::string predictions_csv(const Predictions& p, const std::vector<int>& ids) {
  std::string out = "index,label,prediction,probability,entropy";
  for (std::size_t m = 0; m < p.votes.size(); ++m) out += ",member_" + member_id(ids, m);
  out += '\n';
  for (std::size_t i = 0; i < p.predicted.size(); ++i) {
    out += std::to_string(i) + ',' + std::to_string(p.label[i]) + ',' + std::to_string(p.predicted[i]) + ',' +
           shortest(static_cast<double>(p.probability[i])) + ',' + shortest(static_cast<double>(p.entropy[i]));
    for (const auto& votes : p.votes) out += ',' + std::to_string(votes[i]);
    out += '\n';
  }
  return out;
}

void write_predictions_csv(const std::filesystem::path& path, const Predictions& p, const std::vector<int>& ids) {
  write_text_file_atomic(path, predictions_csv(p, ids));
}

void write_text_file_atomic(const std::filesystem::path& path, std::string_view contents) {
  static std::atomic<unsigned> counter{0};
  std::filesystem::path temp = path;
  temp += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error(path, "cannot create temp file " + temp.string(), errno);
  int err = write_all(fd, contents);
  std::string what = "write to temp file " + temp.string() + " failed";
  if (err == 0 && ::fsync(fd) != 0) {
    err = errno;
    what = "fsync of temp file " + temp.string() + " failed";
  }
  if (::close(fd) != 0 && err == 0) {
    err = errno;
    what = "close of temp file " + temp.string() + " failed";
  }
  if (err == 0 && ::rename(temp.c_str(), path.c_str()) != 0) {
    err = errno;
    what = "cannot rename " + temp.string() + " over it";
  }
  if (err != 0) {
    ::unlink(temp.c_str());
    io_error(path, what, err);
  }
}

void write_metrics_json(const std::filesystem::path& path, const io::Json& config,
                        const std::vector<EpochMetrics>& epochs, const std::vector<SizePoint>& size_curve,
                        const io::Json& extra) {
  write_text_file_atomic(path, io::dump_json(metrics_json(config, epochs, size_curve, extra), 2) + "\n");
}

void write_metrics_csv(const std::filesystem::path& path, const std::vector<EpochMetrics>& epochs) {
  write_text_file_atomic(path, metrics_csv(epochs));
}

void write_plot_svg(const std::filesystem::path& path, const std::vector<EpochMetrics>& epochs,
                    const PlotExtras& extras) {
  write_text_file_atomic(path, accuracy_plot_svg(epochs, extras));
}

std::string final_table(const EpochMetrics& last, int members_per_device, const std::vector<int>& ids) {
  const std::vector<double>& acc = last.member_test_accuracy;
  const bool devices = members_per_device > 0;
  const bool calibrated = !last.member_calibration.empty();
  constexpr std::size_t label_width = 8;
  constexpr std::size_t device_width = 8;
  constexpr std::size_t value_width = 15;
  constexpr std::size_t metric_width = 9;
  auto metrics = [&](const Calibration* c) {
    std::string cells;
    if (!calibrated) return cells;
    for (double v : {c ? c->nll : 0.0, c ? c->brier : 0.0, c ? c->ece : 0.0, c ? c->entropy : 0.0})
      cells += pad_left(c ? fixed(v, 4) : "", metric_width);
    return cells;
  };
  auto row = [&](const std::string& label, const std::string& device, double fraction, const Calibration* c,
                 const std::string& note) {
    std::string line = pad_left(label, label_width);
    if (devices) line += pad_left(device, device_width);
    line += pad_left(fixed(100.0 * fraction, 2) + " %", value_width) + metrics(c);
    if (!note.empty()) line += "   " + note;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + '\n';
  };
  std::string out = pad_left("member", label_width);
  if (devices) out += pad_left("device", device_width);
  out += pad_left("test accuracy", value_width);
  if (calibrated)
    for (const char* h : {"NLL", "Brier", "ECE", "entropy"}) out += pad_left(h, metric_width);
  out += '\n';
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const std::string device =
        devices ? std::to_string(i / static_cast<std::size_t>(members_per_device)) : "";
    out += row(member_id(ids, i), device, acc[i],
               i < last.member_calibration.size() ? &last.member_calibration[i] : nullptr, "");
  }
  if (acc.empty()) return out + row("ensemble", "", last.ensemble_test_accuracy, &last.ensemble_calibration, "");
  const auto best = std::max_element(acc.begin(), acc.end());
  const double mean = std::accumulate(acc.begin(), acc.end(), 0.0) / static_cast<double>(acc.size());
  Calibration mean_calibration;
  for (const Calibration& c : last.member_calibration) {
    const double w = 1.0 / static_cast<double>(last.member_calibration.size());
    mean_calibration.nll += c.nll * w, mean_calibration.brier += c.brier * w;
    mean_calibration.ece += c.ece * w, mean_calibration.entropy += c.entropy * w;
  }
  const auto best_member = static_cast<std::size_t>(best - acc.begin());
  out += row("best", "", *best, nullptr, "(member " + member_id(ids, best_member) + ")");
  out += row("mean", "", mean, &mean_calibration, "");
  const double gain = 100.0 * (last.ensemble_test_accuracy - *best);
  const std::string note = gain >= 0 ? "(+" + fixed(gain, 2) + " over the best member)"
                                     : "(" + fixed(gain, 2) + " under the best member)";
  return out + row("ensemble", "", last.ensemble_test_accuracy, &last.ensemble_calibration, note);
}

}  // namespace pmap::ensemble
