// MNIST-style datasets: a split's IDX image and label files (io/idx.h) read into host memory and checked
// against each other, and batch gathering. Malformed input raises pmap::DataError naming the file and fault.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <utility>
#include <vector>

#include <pmap/random.h>

namespace pmap::train {

// Images and labels of one split, on the host.
struct Dataset {
  std::vector<std::uint8_t> images;  // (count, rows, cols), pixels 0..255
  std::vector<std::uint8_t> labels;  // (count), each in [0, num_classes)
  std::int64_t count = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  int num_classes = 10;

  std::int64_t image_size() const { return rows * cols; }  // pixels per image
};

// Reads an IDX3 image file and an IDX1 label file and checks that they agree: same example count
// (else DataError naming both files and both counts) and every label in [0, num_classes) (else
// DataError naming the label file, the index and the value). Throws what io::read_idx throws, and
// ValueError when num_classes is not in [1, 256].
Dataset load_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels,
                      int num_classes = 10);

enum class Split { train, test };

// Loads the MNIST-layout split from `dir`: train-{images-idx3,labels-idx1}-ubyte or
// t10k-{images-idx3,labels-idx1}-ubyte, each raw or with a .gz suffix (raw preferred when both exist).
// Works for any dataset in that layout (Fashion-MNIST too). `limit` keeps the first `limit` examples
// (-1: all; more than the file holds: all); the whole file is still validated.
// Throws DataError listing the names it looked for when a file is absent; ValueError for limit 0 or < -1.
Dataset load_mnist(const std::filesystem::path& dir, Split split, std::int64_t limit = -1);

// Copies the examples `indices` (in that order) into caller-owned host buffers:
// images_out (B, rows, cols, 1) as float x / 255.f in [0, 1], labels_out (B) as int32, B = indices.size().
// Throws ValueError (before writing anything) when an index is >= data.count. Blocking, host only.
void gather_batch(const Dataset& data, std::span<const std::uint32_t> indices, float* images_out,
                  std::int32_t* labels_out);

// Holds out a validation set: round-down(count * fraction) examples, those whose positions come first in
// permutation(key, count), and the rest for training; each part keeps the examples' original order. Returns
// (train, validation). ValueError naming --validation-split when fraction is outside (0, 1) or either part
// would be empty.
std::pair<Dataset, Dataset> split_validation(const Dataset& data, double fraction, Key key);

// The key a run of `seed` holds its validation set out with, as the program has always drawn it: its data key
// (split(key(seed), 2)[1], the Trainer's) folded with 0x76616c69 ("vali"; the epochs' orders fold in 0, 1, ...).
Key validation_key(std::uint64_t seed);

// Full batches in one epoch of `count` examples: count / batch (the last partial batch is dropped,
// as in the Flax MNIST example). Throws ValueError when batch <= 0 or count < 0.
std::int64_t steps_per_epoch(std::int64_t count, std::int64_t batch);

}  // namespace pmap::train
