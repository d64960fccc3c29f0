// Tests of the run reports: metrics JSON and CSV (values read back bit-exact), atomic writes and their
// errors, the SVG plot (well-formed, one polyline per line), the progress bar and the final table.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "examples/mnist_ensemble/progress.h"
#include "examples/mnist_ensemble/report.h"
#include "pmap/error.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace fs = std::filesystem;
using pmap::ensemble::EpochMetrics;
using pmap::io::Json;
using pmap::ensemble::ProgressBar;
using pmap::ensemble::ProgressMode;

namespace {

// Epoch e of a run with `members` members; values with long binary expansions to test round trips.
EpochMetrics make_epoch(int e, int members) {
  EpochMetrics m;
  m.epoch = e;
  m.train_loss = 1.0 / (3.0 * e);
  m.train_accuracy = 1.0 - 0.1 / (e + 0.7);
  m.test_loss = 0.1 + 0.2 / e;
  for (int i = 0; i < members; ++i) m.member_test_accuracy.push_back(0.95 + 0.004 * e + 0.001 * i / 7.0);
  m.ensemble_test_accuracy = 0.96 + 0.004 * e;
  m.seconds = 12.3 + e / 9.0;
  m.eval_seconds = 1.0 / 7.0;
  m.model_images_per_second = 60000.0 * members / m.seconds;
  return m;
}

std::vector<EpochMetrics> make_run(int epochs, int members) {
  std::vector<EpochMetrics> run;
  for (int e = 1; e <= epochs; ++e) run.push_back(make_epoch(e, members));
  return run;
}

// A fresh empty directory under the system temp directory, removed on destruction.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "pmapcc_report_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + what.size())) ++n;
  return n;
}

// A small well-formedness check: tags nest and match, attributes are name="value" without '<' inside,
// text holds no raw '<' and every '&' starts an entity. Returns "" or what is wrong.
std::string xml_problem(const std::string& doc) {
  std::vector<std::string> open;
  std::size_t i = 0;
  auto name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == ':' || c == '_';
  };
  while (i < doc.size()) {
    if (doc[i] == '&') {
      const auto semi = doc.find(';', i);
      if (semi == std::string::npos || semi - i > 6) return "bare & at " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (doc[i] != '<') {
      ++i;
      continue;
    }
    if (doc.compare(i, 2, "<?") == 0) {
      i = doc.find("?>", i);
      if (i == std::string::npos) return "unterminated <?";
      i += 2;
      continue;
    }
    const bool closing = doc.compare(i, 2, "</") == 0;
    std::size_t j = i + (closing ? 2 : 1);
    const std::size_t name_start = j;
    while (j < doc.size() && name_char(doc[j])) ++j;
    const std::string name = doc.substr(name_start, j - name_start);
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    while (j < doc.size() && doc[j] != '>' && doc[j] != '/') {
      if (doc[j] == ' ' || doc[j] == '\n') {
        ++j;
        continue;
      }
      while (j < doc.size() && name_char(doc[j])) ++j;
      if (doc.compare(j, 2, "=\"") != 0) return "bad attribute in <" + name + "> at " + std::to_string(j);
      const auto end = doc.find('"', j + 2);
      if (end == std::string::npos || doc.find('<', j + 2) < end)
        return "bad attribute value in <" + name + ">";
      j = end + 1;
    }
    if (j >= doc.size()) return "unterminated tag <" + name + ">";
    if (closing) {
      if (open.empty() || open.back() != name) return "</" + name + "> does not close the open tag";
      open.pop_back();
    } else if (doc[j] == '/') {
      if (doc.compare(j, 2, "/>") != 0) return "stray / in <" + name + ">";
      ++j;
    } else {
      open.push_back(name);
    }
    i = j + 1;
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

bool have_xmllint() { return std::system("command -v xmllint >/dev/null 2>&1") == 0; }

// Everything written to a tmpfile so far.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += static_cast<char>(c);
  return s;
}

}  // namespace

TEST_CASE("report: metrics_json has the documented structure and reads back exactly") {
  const std::vector<EpochMetrics> run = make_run(3, 4);
  const Json config = {{"members", 4}, {"lr", 0.1}};
  const Json doc =
      pmap::io::parse_json(pmap::io::dump_json(pmap::ensemble::metrics_json(config, run), 2), "metrics.json");
  REQUIRE(doc.is_object());
  REQUIRE(doc.size() == 3);
  CHECK(doc.begin().key() == "config");
  CHECK(std::next(doc.begin()).key() == "epochs");
  CHECK(std::next(doc.begin(), 2).key() == "final");
  CHECK(doc["config"] == config);
  const Json& epochs = doc["epochs"];
  REQUIRE(epochs.size() == run.size());
  const std::vector<std::string> keys = {"epoch",     "train_loss",           "train_accuracy",
                                         "test_loss", "member_test_accuracy", "ensemble_test_accuracy",
                                         "seconds",   "eval_seconds",         "model_images_per_second"};
  for (std::size_t e = 0; e < run.size(); ++e) {
    const Json& o = epochs[e];
    const EpochMetrics& m = run[e];
    REQUIRE(o.size() == keys.size());
    for (std::size_t k = 0; k < keys.size(); ++k) CHECK(std::next(o.begin(), static_cast<long>(k)).key() == keys[k]);
    CHECK(o["epoch"].is_number_integer());
    CHECK(o["epoch"] == m.epoch);
    CHECK(o["train_loss"] == m.train_loss);
    CHECK(o["train_accuracy"] == m.train_accuracy);
    CHECK(o["test_loss"] == m.test_loss);
    CHECK(o["ensemble_test_accuracy"] == m.ensemble_test_accuracy);
    CHECK(o["seconds"] == m.seconds);
    CHECK(o["eval_seconds"] == m.eval_seconds);
    CHECK(o["model_images_per_second"] == m.model_images_per_second);
    CHECK(o["member_test_accuracy"] == Json(m.member_test_accuracy));
  }
  CHECK(doc["final"] == epochs.back());
}

TEST_CASE("report: metrics_json with no epochs, and non-finite values as null") {
  const Json empty = pmap::ensemble::metrics_json(Json::object(), {});
  CHECK(empty["epochs"].empty());
  CHECK(empty["final"].is_null());

  EpochMetrics diverged = make_epoch(1, 2);
  diverged.train_loss = std::numeric_limits<double>::quiet_NaN();
  diverged.member_test_accuracy[1] = std::numeric_limits<double>::infinity();
  const Json doc =
      pmap::io::parse_json(pmap::io::dump_json(pmap::ensemble::metrics_json(nullptr, {diverged})), "m.json");
  const Json& final_epoch = doc["final"];
  CHECK(final_epoch["train_loss"].is_null());
  CHECK(final_epoch["member_test_accuracy"][1].is_null());
  CHECK(final_epoch["test_loss"] == diverged.test_loss);
}

TEST_CASE("report: metrics_csv header, one row per epoch, values parse back exactly") {
  const std::vector<EpochMetrics> run = make_run(5, 3);
  const std::vector<std::string> lines = split(pmap::ensemble::metrics_csv(run), '\n');
  REQUIRE(lines.size() == run.size() + 2);  // header, rows, and the empty piece after the last '\n'
  CHECK(lines.back().empty());
  CHECK(lines[0] ==
        "epoch,train_loss,train_accuracy,test_loss,ensemble_test_accuracy,seconds,eval_seconds,"
        "model_images_per_second,member_0_test_accuracy,member_1_test_accuracy,member_2_test_accuracy");
  for (std::size_t e = 0; e < run.size(); ++e) {
    const EpochMetrics& m = run[e];
    const std::vector<std::string> cells = split(lines[e + 1], ',');
    REQUIRE(cells.size() == 11);
    CHECK(cells[0] == std::to_string(m.epoch));
    const std::vector<double> expected = {m.train_loss,
                                          m.train_accuracy,
                                          m.test_loss,
                                          m.ensemble_test_accuracy,
                                          m.seconds,
                                          m.eval_seconds,
                                          m.model_images_per_second,
                                          m.member_test_accuracy[0],
                                          m.member_test_accuracy[1],
                                          m.member_test_accuracy[2]};
    for (std::size_t k = 0; k < expected.size(); ++k)
      CHECK(std::strtod(cells[k + 1].c_str(), nullptr) == expected[k]);
  }
}

TEST_CASE("report: metrics_csv leaves missing member cells empty") {
  std::vector<EpochMetrics> run = make_run(2, 2);
  run[0].member_test_accuracy.resize(1);
  const std::vector<std::string> lines = split(pmap::ensemble::metrics_csv(run), '\n');
  CHECK(split(lines[1], ',').size() == 10);
  CHECK(split(lines[1], ',').back().empty());
  CHECK(!split(lines[2], ',').back().empty());
}

TEST_CASE("report: files are written atomically and replace older content") {
  TempDir dir;
  const std::vector<EpochMetrics> run = make_run(2, 2);
  const fs::path json = dir.path / "metrics.json", csv = dir.path / "metrics.csv",
                 svg = dir.path / "plot.svg";
  pmap::ensemble::write_text_file_atomic(json, "old content that is longer than the new one\n");
  pmap::ensemble::write_metrics_json(json, Json::object(), run);
  pmap::ensemble::write_metrics_csv(csv, run);
  pmap::ensemble::write_plot_svg(svg, run);
  CHECK(read_file(json) == pmap::io::dump_json(pmap::ensemble::metrics_json(Json::object(), run), 2) + "\n");
  CHECK(read_file(csv) == pmap::ensemble::metrics_csv(run));
  CHECK(read_file(svg) == pmap::ensemble::accuracy_plot_svg(run));
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) {
    ++files;
    CHECK(entry.path().string().find(".tmp") == std::string::npos);  // no temp file left behind
  }
  CHECK(files == 3);
}

TEST_CASE("report: a write error names the path and the OS error") {
  TempDir dir;
  const fs::path not_a_dir = dir.path / "regular_file";
  pmap::ensemble::write_text_file_atomic(not_a_dir, "x");
  const fs::path target = not_a_dir / "metrics.json";
  const std::string expected_start = target.string() + ": cannot create temp file ";
  auto check_error = [&](auto&& write) {
    try {
      write();
      FAIL("no IoError");
    } catch (const pmap::IoError& e) {
      const std::string what = e.what();
      CHECK(what.rfind(expected_start, 0) == 0);
      CHECK(what.find(std::strerror(ENOTDIR)) != std::string::npos);
    }
  };
  check_error([&] { pmap::ensemble::write_metrics_json(target, Json::object(), {}); });
  check_error([&] { pmap::ensemble::write_metrics_csv(target, {}); });
  check_error([&] { pmap::ensemble::write_plot_svg(target, {}); });
  CHECK(read_file(not_a_dir) == "x");
}

TEST_CASE("report: the SVG plot is well-formed with one polyline per member and the ensemble") {
  TempDir dir;
  const bool xmllint = have_xmllint();
  if (!xmllint) MESSAGE("xmllint not found: only the built-in well-formedness check runs");
  for (int members : {1, 3, 8, 20}) {
    for (int epochs : {0, 1, 2, 12}) {
      CAPTURE(members);
      CAPTURE(epochs);
      const std::string svg = pmap::ensemble::accuracy_plot_svg(make_run(epochs, members));
      CHECK(xml_problem(svg) == "");
      CHECK(svg.find("<script") == std::string::npos);
      CHECK(svg.find("href") == std::string::npos);  // nothing external
      if (epochs == 0) {
        CHECK(svg.find("no epochs yet") != std::string::npos);
        CHECK(count(svg, "<polyline") == 0);
      } else {
        CHECK(count(svg, "<polyline class=\"member\"") == static_cast<std::size_t>(members));
        CHECK(count(svg, "<polyline class=\"ensemble\"") == 1);
        CHECK(count(svg, "<polyline class=\"train-loss\"") == 1);
        CHECK(count(svg, "<polyline class=\"test-loss\"") == 1);
        // Each member line has one point per epoch: x,y pairs separated by spaces.
        const auto at = svg.find("<polyline class=\"member\"");
        const auto pts = svg.find("points=\"", at) + 8;
        const std::string points = svg.substr(pts, svg.find('"', pts) - pts);
        CHECK(split(points, ' ').size() == static_cast<std::size_t>(epochs));
        if (epochs == 1) CHECK(count(svg, "<circle") == static_cast<std::size_t>(members + 3));
      }
      if (xmllint) {
        const fs::path file = dir.path / "plot.svg";
        pmap::ensemble::write_text_file_atomic(file, svg);
        CHECK(std::system(("xmllint --noout '" + file.string() + "'").c_str()) == 0);
      }
    }
  }
}

TEST_CASE("report: parse_progress_mode") {
  using pmap::ensemble::parse_progress_mode;
  CHECK(parse_progress_mode("auto") == ProgressMode::automatic);
  CHECK(parse_progress_mode("bar") == ProgressMode::bar);
  CHECK(parse_progress_mode("plain") == ProgressMode::plain);
  CHECK(parse_progress_mode("none") == ProgressMode::none);
  try {
    parse_progress_mode("Bar");
    FAIL("no ValueError");
  } catch (const pmap::ValueError& e) {
    CHECK(std::string(e.what()).find("\"Bar\"") != std::string::npos);
  }
}

namespace {

EpochMetrics summary_epoch() {
  EpochMetrics m;
  m.epoch = 3;
  m.train_loss = 0.0312;
  m.train_accuracy = 0.9901;
  m.test_loss = 0.029;
  m.member_test_accuracy = {0.991, 0.99052};
  m.ensemble_test_accuracy = 0.9931;
  m.seconds = 12.34;
  m.model_images_per_second = 20480.2;
  return m;
}

const char* const kSummary =
    "epoch 3/10  train_loss 0.0312  train_acc 99.01%  test_loss 0.0290  test_acc [99.10 99.05]  "
    "ensemble 99.31%  12.3 s  20480 img/s";

}  // namespace

TEST_CASE("progress: plain mode writes only the epoch summary line") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    ProgressBar bar(f, ProgressMode::plain, 10);
    bar.begin_epoch(3, 100);
    for (int s = 1; s <= 100; ++s) bar.update(s, 0.5, 1000);
    bar.end_epoch(summary_epoch());
  }
  CHECK(contents(f) == std::string(kSummary) + "\n");
  std::fclose(f);
}

TEST_CASE("progress: auto mode on a file is plain, none writes nothing") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    ProgressBar automatic(f, ProgressMode::automatic, 10);
    CHECK(automatic.mode() == ProgressMode::plain);
    ProgressBar none(f, ProgressMode::none, 10);
    none.begin_epoch(1, 5);
    none.update(5, 0.1, 10);
    none.end_epoch(summary_epoch());
  }
  CHECK(contents(f).empty());
  std::fclose(f);
  CHECK_THROWS_AS(ProgressBar(nullptr, ProgressMode::plain, 1), pmap::ValueError);
  CHECK_THROWS_AS(ProgressBar(stderr, ProgressMode::plain, 0), pmap::ValueError);
}

TEST_CASE("progress: bar mode redraws at most every 100 ms and always draws the final step") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  int now_ms = 0;
  ProgressBar bar(f, ProgressMode::bar, 10, [&] { return now_ms / 1000.0; });
  bar.begin_epoch(3, 10);
  for (int s = 1; s <= 10; ++s) {  // step s finishes at 30 * s ms
    now_ms = 30 * s;
    bar.update(s, 0.5 / s, 2048.0 * s);
  }
  // Drawn: step 1 (first), 5 (150 ms, >= 100 after 30), 9 (270 ms, >= 100 after 150), 10 (final).
  const std::vector<std::string> draws = split(contents(f), '\r');
  REQUIRE(draws.size() == 5);
  CHECK(draws[0].empty());
  CHECK(draws[1].rfind("Epoch 3/10  1/10 [" + std::string(3, '=') + ">", 0) == 0);
  CHECK(draws[2].rfind("Epoch 3/10  5/10 [" + std::string(15, '=') + ">", 0) == 0);
  CHECK(draws[3].rfind("Epoch 3/10  9/10 [" + std::string(27, '=') + ">", 0) == 0);
  // The final line is shorter than the one before (no ETA): blanks cover the leftover characters.
  const std::string final_line =
      "Epoch 3/10  10/10 [" + std::string(30, '=') + "] - 0.3 s - 30 ms/step - 20480 img/s - loss: 0.0500";
  REQUIRE(draws[4].size() == draws[3].size());
  CHECK(draws[4] == final_line + std::string(draws[3].size() - final_line.size(), ' '));
  CHECK(draws[2].find(" - ETA: 0:00:00 - 30 ms/step - 10240 img/s - loss: 0.1000") != std::string::npos);
  for (std::size_t i = 2; i < draws.size(); ++i) CHECK(draws[i].size() >= draws[i - 1].size());

  bar.end_epoch(summary_epoch());
  CHECK(split(contents(f), '\r').back() == draws[4] + "\n" + kSummary + "\n");
  std::fclose(f);
}

TEST_CASE("progress: the bar shows the running accuracy, and that the evaluation runs until the epoch ends") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  double now = 0;
  ProgressBar bar(f, ProgressMode::bar, 10, [&] { return now; });
  bar.begin_epoch(1, 2);
  now = 0.5;
  bar.update(1, 1.0, 100.0, 0.25);
  now = 1.0;
  bar.update(2, 0.5, 100.0, 0.625);
  bar.evaluating();
  std::vector<std::string> draws = split(contents(f), '\r');
  REQUIRE(draws.size() == 4);
  CHECK(draws[1].find(" - loss: 1.0000 - accuracy: 0.2500") != std::string::npos);
  const std::string done = "Epoch 1/10  2/2 [" + std::string(30, '=') + "] - 1.0 s - 500 ms/step - 100 img/s - loss: "
                           "0.5000 - accuracy: 0.6250";
  CHECK(draws[3] == done + " - evaluating the test set");
  bar.end_epoch(summary_epoch());
  draws = split(contents(f), '\r');
  REQUIRE(draws.size() == 5);  // the final state again, the note blanked out, then the summary
  CHECK(draws[4] == done + std::string(std::string(" - evaluating the test set").size(), ' ') + "\n" + kSummary + "\n");
  std::fclose(f);
  // A run with a validation split evaluates its epochs on the validation set, and says so.
  std::FILE* g = std::tmpfile();
  REQUIRE(g != nullptr);
  {
    ProgressBar validated(g, ProgressMode::bar, 10, [&] { return now; });
    validated.begin_epoch(1, 1);
    validated.update(1, 0.5, 100.0, 0.5);
    validated.evaluating("validation");
    CHECK(split(contents(g), '\r').back().ends_with(" - evaluating the validation set"));
  }  // the bar closes its line on destruction: before the file is closed
  std::fclose(g);
}

TEST_CASE("metrics: epochs evaluated on a validation set say so in the JSON and name their CSV columns val_") {
  EpochMetrics m = summary_epoch();
  m.evaluated_on = "validation";
  const pmap::io::Json j = pmap::io::epoch_json(m);
  CHECK(j.at("evaluated_on") == "validation");
  CHECK_FALSE(pmap::io::epoch_json(summary_epoch()).contains("evaluated_on"));  // the test set: as before
  const pmap::io::JsonView v(j, "test");
  CHECK(pmap::io::epoch_metrics_from_json(v).evaluated_on == "validation");
  const std::string csv = pmap::ensemble::metrics_csv({m});
  const std::string header = csv.substr(0, csv.find('\n'));
  CHECK(header.find("val_loss") != std::string::npos);
  CHECK(header.find("ensemble_val_accuracy") != std::string::npos);
  CHECK(header.find("test") == std::string::npos);
  pmap::io::Json bad = j;
  bad["evaluated_on"] = "train";
  CHECK_THROWS_WITH_AS(pmap::io::epoch_metrics_from_json(pmap::io::JsonView(bad, "m.json")),
                       doctest::Contains("evaluated_on: is not test or validation"), pmap::DataError);
}

TEST_CASE("progress: bar ETA, an undrawn last update drawn at end_epoch, line closed on destruction") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  double now = 100;
  {
    ProgressBar bar(f, ProgressMode::bar, 2, [&] { return now; });
    bar.begin_epoch(1, 100);
    now = 140;  // 40 s per step: 99 steps left = 3960 s
    bar.update(1, 2.0, 3.0);
    CHECK(contents(f).find(" - ETA: 1:06:00 - 40000 ms/step - 3 img/s - loss: 2.0000") != std::string::npos);
    now = 140.05;
    bar.update(2, 1.5, 3.0);  // throttled
    CHECK(split(contents(f), '\r').size() == 2);
    bar.end_epoch(summary_epoch());  // draws step 2, then the summary
    const std::vector<std::string> draws = split(contents(f), '\r');
    REQUIRE(draws.size() == 3);
    CHECK(draws[2].rfind("Epoch 1/2  2/100 [>", 0) == 0);
    CHECK(draws[2].find("\nepoch 3/2  train_loss 0.0312") != std::string::npos);
    bar.begin_epoch(2, 4);
    bar.update(1, 1.0, 3.0);
  }
  const std::string out = contents(f);
  CHECK(out.substr(out.rfind('\r')).rfind("\rEpoch 2/2  1/4 [", 0) == 0);
  CHECK(out.back() == '\n');
  std::fclose(f);
}

TEST_CASE("report: final_table lists members, best, mean and the ensemble's gain") {
  EpochMetrics m;
  m.member_test_accuracy = {0.9912, 0.9920, 0.9916};
  m.ensemble_test_accuracy = 0.9938;
  CHECK(pmap::ensemble::final_table(m) ==
        "  member  test accuracy\n"
        "       0        99.12 %\n"
        "       1        99.20 %\n"
        "       2        99.16 %\n"
        "    best        99.20 %   (member 1)\n"
        "    mean        99.16 %\n"
        "ensemble        99.38 %   (+0.18 over the best member)\n");
  CHECK(pmap::ensemble::final_table(m, 2) ==
        "  member  device  test accuracy\n"
        "       0       0        99.12 %\n"
        "       1       0        99.20 %\n"
        "       2       1        99.16 %\n"
        "    best                99.20 %   (member 1)\n"
        "    mean                99.16 %\n"
        "ensemble                99.38 %   (+0.18 over the best member)\n");
  m.ensemble_test_accuracy = 0.9910;
  CHECK(pmap::ensemble::final_table(m).find("99.10 %   (-0.10 under the best member)") != std::string::npos);
}

namespace {

// A calibration whose fields encode (member, epoch), with 15 bins, bin 3 empty.
pmap::ensemble::Calibration make_calibration(int member, int epoch) {
  pmap::ensemble::Calibration c;
  c.nll = 0.1 + member / 7.0 + epoch / 11.0;
  c.brier = 0.05 + member / 13.0;
  c.ece = 0.01 + epoch / 17.0;
  c.entropy = 0.2 + member / 19.0;
  for (int b = 0; b < 15; ++b)
    c.bins.push_back(b == 3 ? pmap::ensemble::ReliabilityBin{0, std::nan(""), std::nan("")}
                            : pmap::ensemble::ReliabilityBin{10.0 + b, (b + 0.5) / 15, (b + 0.3) / 15});
  return c;
}

std::vector<EpochMetrics> make_calibrated_run(int epochs, int members) {
  std::vector<EpochMetrics> run = make_run(epochs, members);
  for (EpochMetrics& m : run) {
    for (int i = 0; i < members; ++i) m.member_calibration.push_back(make_calibration(i, m.epoch));
    m.ensemble_calibration = make_calibration(99, m.epoch);
  }
  return run;
}

}  // namespace

TEST_CASE("report: calibration metrics in the JSON, read back exactly, empty bins as null") {
  const std::vector<EpochMetrics> run = make_calibrated_run(2, 3);
  std::vector<pmap::ensemble::SizePoint> curve;
  for (int k = 1; k <= 3; ++k) curve.push_back({k, 0.9 + k / 100.0, make_calibration(k, 9)});
  const Json doc =
      pmap::io::parse_json(pmap::io::dump_json(pmap::ensemble::metrics_json(Json::object(), run, curve), 2), "m.json");
  const Json& last = doc["final"];
  for (const char* key : {"member_test_nll", "member_test_brier", "member_test_ece", "member_test_entropy"})
    CHECK(last[key].size() == 3);
  CHECK(last["member_test_ece"][1] == run.back().member_calibration[1].ece);
  CHECK(last["ensemble_test_nll"] == run.back().ensemble_calibration.nll);
  const Json& ens = last["ensemble_reliability"];
  CHECK(ens["count"].size() == 15);
  CHECK(ens["accuracy"][3].is_null());  // the empty bin
  CHECK(last["best_member_reliability"]["member"] == 2);  // the best accuracy: member 2
  // The size curve: one point per k, with the documented keys.
  const Json& c = doc["ensemble_size_curve"];
  REQUIRE(c.size() == 3);
  const std::vector<std::string> keys = {"members", "test_accuracy", "test_nll", "test_brier", "test_ece",
                                         "test_entropy"};
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(std::next(c[2].begin(), static_cast<long>(i)).key() == keys[i]);
  CHECK(c[2]["test_accuracy"] == curve[2].accuracy);
  // Read back: every number, the best member's bins, and the NaN of the empty bin.
  const EpochMetrics back =
      pmap::io::epoch_metrics_from_json(pmap::io::JsonView(last, "m.json", "final"));
  REQUIRE(back.member_calibration.size() == 3);
  CHECK(back.member_calibration[2].nll == run.back().member_calibration[2].nll);
  CHECK(back.ensemble_calibration.ece == run.back().ensemble_calibration.ece);
  REQUIRE(back.member_calibration[2].bins.size() == 15);
  CHECK(back.member_calibration[2].bins[4].accuracy == run.back().member_calibration[2].bins[4].accuracy);
  CHECK(std::isnan(back.ensemble_calibration.bins[3].confidence));
  // An epoch without calibration (an older checkpoint's history) has none of these keys, and reads back.
  const Json plain = pmap::io::epoch_json(make_epoch(1, 2));
  CHECK_FALSE(plain.contains("ensemble_test_nll"));
  CHECK(pmap::io::epoch_metrics_from_json(pmap::io::JsonView(plain, "x")).member_calibration.empty());
}

TEST_CASE("report: calibration columns in the CSV, the predictions CSV, the table and the plot") {
  const std::vector<EpochMetrics> run = make_calibrated_run(2, 2);
  const std::vector<std::string> lines = split(pmap::ensemble::metrics_csv(run), '\n');
  CHECK(lines[0] ==
        "epoch,train_loss,train_accuracy,test_loss,ensemble_test_accuracy,seconds,eval_seconds,"
        "model_images_per_second,member_0_test_accuracy,member_1_test_accuracy,ensemble_test_nll,ensemble_test_brier,"
        "ensemble_test_ece,ensemble_test_entropy,member_0_test_nll,member_1_test_nll,member_0_test_brier,"
        "member_1_test_brier,member_0_test_ece,member_1_test_ece,member_0_test_entropy,member_1_test_entropy");
  const std::vector<std::string> cells = split(lines[2], ',');
  REQUIRE(cells.size() == 22);
  CHECK(std::strtod(cells[12].c_str(), nullptr) == run[1].ensemble_calibration.ece);
  CHECK(std::strtod(cells[17].c_str(), nullptr) == run[1].member_calibration[1].brier);

  pmap::ensemble::Predictions p;
  p.label = {7, 2};
  p.predicted = {7, 3};
  p.probability = {0.75f, 0.5f};
  p.entropy = {0.25f, 1.0f};
  p.votes = {{7, 3}, {7, 2}, {1, 3}};
  CHECK(pmap::ensemble::predictions_csv(p) ==
        "index,label,prediction,probability,entropy,member_0,member_1,member_2\n"
        "0,7,7,0.75,0.25,7,7,1\n"
        "1,2,3,0.5,1,3,2,3\n");

  const std::string table = pmap::ensemble::final_table(run.back());
  CHECK(table.find("test accuracy      NLL    Brier      ECE  entropy") != std::string::npos);
  char nll[32];
  std::snprintf(nll, sizeof nll, "%.4f", run.back().ensemble_calibration.nll);
  CHECK(table.find(nll) != std::string::npos);

  std::vector<pmap::ensemble::SizePoint> curve = {{1, 0.9, make_calibration(1, 1)}, {2, 0.92, make_calibration(2, 1)}};
  const std::string svg = pmap::ensemble::accuracy_plot_svg(run, {"Fashion-MNIST", curve});
  CHECK(xml_problem(svg) == "");
  CHECK(svg.find("Fashion-MNIST ensemble: 2 members") != std::string::npos);
  CHECK(count(svg, "<polyline class=\"reliability-ensemble\"") == 1);
  CHECK(count(svg, "<polyline class=\"reliability-member\"") == 1);
  for (const char* c : {"size-accuracy", "size-nll", "size-ece"})
    CHECK(count(svg, std::string("<polyline class=\"") + c + "\"") == 1);
  // Each non-empty bin of the ensemble shows its count: a bar and a label (bins 10 + b images, bin 3 empty).
  CHECK(count(svg, "<rect class=\"reliability-count\"") == 14);
  CHECK(svg.find(">24 images with confidence in [0.933, 1.000)</title>") != std::string::npos);
  CHECK(svg.find(">13 images") == std::string::npos);  // the empty bin 3
  // The reliability line leaves out the empty bin: 14 points.
  const auto at = svg.find("<polyline class=\"reliability-ensemble\"");
  const auto pts = svg.find("points=\"", at) + 8;
  CHECK(split(svg.substr(pts, svg.find('"', pts) - pts), ' ').size() == 14);
  // Without calibration or curve: no such panels.
  const std::string plain = pmap::ensemble::accuracy_plot_svg(make_run(2, 2));
  CHECK(plain.find("reliability") == std::string::npos);
  CHECK(plain.find("MNIST ensemble") != std::string::npos);
}

}  // namespace PMAPCC_TEST_FILE
