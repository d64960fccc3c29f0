// Tests of safetensors files: round trips, byte-exact agreement with the spec, validation of hostile
// files (every truncation, byte flips of the header, crafted faults) and atomic writes that fail cleanly.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <pmapcc/io/safetensors.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace fs = std::filesystem;
using namespace pmap::io;
using pmap::DType;

namespace {

// A fresh directory under the system temp directory, removed with its contents at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("pmapcc_test_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::size_t entries() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(path), {}));
  }
};

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const fs::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A file laid out exactly as the spec says: N (u64 LE), N header bytes, the buffer.
std::string raw_file(std::string_view header, std::string_view buffer) {
  return le64(header.size()) + std::string(header) + std::string(buffer);
}

std::string load_error(const fs::path& p) {
  try {
    load_safetensors(p);
  } catch (const pmap::DataError& e) { return e.what(); }
  return "(no error)";
}

std::vector<TensorEntry> sample_tensors() {
  const float f[] = {1.5f,   -0.0f, std::bit_cast<float>(0x7fc00123u),
                     3e-41f, 2.0f,  -7.25f};  // NaN payload, denormal
  const double scalar[] = {-1.0 / 3};
  const std::int32_t none[] = {0};
  const std::uint32_t u[] = {0u, 1u, 0xdeadbeefu, 0xffffffffu, 42u};
  const std::uint8_t bytes[] = {7, 0, 255};
  const std::int64_t big[] = {INT64_MIN, INT64_MAX};
  return {make_tensor<float>("params.conv1.kernel", {2, 3}, f),
          make_tensor<double>("scalar", {}, scalar),
          make_tensor<std::int32_t>("empty", {0}, std::span<const std::int32_t>(none, 0)),
          make_tensor<std::uint8_t>("bytes", {3}, bytes),
          make_tensor<std::int64_t>("empty3d", {3, 0, 2}, std::span<const std::int64_t>()),
          make_tensor<std::uint32_t>("u", {5, 1}, u),
          make_tensor<std::int64_t>("big", {2}, big)};
}

// What every successfully loaded file must satisfy: sizes match shapes, names are unique, and the
// tensors, in order, are exactly the file's data buffer.
void check_invariants(const SafetensorsFile& f, const std::string& file_bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(file_bytes[static_cast<std::size_t>(i)]);
  std::string concatenated;
  std::set<std::string> names;
  for (const TensorEntry& t : f.tensors) {
    std::size_t count = 1;
    for (std::int64_t d : t.shape) {
      REQUIRE(d >= 0);
      count *= static_cast<std::size_t>(d);
    }
    CHECK(t.data.size() == count * pmap::size_of(t.dtype));
    CHECK(names.insert(t.name).second);
    CHECK(t.name != "__metadata__");
    concatenated.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  CHECK(concatenated == file_bytes.substr(8 + n));
}

}  // namespace

TEST_CASE("safetensors: round trip is bit-exact for every dtype, scalar and empty tensors") {
  TempDir dir;
  const fs::path p = dir.path / "ckpt.safetensors";
  const auto tensors = sample_tensors();
  const std::map<std::string, std::string> meta = {
      {"step", "1200"}, {"keys", R"([[0,1],[2,3]])"}, {"seed", "0"}};
  save_safetensors(p, tensors, meta);
  CHECK(dir.entries() == 1);  // no temp file left behind

  const SafetensorsFile f = load_safetensors(p);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CHECK(f.tensors[i].name == tensors[i].name);
    CHECK(f.tensors[i].dtype == tensors[i].dtype);
    CHECK(f.tensors[i].shape == tensors[i].shape);
    CHECK(f.tensors[i].data == tensors[i].data);
  }
  CHECK(tensor_values<std::uint32_t>(f.at("u"))[2] == 0xdeadbeefu);
  CHECK(f.find("missing") == nullptr);
  CHECK_THROWS_AS(f.at("missing"), pmap::DataError);
  CHECK_THROWS_AS(tensor_values<float>(f.at("u")), pmap::ShapeError);
  CHECK(f.metadata_json("keys") == Json{{0, 1}, {2, 3}});
  CHECK_THROWS_WITH_AS(f.metadata_json("nope"), (p.string() + ": __metadata__.nope: missing").c_str(),
                       pmap::DataError);

  const std::string bytes = read_bytes(p);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  CHECK((8 + n) % 8 == 0);  // header padded so the buffer is 8-aligned
  check_invariants(f, bytes);

  save_safetensors(p, {tensors[3]}, {});  // overwrite: replaced as a whole
  const SafetensorsFile g = load_safetensors(p);
  CHECK(g.tensors.size() == 1);
  CHECK(g.metadata.empty());
  CHECK(dir.entries() == 1);
}

TEST_CASE("safetensors: writer output matches the spec byte for byte, and a hand-made file loads") {
  TempDir dir;
  const std::uint8_t b[] = {7, 9};
  save_safetensors(dir.path / "w.safetensors", {make_tensor<std::uint8_t>("x", {2}, b)}, {{"k", "v"}});
  std::string header = R"({"__metadata__":{"k":"v"},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  CHECK(read_bytes(dir.path / "w.safetensors") == raw_file(header, "\x07\x09"));

  // 1.0f, -2.0f, 0.5f, 3.0f as little-endian F32, then 5 as I64, per the spec; no padding at all.
  const std::string buffer =
      std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\x00\x3f\x00\x00\x40\x40", 16) +
      std::string("\x05\x00\x00\x00\x00\x00\x00\x00", 8);
  const fs::path hand = dir.path / "hand.safetensors";
  write_bytes(hand, raw_file(R"({"bias":{"dtype":"I64","shape":[1],"data_offsets":[16,24]},)"
                             R"("weight":{"shape":[2,2],"dtype":"F32","data_offsets":[0,16]},)"
                             R"("__metadata__":{"format":"pt"}})",
                             buffer));
  const SafetensorsFile f = load_safetensors(hand);
  REQUIRE(f.tensors.size() == 2);
  CHECK(f.tensors[0].name == "weight");  // in buffer order
  CHECK(tensor_values<float>(f.at("weight")) == std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f});
  CHECK(tensor_values<std::int64_t>(f.at("bias")) == std::vector<std::int64_t>{5});
  CHECK(f.metadata.at("format") == "pt");

  write_bytes(hand, raw_file("{}      ", ""));  // no tensors, space padding
  CHECK(load_safetensors(hand).tensors.empty());
}

TEST_CASE("safetensors: every truncation of a valid file is a DataError") {
  TempDir dir;
  const fs::path good = dir.path / "good.safetensors", cut = dir.path / "cut.safetensors";
  save_safetensors(good, sample_tensors(), {{"step", "3"}});
  const std::string bytes = read_bytes(good);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(cut, std::string_view(bytes).substr(0, n));
    CHECK_THROWS_AS(load_safetensors(cut), pmap::DataError);
  }
}

TEST_CASE("safetensors: flipping any header byte gives a DataError or a file that is still sound") {
  TempDir dir;
  const fs::path good = dir.path / "good.safetensors", bad = dir.path / "bad.safetensors";
  save_safetensors(good, sample_tensors(), {{"step", "3"}});
  const std::string bytes = read_bytes(good);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  int loaded = 0, rejected = 0;
  for (std::size_t i = 0; i < 8 + n; ++i) {
    for (unsigned mask : {0x01u, 0x02u, 0x10u, 0x20u, 0x80u, 0xFFu}) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(static_cast<unsigned char>(flipped[i]) ^ mask);
      write_bytes(bad, flipped);
      try {
        check_invariants(load_safetensors(bad), flipped);
        ++loaded;
      } catch (const pmap::DataError& e) {
        CHECK(std::string(e.what()).rfind(bad.string() + ": ", 0) == 0);  // names the file
        ++rejected;
      }
    }
  }
  CHECK(loaded > 0);  // e.g. a renamed tensor or metadata key
  CHECK(rejected > loaded);
}

TEST_CASE("safetensors: each kind of malformed file is rejected with a message naming the fault") {
  TempDir dir;
  const fs::path p = dir.path / "m.safetensors";
  auto expect = [&](std::string_view file, std::string_view fault) {
    write_bytes(p, file);
    const std::string msg = load_error(p);
    CHECK_MESSAGE(msg.rfind(p.string() + ": ", 0) == 0, msg);
    CHECK_MESSAGE(msg.find(fault) != std::string::npos, msg, " (wanted: ", fault, ")");
  };
  auto tensor = [](std::string_view dtype, std::string_view shape, std::string_view offsets) {
    return "\"t\":{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":" + std::string(shape) +
           ",\"data_offsets\":" + std::string(offsets) + "}";
  };
  expect("", "file too short (0 bytes)");
  expect(std::string_view("\x01\x00\x00", 3), "file too short (3 bytes)");
  expect(le64(200'000'000) + "{}", "exceeds the limit of 100000000 bytes");
  expect(le64(~0ULL) + "{}", "exceeds the limit");
  expect(le64(100) + "{}", "header length 100 runs past the end of the 10-byte file");
  expect(le64(0), "header does not start with '{'");
  expect(raw_file(" {}", ""), "header does not start with '{'");
  expect(raw_file("{\"a\":", ""), "header: byte 6: syntax error while parsing value");
  expect(raw_file("{} x", ""), "header: byte 4: syntax error while parsing value - invalid literal");
  expect(raw_file("{\"t\":1}", ""), "t: expected an object, got an integer");
  expect(raw_file("{" + tensor("F16", "[1]", "[0,2]") + "}", "xx"), "t.dtype: unsupported dtype \"F16\"");
  expect(raw_file("{" + tensor("F32", "[2,-1]", "[0,4]") + "}", "abcd"), "t.shape[1]: negative dimension -1");
  expect(raw_file("{" + tensor("F32", "[4611686018427387904,8]", "[0,4]") + "}", "abcd"),
         "overflows 64 bits");
  expect(raw_file("{" + tensor("F32", "[2.0]", "[0,8]") + "}", "abcdefgh"),
         "t.shape[0]: expected an integer");
  expect(raw_file("{" + tensor("F32", "[2]", "[0,4]") + "}", "abcd"),
         "holds 4 bytes but shape [2] of F32 needs 8");
  expect(raw_file("{" + tensor("F32", "[1]", "[4,0]") + "}", "abcd"), "invalid range [4, 0]");
  expect(raw_file("{" + tensor("F32", "[1]", "[0]") + "}", "abcd"), "expected [begin, end]");
  expect(raw_file("{" + tensor("F32", "[1]", "[4,8]") + "}", "abcd"),
         "run past the end of the 4-byte data buffer");
  expect(raw_file("{" + tensor("F32", "[1]", "[4,8]") + "}", "abcdefgh"), "bytes [0, 4) belong to no tensor");
  expect(raw_file("{" + tensor("F32", "[1]", "[0,4]") + "}", "abcdefgh"), "4 trailing bytes");
  expect(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                  "abcd"),
         "\"b\" overlaps tensor \"a\"");
  expect(raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                  R"("a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                  "abcd"),
         "header: duplicate key \"a\"");
  expect(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                  R"("e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
                  "abcd"),
         "\"e\" overlaps tensor \"a\"");
  expect(raw_file(R"({"t":{"dtype":"U8","shape":[],"data_offsets":[0,1],"x":1}})", "a"),
         "t: unexpected member \"x\"");
  expect(raw_file(R"({"t":{"dtype":"U8","data_offsets":[0,1]}})", "a"), "t.shape: missing");
  expect(raw_file(R"({"__metadata__":{"step":12}})", ""),
         "__metadata__.step: expected a string, got an integer");
  expect(raw_file(R"({"__metadata__":["a"]})", ""), "__metadata__: expected an object");
  expect(raw_file("{\"\xff\":1}", ""), "ill-formed UTF-8 byte");
  CHECK(load_error(dir.path / "absent.safetensors").find("no such file") != std::string::npos);
  CHECK(load_error(dir.path).find("not a regular file") != std::string::npos);
}

TEST_CASE("safetensors: bad arguments to save are refused before anything is written") {
  TempDir dir;
  const fs::path p = dir.path / "a.safetensors";
  auto t = sample_tensors();
  CHECK_THROWS_AS(save_safetensors(p, {t[0], t[0]}, {}), pmap::ValueError);
  TensorEntry reserved = t[1];
  reserved.name = "__metadata__";
  CHECK_THROWS_AS(save_safetensors(p, {reserved}, {}), pmap::ValueError);
  TensorEntry short_data = t[0];
  short_data.data.pop_back();
  CHECK_THROWS_AS(save_safetensors(p, {short_data}, {}), pmap::ShapeError);
  TensorEntry negative = t[2];
  negative.shape = {-1};
  CHECK_THROWS_AS(save_safetensors(p, {negative}, {}), pmap::ShapeError);
  CHECK_THROWS_AS(save_safetensors(p, {}, {{"k", "\xff"}}), pmap::ValueError);
  CHECK(dir.entries() == 0);
}

TEST_CASE("safetensors: a failed write names the path and the OS error, and keeps the old file") {
  TempDir dir;
  const auto tensors = sample_tensors();
  auto io_error = [&](const fs::path& p) {
    try {
      save_safetensors(p, tensors, {});
    } catch (const pmap::IoError& e) { return std::string(e.what()); }
    return std::string("(no error)");
  };
  // These fail for root too (chmod would not).
  const std::string missing = io_error(dir.path / "no_such_dir" / "c.safetensors");
  CHECK(missing.find((dir.path / "no_such_dir" / "c.safetensors").string()) != std::string::npos);
  CHECK(missing.find(std::strerror(ENOENT)) != std::string::npos);
  write_bytes(dir.path / "plain_file", "x");
  CHECK(io_error(dir.path / "plain_file" / "c.safetensors").find(std::strerror(ENOTDIR)) !=
        std::string::npos);
  fs::create_directory(dir.path / "a_dir");
  fs::create_directory(dir.path / "a_dir" / "inside");
  const std::string over_dir = io_error(dir.path / "a_dir");  // rename onto a non-empty directory fails
  CHECK(over_dir.find("cannot rename") != std::string::npos);
  CHECK(fs::is_directory(dir.path / "a_dir" / "inside"));
  CHECK(dir.entries() == 2);  // plain_file and a_dir: no temp file left

  // A write that fails midway (file size limit, which binds root too) leaves the previous file intact.
  const fs::path p = dir.path / "ckpt.safetensors";
  save_safetensors(p, {tensors[3]}, {{"step", "1"}});
  const std::string before = read_bytes(p);
  std::vector<float> big(4096, 1.0f);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  rlimit small = old;
  small.rlim_cur = 1024;
  auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string too_big;
  try {
    save_safetensors(p, {make_tensor<float>("big", {4096}, big)}, {{"step", "2"}});
  } catch (const pmap::IoError& e) { too_big = e.what(); }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous_handler);
  CHECK(too_big.find(std::strerror(EFBIG)) != std::string::npos);
  CHECK(read_bytes(p) == before);
  CHECK(load_safetensors(p).metadata.at("step") == "1");
  CHECK(dir.entries() == 3);
}

}  // namespace PMAPCC_TEST_FILE
