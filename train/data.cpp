// MNIST loading and batch gathering over the IDX reader. See data.h for the contracts.
#include <pmapcc/train/data.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <system_error>

#include <pmap/error.h>

#include <pmapcc/io/idx.h>

namespace pmap::train {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& path, const std::string& fault) {
  throw DataError(path.string() + ": " + fault);
}

void check_labels(const fs::path& path, const std::vector<std::uint8_t>& labels, int num_classes) {
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      fail(path, "label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
                     " is out of range [0, " + std::to_string(num_classes) + ")");
    }
  }
}

// The first existing candidate of `base` in `dir` (raw, then .gz); DataError listing both when neither is.
fs::path find_idx(const fs::path& dir, const std::string& base) {
  const fs::path candidates[] = {dir / base, dir / (base + ".gz")};
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (fs::exists(p, ec)) return p;
  }
  std::error_code ec;
  const std::string where = fs::is_directory(dir, ec) ? "" : " (the directory does not exist)";
  throw DataError("no " + base + " file in " + dir.string() + where + ": looked for " +
                  candidates[0].string() + " and " + candidates[1].string() +
                  "; scripts/get_data.sh downloads MNIST");
}

}  // namespace

Dataset load_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels,
                      int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    throw ValueError("load_idx_pair: num_classes must be in [1, 256], got " + std::to_string(num_classes));
  }
  io::IdxArray img = io::read_idx(images, 3);
  io::IdxArray lab = io::read_idx(labels, 1);
  if (img.dims[0] != lab.dims[0]) {
    throw DataError("image/label count mismatch: " + images.string() + " holds " + std::to_string(img.dims[0]) +
                    " images but " + labels.string() + " holds " + std::to_string(lab.dims[0]) + " labels");
  }
  check_labels(labels, lab.data, num_classes);
  Dataset out;
  out.count = img.dims[0];
  out.rows = img.dims[1];
  out.cols = img.dims[2];
  out.num_classes = num_classes;
  out.images = std::move(img.data);
  out.labels = std::move(lab.data);
  return out;
}

Dataset load_mnist(const std::filesystem::path& dir, Split split, std::int64_t limit) {
  if (limit == 0 || limit < -1) {
    throw ValueError("load_mnist: limit must be -1 (all) or positive, got " + std::to_string(limit));
  }
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const fs::path images = find_idx(dir, prefix + "-images-idx3-ubyte");
  const fs::path labels = find_idx(dir, prefix + "-labels-idx1-ubyte");
  Dataset data = load_idx_pair(images, labels);
  if (limit != -1 && limit < data.count) {
    data.count = limit;
    data.images.resize(static_cast<std::size_t>(limit * data.image_size()));
    data.labels.resize(static_cast<std::size_t>(limit));
    data.images.shrink_to_fit();
    data.labels.shrink_to_fit();
  }
  return data;
}

void gather_batch(const Dataset& data, std::span<const std::uint32_t> indices, float* images_out,
                  std::int32_t* labels_out) {
  for (std::size_t b = 0; b < indices.size(); ++b) {
    if (indices[b] >= data.count) {
      throw ValueError("gather_batch: indices[" + std::to_string(b) + "] = " + std::to_string(indices[b]) +
                       " is out of range for a dataset of " + std::to_string(data.count) + " examples");
    }
  }
  if (!indices.empty() && (images_out == nullptr || labels_out == nullptr)) {
    throw ValueError("gather_batch: images_out and labels_out must not be null");
  }
  const auto pixels = static_cast<std::size_t>(data.image_size());
  for (std::size_t b = 0; b < indices.size(); ++b) {
    const std::uint8_t* src = data.images.data() + indices[b] * pixels;
    float* dst = images_out + b * pixels;
    for (std::size_t p = 0; p < pixels; ++p) dst[p] = static_cast<float>(src[p]) / 255.f;
    labels_out[b] = data.labels[indices[b]];
  }
}

Key validation_key(std::uint64_t seed) { return fold_in(split(key(seed), 2)[1], 0x76616c69); }

std::pair<Dataset, Dataset> split_validation(const Dataset& data, double fraction, Key key) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", fraction);
  if (!(fraction > 0 && fraction < 1))
    throw ValueError(std::string("--validation-split must be in (0, 1) to hold out a validation set, got ") + text);
  const auto held = static_cast<std::int64_t>(static_cast<double>(data.count) * fraction);
  if (held < 1 || held >= data.count)
    throw ValueError(std::string("--validation-split ") + text + " of " + std::to_string(data.count) +
                     " training examples leaves " + (held < 1 ? "no validation example" : "no training example") +
                     " (see --train-limit)");
  const auto order = permutation(key, static_cast<std::uint32_t>(data.count));
  std::vector<bool> is_validation(static_cast<std::size_t>(data.count), false);
  for (std::int64_t i = 0; i < held; ++i) is_validation[order[static_cast<std::size_t>(i)]] = true;
  Dataset train, validation;
  for (Dataset* d : {&train, &validation}) {
    d->rows = data.rows;
    d->cols = data.cols;
    d->num_classes = data.num_classes;
  }
  const auto pixels = static_cast<std::size_t>(data.image_size());
  for (std::size_t i = 0; i < static_cast<std::size_t>(data.count); ++i) {
    Dataset& to = is_validation[i] ? validation : train;
    to.images.insert(to.images.end(), data.images.begin() + static_cast<std::ptrdiff_t>(i * pixels),
                     data.images.begin() + static_cast<std::ptrdiff_t>((i + 1) * pixels));
    to.labels.push_back(data.labels[i]);
    ++to.count;
  }
  return {std::move(train), std::move(validation)};
}

std::int64_t steps_per_epoch(std::int64_t count, std::int64_t batch) {
  if (batch <= 0) throw ValueError("steps_per_epoch: batch must be positive, got " + std::to_string(batch));
  if (count < 0) throw ValueError("steps_per_epoch: count must be >= 0, got " + std::to_string(count));
  return count / batch;
}

}  // namespace pmap::train
