// IDX files (the MNIST format: a big-endian magic word, the dimensions, then the bytes), raw or gzip,
// read and validated into host memory. Every malformed input raises pmap::DataError naming the file and the
// fault; nothing here trusts a header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace pmap::io {

// Largest IDX payload we agree to allocate, in bytes (2 GiB). Checked against the header before allocating.
inline constexpr std::int64_t kMaxIdxPayloadBytes = std::int64_t{1} << 31;

// One IDX array of unsigned bytes: its dimensions as the header states them and its data, row-major.
struct IdxArray {
  std::vector<std::int64_t> dims;  // e.g. (N, rows, cols) for images, (N) for labels
  std::vector<std::uint8_t> data;  // product(dims) bytes
};

// Reads one IDX file of element type u8 with exactly `rank` dimensions (magic 0x000008<rank>).
// The file may be raw or gzip-compressed; gzip is recognised by its magic bytes (1f 8b), not its name.
// Throws DataError, naming the file, when it is missing, a directory, has a bad magic / type / rank,
// a zero dimension, a payload over kMaxIdxPayloadBytes (rejected before allocating), is truncated,
// has trailing bytes, or is a corrupt gzip stream; IoError when reading an existing file fails.
IdxArray read_idx(const std::filesystem::path& path, int rank);

}  // namespace pmap::io
