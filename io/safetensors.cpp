// safetensors reading (every field of a possibly hostile file validated before use) and atomic writing
// (temp file in the same directory, fsync, rename, fsync of the directory).
#include <pmapcc/io/safetensors.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <optional>
#include <set>

namespace pmap::io {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors bytes are written as in memory");

constexpr std::pair<DType, std::string_view> kDtypeNames[] = {{DType::f32, "F32"}, {DType::f64, "F64"},
                                                              {DType::i32, "I32"}, {DType::i64, "I64"},
                                                              {DType::u32, "U32"}, {DType::u8, "U8"}};

std::optional<DType> dtype_from_name(std::string_view s) {
  for (const auto& [t, n] : kDtypeNames)
    if (n == s) return t;
  return std::nullopt;
}

[[noreturn]] void data_error(const std::filesystem::path& path, const std::string& what) {
  throw DataError(path.string() + ": " + what);
}

[[noreturn]] void io_error(const std::filesystem::path& path, const std::string& what, int err) {
  throw IoError(path.string() + ": " + what + ": " + std::strerror(err));
}

// product(shape) * element_bytes, or nullopt on a negative dimension or overflow of 64 bits.
std::optional<std::uint64_t> byte_size(const std::vector<std::int64_t>& shape, std::size_t element_bytes) {
  std::uint64_t n = element_bytes;
  for (std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > UINT64_MAX / u) return std::nullopt;
    n *= u;
  }
  return n;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// An open file descriptor, closed on destruction.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// ---- writing ----

std::string header_text(const std::vector<TensorEntry>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const TensorEntry& t : tensors) {
    if (t.name == "__metadata__")
      throw ValueError("save_safetensors: the tensor name \"__metadata__\" is reserved");
    if (!names.insert(t.name).second)
      throw ValueError("save_safetensors: duplicate tensor name " + io::quoted(t.name));
    const auto bytes = byte_size(t.shape, size_of(t.dtype));
    if (!bytes)
      throw ShapeError("save_safetensors: tensor " + io::quoted(t.name) + ": invalid shape " +
                       shape_string(t.shape));
    if (*bytes != t.data.size())
      throw ShapeError("save_safetensors: tensor " + io::quoted(t.name) + ": shape " +
                       shape_string(t.shape) + " of " + std::string(name(t.dtype)) + " needs " +
                       std::to_string(*bytes) + " bytes, data has " + std::to_string(t.data.size()));
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + *bytes}}};
    offset += *bytes;
  }
  std::string text;
  try {
    text = dump_json(header);
  } catch (const ValueError& e) {  // a name or metadata string that is not UTF-8
    throw ValueError("save_safetensors: header " + e.message());
  }
  text.append((8 - (text.size() % 8)) % 8, ' ');  // the byte buffer starts 8-aligned (8 + N)
  return text;
}

// The temp file of an atomic write; removed on destruction unless committed.
class TempFile {
 public:
  explicit TempFile(const std::filesystem::path& target) : target_(target) {
    static std::atomic<unsigned> counter{0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    for (int attempt = 0; fd_.fd < 0; ++attempt) {
      path_ = target;
      path_ += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
               std::to_string(static_cast<unsigned long long>(now) % 1000000007ULL);
      fd_.fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd_.fd < 0 && (errno != EEXIST || attempt >= 100))
        io_error(target, "cannot create temp file " + path_.string(), errno);
    }
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_.fd >= 0) {
      ::close(fd_.fd);
      fd_.fd = -1;
    }
    if (!committed_) ::unlink(path_.c_str());
  }

  void write(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_.fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) io_error(target_, "write to temp file " + path_.string() + " failed", errno);
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }

  // fsync, close, rename over the target. After this the destructor leaves the file alone.
  void commit() {
    const std::filesystem::path& target = target_;
    if (::fsync(fd_.fd) != 0) io_error(target_, "fsync of temp file " + path_.string() + " failed", errno);
    const int fd = fd_.fd;
    fd_.fd = -1;
    if (::close(fd) != 0) io_error(target_, "close of temp file " + path_.string() + " failed", errno);
    if (::rename(path_.c_str(), target.c_str()) != 0)
      io_error(target, "cannot rename " + path_.string() + " over it", errno);
    committed_ = true;
  }

 private:
  std::filesystem::path target_;
  std::filesystem::path path_;
  Fd fd_;
  bool committed_ = false;
};

void fsync_directory(const std::filesystem::path& dir) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd < 0) io_error(dir, "cannot open directory to fsync it", errno);
  // Some file systems cannot fsync a directory (EINVAL); the rename has happened, so that is not fatal.
  if (::fsync(d.fd) != 0 && errno != EINVAL) io_error(dir, "fsync of directory failed", errno);
}

// ---- reading ----

void read_at(int fd, const std::filesystem::path& path, void* dst, std::size_t n, std::uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r =
        ::pread(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) io_error(path, "read failed", errno);
    if (r == 0) data_error(path, "file ended early (truncated while being read?)");
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

// A tensor as described by the header, before its bytes are read.
struct Planned {
  TensorEntry entry;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

Planned plan_tensor(const JsonView& v, const std::string& tensor_name) {
  for (const auto& [key, value] : v.as_object().items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      v.fail("unexpected member " + io::quoted(key));
  Planned p;
  p.entry.name = tensor_name;
  const JsonView dtype = v["dtype"];
  const auto t = dtype_from_name(dtype.as_string());
  if (!t)
    dtype.fail("unsupported dtype " + io::quoted(dtype.as_string()) +
               " (pmapcc reads F32 F64 I32 I64 U32 U8)");
  p.entry.dtype = *t;
  const JsonView shape = v["shape"];
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::int64_t d = shape[i].as_int();
    if (d < 0) shape[i].fail("negative dimension " + std::to_string(d));
    p.entry.shape.push_back(d);
  }
  const auto bytes = byte_size(p.entry.shape, size_of(*t));
  if (!bytes) shape.fail("byte size of shape " + shape_string(p.entry.shape) + " overflows 64 bits");
  const JsonView offsets = v["data_offsets"];
  if (offsets.size() != 2)
    offsets.fail("expected [begin, end], got " + std::to_string(offsets.size()) + " elements");
  const std::int64_t begin = offsets[0].as_int(), end = offsets[1].as_int();
  if (begin < 0 || end < begin)
    offsets.fail("invalid range [" + std::to_string(begin) + ", " + std::to_string(end) + "]");
  p.begin = static_cast<std::uint64_t>(begin);
  p.end = static_cast<std::uint64_t>(end);
  if (p.end - p.begin != *bytes)
    offsets.fail("[" + std::to_string(begin) + ", " + std::to_string(end) + "] holds " +
                 std::to_string(p.end - p.begin) + " bytes but shape " + shape_string(p.entry.shape) +
                 " of " + std::string(dtype.as_string()) + " needs " + std::to_string(*bytes));
  return p;
}

// Checks that the tensors tile [0, buffer_bytes) exactly; sorts `planned` by position.
void check_tiling(std::vector<Planned>& planned, std::uint64_t buffer_bytes,
                  const std::filesystem::path& path) {
  for (const Planned& p : planned)
    if (p.end > buffer_bytes)
      data_error(path, "tensor " + io::quoted(p.entry.name) + ": data_offsets [" +
                           std::to_string(p.begin) + ", " + std::to_string(p.end) +
                           "] run past the end of the " + std::to_string(buffer_bytes) + "-byte data buffer");
  std::stable_sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  const Planned* previous = nullptr;
  for (const Planned& p : planned) {
    if (p.begin < cursor)
      data_error(path, "tensor " + io::quoted(p.entry.name) + " overlaps tensor " +
                           io::quoted(previous->entry.name));
    if (p.begin > cursor)
      data_error(path, "hole in the data buffer: bytes [" + std::to_string(cursor) + ", " +
                           std::to_string(p.begin) + ") belong to no tensor");
    cursor = p.end;
    previous = &p;
  }
  if (cursor != buffer_bytes)
    data_error(path, std::to_string(buffer_bytes - cursor) + " trailing bytes after the last tensor's data");
}

}  // namespace

std::string_view safetensors_dtype_name(DType t) {
  for (const auto& [d, n] : kDtypeNames)
    if (d == t) return n;
  return "?";
}

const TensorEntry* SafetensorsFile::find(std::string_view tensor_name) const {
  for (const TensorEntry& t : tensors)
    if (t.name == tensor_name) return &t;
  return nullptr;
}

const TensorEntry& SafetensorsFile::at(std::string_view tensor_name) const {
  if (const TensorEntry* t = find(tensor_name)) return *t;
  data_error(path, "no tensor named " + io::quoted(tensor_name));
}

Json SafetensorsFile::metadata_json(std::string_view key) const {
  const std::string where = path.string() + ": __metadata__." + std::string(key);
  const auto it = metadata.find(std::string(key));
  if (it == metadata.end()) throw DataError(where + ": missing");
  return parse_json(it->second, where);
}

void save_safetensors(const std::filesystem::path& path, const std::vector<TensorEntry>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  if (path.filename().empty()) throw ValueError("save_safetensors: " + path.string() + " names no file");
  const std::string header = header_text(tensors, metadata);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  TempFile temp(path);
  temp.write(length, sizeof length);
  temp.write(header.data(), header.size());
  for (const TensorEntry& t : tensors) temp.write(t.data.data(), t.data.size());
  temp.commit();
  fsync_directory(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  if (path.filename().empty()) throw ValueError("write_file_atomically: " + path.string() + " names no file");
  TempFile temp(path);
  temp.write(bytes.data(), bytes.size());
  temp.commit();
  fsync_directory(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}

SafetensorsFile load_safetensors(const std::filesystem::path& path) {
  Fd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.fd < 0 && (errno == ENOENT || errno == ENOTDIR)) data_error(path, "no such file");
  if (file.fd < 0) io_error(path, "cannot open", errno);
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) io_error(path, "cannot stat", errno);
  if (!S_ISREG(st.st_mode)) data_error(path, "not a regular file");
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  if (file_bytes < 8)
    data_error(path,
               "file too short (" + std::to_string(file_bytes) + " bytes) for the 8-byte header length");
  unsigned char length[8];
  read_at(file.fd, path, length, 8, 0);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > safetensors_max_header_bytes)
    data_error(path, "header length " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(safetensors_max_header_bytes) + " bytes");
  if (n > file_bytes - 8)
    data_error(path, "header length " + std::to_string(n) + " runs past the end of the " +
                         std::to_string(file_bytes) + "-byte file");
  std::string header(static_cast<std::size_t>(n), '\0');
  read_at(file.fd, path, header.data(), header.size(), 8);
  if (header.empty() || header[0] != '{') data_error(path, "header does not start with '{'");

  const Json root = parse_json(header, path.string() + ": header");
  const JsonView top(root, path.string());
  SafetensorsFile out;
  out.path = path;
  std::vector<Planned> planned;
  for (const auto& [key, value] : top.as_object().items()) {
    const JsonView v(value, path.string(), top.child_path(key));
    if (key == "__metadata__") {
      for (const auto& [mk, mv] : v.as_object().items())
        out.metadata.emplace(mk, JsonView(mv, path.string(), v.child_path(mk)).as_string());
    } else {
      planned.push_back(plan_tensor(v, key));
    }
  }
  check_tiling(planned, file_bytes - 8 - n, path);
  for (Planned& p : planned) {
    p.entry.data.resize(static_cast<std::size_t>(p.end - p.begin));
    read_at(file.fd, path, p.entry.data.data(), p.entry.data.size(), 8 + n + p.begin);
    out.tensors.push_back(std::move(p.entry));
  }
  return out;
}

}  // namespace pmap::io
