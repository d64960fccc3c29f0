// A small learnable dataset generated in memory for training tests: each image is noise plus a bright
// square whose position encodes the label.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <pmap/array.h>
#include <pmap/random.h>

#include <pmapcc/train/data.h>

#include "examples/mnist_ensemble/config.h"

namespace pmap::testing {

inline train::Dataset synthetic_dataset(std::int64_t count, int side, std::uint64_t seed) {
  train::Dataset d;
  d.count = count;
  d.rows = d.cols = side;
  d.num_classes = 10;
  const std::size_t pixels = static_cast<std::size_t>(side) * static_cast<std::size_t>(side);
  std::vector<std::uint32_t> bits(static_cast<std::size_t>(count) * (pixels + 1));
  random_bits(key(seed), bits);
  d.images.resize(static_cast<std::size_t>(count) * pixels);
  d.labels.resize(static_cast<std::size_t>(count));
  for (std::int64_t n = 0; n < count; ++n) {
    const std::uint32_t* b = bits.data() + static_cast<std::size_t>(n) * (pixels + 1);
    const int label = static_cast<int>(b[pixels] % 10);
    d.labels[static_cast<std::size_t>(n)] = static_cast<std::uint8_t>(label);
    std::uint8_t* img = d.images.data() + static_cast<std::size_t>(n) * pixels;
    for (std::size_t p = 0; p < pixels; ++p) img[p] = static_cast<std::uint8_t>(b[p] % 64);
    const int cells = side / 2, r0 = (label / 5) * (side / 2), c0 = (label % 5) * side / 5;
    for (int r = r0; r < r0 + cells / 2 + 1 && r < side; ++r)
      for (int c = c0; c < c0 + 1 + side / 10 && c < side; ++c) img[r * side + c] = 255;
  }
  return d;
}

// The training tests' data: 640 training and 200 test images of 12x12, made once.
struct TrainingData {
  train::Dataset train = synthetic_dataset(640, 12, 1);
  train::Dataset test = synthetic_dataset(200, 12, 2);
};
inline const TrainingData& training_data() {
  static const TrainingData d;
  return d;
}

// The program's flags for a run on training_data(): `devices` CPU devices, `members` members, `epochs` epochs of
// 10 steps (batches of 64), eval batches of 128 (examples/mnist_ensemble/recipe.h makes its Trainer).
inline ensemble::TrainConfig small_config(int devices, int members, int epochs = 1) {
  ensemble::TrainConfig c;
  c.devices = devices;
  c.members = members;
  c.epochs = epochs;
  c.batch_size = 64;
  c.eval_batch = 128;
  return c;
}

// Variables (train::Variables: tensors by name) as one vector, each tensor of `names` in that order: a
// Trainer's (members, ...) tensors as one vector, to compare two runs' in one go.
inline std::vector<float> stacked(const std::map<std::string, Array>& v, const std::vector<std::string>& names) {
  std::vector<float> out;
  for (const std::string& n : names) {
    const auto t = v.at(n).to_vector<float>();
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

// Two sets of tensors by name (train::Variables, on the host) hold the same names, shapes, dtypes and bits.
inline bool same_bits(const std::map<std::string, Array>& a, const std::map<std::string, Array>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, x] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.shape() != x.shape() || it->second.dtype() != x.dtype()) return false;
    if (x.nbytes() > 0 && std::memcmp(x.raw_data(), it->second.raw_data(), x.nbytes()) != 0) return false;
  }
  return true;
}

// The largest |a[i] - b[i]|; infinity when the sizes differ.
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<float>::infinity();
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// The directories scratch_dir made, removed with everything in them when the process exits (a test binary
// run run after run left gigabytes of checkpoints in the temp directory), unless PMAPCC_KEEP_TEST_FILES is
// set (to look at a failing test's files).
class ScratchDirs {
 public:
  void add(const std::filesystem::path& dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(dirs_.begin(), dirs_.end(), dir) == dirs_.end()) dirs_.push_back(dir);
  }
  ~ScratchDirs() {
    if (std::getenv("PMAPCC_KEEP_TEST_FILES") != nullptr) return;
    for (const auto& dir : dirs_) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }

 private:
  std::mutex mutex_;
  std::vector<std::filesystem::path> dirs_;
};

// A directory of this process's own for a test's files, created: <temp>/<prefix>_<pid>; removed at exit.
inline std::filesystem::path scratch_dir(const std::string& prefix) {
  static ScratchDirs made;
  auto dir = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  made.add(dir);
  return dir;
}

}  // namespace pmap::testing
