// IDX reading (raw or gzip, via zlib) with validation that names the file and the fault. See idx.h.
#include <pmapcc/io/idx.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

#include <pmap/error.h>

namespace pmap::io {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& path, const std::string& fault) {
  throw DataError(path.string() + ": " + fault);
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string dims_string(const std::vector<std::int64_t>& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

// A regular file read front to back, transparently gunzipped when it starts with the gzip magic 1f 8b.
// read() returns fewer bytes than asked only at the end of the data; a corrupt or cut gzip stream throws.
class ByteSource {
 public:
  explicit ByteSource(const fs::path& path) : path_(path) {
    check_regular_file();
    raw_ = std::fopen(path.c_str(), "rb");
    if (raw_ == nullptr) open_failed();
    unsigned char magic[2] = {0, 0};
    const bool gzip = std::fread(magic, 1, 2, raw_) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    if (!gzip) {
      std::rewind(raw_);
      return;
    }
    std::fclose(raw_);
    raw_ = nullptr;
    gz_ = gzopen(path.c_str(), "rb");
    if (gz_ == nullptr) open_failed();
    gzbuffer(gz_, 1u << 17);
  }
  ~ByteSource() {
    if (raw_ != nullptr) std::fclose(raw_);
    if (gz_ != nullptr) gzclose_r(gz_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  bool gzip() const { return gz_ != nullptr; }

  std::size_t read(std::uint8_t* dst, std::size_t n) { return gzip() ? read_gzip(dst, n) : read_raw(dst, n); }

 private:
  void check_regular_file() const {
    std::error_code ec;
    const fs::file_status st = fs::status(path_, ec);
    if (st.type() == fs::file_type::not_found) fail(path_, "no such file");
    if (ec) throw IoError(path_.string() + ": cannot stat: " + ec.message());
    if (st.type() == fs::file_type::directory) fail(path_, "is a directory, not an IDX file");
    if (st.type() != fs::file_type::regular) fail(path_, "is not a regular file");
  }

  [[noreturn]] void open_failed() const {
    if (errno == ENOENT) fail(path_, "no such file");
    throw IoError(path_.string() + ": cannot open: " + std::strerror(errno));
  }

  std::size_t read_raw(std::uint8_t* dst, std::size_t n) {
    const std::size_t got = std::fread(dst, 1, n, raw_);
    if (got < n && std::ferror(raw_)) throw IoError(path_.string() + ": read failed: " + std::strerror(errno));
    return got;
  }

  std::size_t read_gzip(std::uint8_t* dst, std::size_t n) {
    std::size_t total = 0;
    while (total < n) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - total, 1u << 30));
      const int got = gzread(gz_, dst + total, chunk);
      if (got > 0) total += static_cast<std::size_t>(got);
      if (got < static_cast<int>(chunk)) {
        check_gzip_state();
        break;
      }
    }
    return total;
  }

  // After a short gzread: a clean end of stream is fine, anything else throws.
  void check_gzip_state() const {
    int err = Z_OK;
    std::string msg = gzerror(gz_, &err);
    if (err == Z_OK) return;
    if (err == Z_ERRNO) throw IoError(path_.string() + ": read failed: " + std::strerror(errno));
    const std::string own_prefix = path_.string() + ": ";  // zlib prefixes the path we already name
    if (msg.starts_with(own_prefix)) msg.erase(0, own_prefix.size());
    if (err == Z_BUF_ERROR) fail(path_, "truncated gzip stream (zlib: " + msg + ")");
    fail(path_, "corrupt gzip stream (zlib: " + msg + ")");
  }

  fs::path path_;
  std::FILE* raw_ = nullptr;
  gzFile gz_ = nullptr;
};

std::int64_t header_bytes(int rank) { return 4 + 4 * std::int64_t{rank}; }

std::uint32_t big_endian32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

void check_magic(const fs::path& path, std::uint32_t magic, int rank) {
  const std::uint32_t want = 0x800u | static_cast<std::uint32_t>(rank);
  if (magic == want) return;
  const std::string head = "bad magic number " + hex32(magic) + " (expected " + hex32(want) + "): ";
  if ((magic >> 16) != 0) fail(path, head + "not an IDX file");
  const std::uint32_t type = (magic >> 8) & 0xffu, ndims = magic & 0xffu;
  if (type != 0x08) fail(path, head + "element type " + hex32(type) + " is not unsigned byte (0x08)");
  fail(path, head + "wrong number of dims: " + std::to_string(ndims) + ", expected " + std::to_string(rank));
}

// Reads and checks the magic word and the `rank` big-endian u32 dimensions.
std::vector<std::int64_t> read_header(ByteSource& src, const fs::path& path, int rank) {
  std::uint8_t buf[4 + 4 * 255];
  const auto want = static_cast<std::size_t>(header_bytes(rank));
  const std::size_t got = src.read(buf, 4);
  if (got == 4) check_magic(path, big_endian32(buf), rank);
  const std::size_t got_dims = got == 4 ? src.read(buf + 4, want - 4) : 0;
  if (got + got_dims < want) {
    fail(path, "truncated header: expected " + std::to_string(want) + " bytes, got " +
                   std::to_string(got + got_dims));
  }
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank));
  for (int d = 0; d < rank; ++d) dims[static_cast<std::size_t>(d)] = big_endian32(buf + 4 + 4 * d);
  return dims;
}

// Bytes of data the dims describe; rejects zero dims and sizes past kMaxIdxPayloadBytes without overflow.
std::int64_t checked_payload(const fs::path& path, const std::vector<std::int64_t>& dims) {
  std::int64_t bytes = 1;
  for (const std::int64_t d : dims) {
    if (d == 0) fail(path, "zero dimension in dims " + dims_string(dims) + "; the file holds no data");
    if (bytes > kMaxIdxPayloadBytes / d) {
      fail(path, "size too large: dims " + dims_string(dims) + " describe more than " +
                     std::to_string(kMaxIdxPayloadBytes) + " bytes (refusing to allocate)");
    }
    bytes *= d;
  }
  return bytes;
}

// Raw files: the size on disk must be exactly header + payload; checked before allocating.
void check_raw_size(const fs::path& path, const std::vector<std::int64_t>& dims, std::int64_t expected) {
  std::error_code ec;
  const auto actual = static_cast<std::int64_t>(fs::file_size(path, ec));
  if (ec) throw IoError(path.string() + ": cannot get file size: " + ec.message());
  if (actual < expected) {
    fail(path, "truncated: dims " + dims_string(dims) + " need " + std::to_string(expected) +
                   " bytes, file has " + std::to_string(actual));
  }
  if (actual > expected) {
    fail(path, "trailing garbage: " + std::to_string(actual - expected) + " bytes after the expected " +
                   std::to_string(expected) + " bytes for dims " + dims_string(dims));
  }
}

// Reads up to `bytes` bytes of data. The buffer grows only as data arrives (raw files were size-checked and
// reserve it whole), so a gzip header that overstates its size costs no memory. Short only when truncated.
std::vector<std::uint8_t> read_payload(ByteSource& src, std::int64_t bytes) {
  const auto want = static_cast<std::size_t>(bytes);
  std::vector<std::uint8_t> data;
  if (!src.gzip()) data.reserve(want);
  std::size_t done = 0;
  while (done < want) {
    const std::size_t next = std::min(want, std::max<std::size_t>(2 * done, std::size_t{1} << 20));
    data.resize(next);
    done += src.read(data.data() + done, next - done);
    if (done < next) break;
  }
  data.resize(done);
  if (data.capacity() > data.size()) data.shrink_to_fit();
  return data;
}

}  // namespace

IdxArray read_idx(const std::filesystem::path& path, int rank) {
  if (rank < 1 || rank > 255) throw ValueError("read_idx: rank must be in [1, 255], got " + std::to_string(rank));
  ByteSource src(path);
  IdxArray out;
  out.dims = read_header(src, path, rank);
  const std::int64_t payload = checked_payload(path, out.dims);
  const std::int64_t expected = header_bytes(rank) + payload;
  if (!src.gzip()) check_raw_size(path, out.dims, expected);
  out.data = read_payload(src, payload);
  const auto got = static_cast<std::int64_t>(out.data.size());
  if (got < payload) {
    fail(path, "truncated: dims " + dims_string(out.dims) + " need " + std::to_string(expected) +
                   " bytes after decompression, got " + std::to_string(header_bytes(rank) + got));
  }
  std::uint8_t extra = 0;
  if (src.read(&extra, 1) != 0) {
    fail(path, "trailing garbage after the " + std::to_string(expected) + " bytes that dims " +
                   dims_string(out.dims) + " describe");
  }
  return out;
}

}  // namespace pmap::io
