// libFuzzer target: io::read_idx, the reader of MNIST's IDX files, raw and gzip-compressed.
// The first input byte picks how the rest is read: bit 0 set, the rest is gzip-compressed by the target
// first (so mutations of the IDX bytes reach the parser through zlib, too); bit 1 set, the file is read
// as rank 1 (labels), else rank 3 (images). Malformed files may only raise pmap::DataError; an accepted
// file must hold exactly the header's dimensions, all non-zero.
#include <zlib.h>

#include <vector>

#include <pmap/error.h>

#include <pmapcc/io/idx.h>
#include "tests/fuzz/fuzz_common.h"

namespace {

// `raw` as one gzip member (what `gzip` writes), at a fast level.
std::vector<std::uint8_t> gzip(const std::uint8_t* raw, std::size_t size) {
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    pmap::fuzz::violated("fuzz_idx", "deflateInit2 failed");
  std::vector<std::uint8_t> out(deflateBound(&z, static_cast<uLong>(size)));
  z.next_in = const_cast<Bytef*>(raw);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) pmap::fuzz::violated("fuzz_idx", "deflate did not finish");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool compress = (data[0] & 1) != 0;
  const int rank = (data[0] & 2) != 0 ? 1 : 3;
  std::vector<std::uint8_t> bytes = compress ? gzip(data + 1, size - 1) : std::vector<std::uint8_t>(data + 1, data + size);
  const auto path = pmap::fuzz::scratch().write("input.idx", bytes);
  pmap::io::IdxArray a;
  try {
    a = pmap::io::read_idx(path, rank);
  } catch (const pmap::DataError&) {
    return 0;
  }
  if (a.dims.size() != static_cast<std::size_t>(rank)) pmap::fuzz::violated("fuzz_idx", "accepted a file of another rank");
  std::size_t count = 1;
  for (std::int64_t d : a.dims) {
    if (d <= 0) pmap::fuzz::violated("fuzz_idx", "accepted a zero or negative dimension");
    count *= static_cast<std::size_t>(d);
  }
  if (count != a.data.size()) pmap::fuzz::violated("fuzz_idx", "data size differs from the header's dimensions");
  return 0;
}
