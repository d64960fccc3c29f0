// A small learnable dataset generated in memory for training tests: each image is noise plus a bright
// square whose position encodes the label.
#pragma once

#include <cstdint>

#include <pmap/random.h>

#include "ensemble/data.h"

namespace pmap::testing {

inline ensemble::Dataset synthetic_dataset(std::int64_t count, int side, std::uint64_t seed) {
  ensemble::Dataset d;
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

}  // namespace pmap::testing
