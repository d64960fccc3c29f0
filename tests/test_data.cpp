// Tests of the IDX reader, MNIST loading and batch gathering: small IDX files written here (raw and gzip),
// every validation fault, truncation at every length, and the real MNIST / Fashion-MNIST when present.
#include <doctest/doctest.h>
#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include <pmapcc/io/idx.h>
#include <pmapcc/train/data.h>
#include "pmap/error.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace fs = std::filesystem;
using pmap::train::Dataset;
using pmap::train::Split;
using Bytes = std::vector<std::uint8_t>;

namespace {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "pmapcc_data_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

void put_be32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

Bytes idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims, const Bytes& payload) {
  Bytes out;
  put_be32(out, magic);
  for (std::uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// The test set: 5 images of 3x4, pixel p of image i = (37 i + 11 p) mod 256; label i = 3 i mod 10.
constexpr std::uint32_t kCount = 5, kRows = 3, kCols = 4;
Bytes sample_pixels() {
  Bytes px;
  for (std::uint32_t i = 0; i < kCount; ++i)
    for (std::uint32_t p = 0; p < kRows * kCols; ++p) px.push_back(static_cast<std::uint8_t>((37 * i + 11 * p) % 256));
  return px;
}
Bytes sample_labels() {
  Bytes lb;
  for (std::uint32_t i = 0; i < kCount; ++i) lb.push_back(static_cast<std::uint8_t>(3 * i % 10));
  return lb;
}
Bytes image_file() { return idx_bytes(0x803, {kCount, kRows, kCols}, sample_pixels()); }
Bytes label_file() { return idx_bytes(0x801, {kCount}, sample_labels()); }

void write_raw(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gz(const fs::path& path, const Bytes& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  REQUIRE(gz != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(gz) == Z_OK);
}

Bytes read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs f and returns the DataError message it raised ("" when it raised nothing; any other exception fails).
std::string data_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const pmap::DataError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected DataError, got another exception: " << e.what());
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Expects f to raise DataError whose message names `file` (its file name) and contains `phrase`.
void check_fault(const std::function<void()>& f, const fs::path& file, const std::string& phrase) {
  const std::string msg = data_error(f);
  INFO("message: " << msg);
  CHECK_FALSE(msg.empty());
  CHECK(contains(msg, file.filename().string()));
  CHECK(contains(msg, phrase));
}

void check_sample(const Dataset& d) {
  CHECK(d.count == kCount);
  CHECK(d.rows == kRows);
  CHECK(d.cols == kCols);
  CHECK(d.num_classes == 10);
  CHECK(d.images == sample_pixels());
  CHECK(d.labels == sample_labels());
}

}  // namespace

TEST_CASE("IDX files round-trip exactly, raw or gzip, recognised by content not name") {
  TempDir dir;
  SUBCASE("raw") {
    write_raw(dir / "img", image_file());
    write_raw(dir / "lab", label_file());
    check_sample(pmap::train::load_idx_pair(dir / "img", dir / "lab"));
  }
  SUBCASE("gzip, one named without .gz and one raw file named .gz") {
    write_gz(dir / "img", image_file());
    write_raw(dir / "lab.gz", label_file());
    CHECK(read_all(dir / "img")[0] == 0x1f);
    check_sample(pmap::train::load_idx_pair(dir / "img", dir / "lab.gz"));
  }
  SUBCASE("read_idx returns the header's dims") {
    write_gz(dir / "img.gz", image_file());
    const auto arr = pmap::io::read_idx(dir / "img.gz", 3);
    CHECK(arr.dims == std::vector<std::int64_t>{kCount, kRows, kCols});
    CHECK(arr.data == sample_pixels());
  }
}

TEST_CASE("malformed IDX files raise DataError naming the file and the fault") {
  TempDir dir;
  const fs::path img = dir / "images-idx3-ubyte", lab = dir / "labels-idx1-ubyte";
  write_raw(lab, label_file());
  auto load = [&] { pmap::train::load_idx_pair(img, lab); };
  const std::string need = "need " + std::to_string(16 + kCount * kRows * kCols) + " bytes";

  SUBCASE("missing") { check_fault(load, img, "no such file"); }
  SUBCASE("a directory") {
    fs::create_directory(img);
    check_fault(load, img, "is a directory");
  }
  SUBCASE("not IDX at all") {
    write_raw(img, idx_bytes(0x12340803, {kCount, kRows, kCols}, sample_pixels()));
    check_fault(load, img, "bad magic number 0x12340803 (expected 0x00000803)");
  }
  SUBCASE("element type other than u8") {
    write_raw(img, idx_bytes(0x0d03, {kCount, kRows, kCols}, sample_pixels()));
    check_fault(load, img, "element type 0x0000000d is not unsigned byte");
  }
  SUBCASE("a label file where images are expected") {
    write_raw(img, label_file());
    check_fault(load, img, "wrong number of dims: 1, expected 3");
  }
  SUBCASE("truncated header") {
    Bytes b = image_file();
    b.resize(10);
    write_raw(img, b);
    check_fault(load, img, "truncated header: expected 16 bytes, got 10");
  }
  SUBCASE("truncated data, raw") {
    Bytes b = image_file();
    b.pop_back();
    write_raw(img, b);
    check_fault(load, img, "truncated: dims (5, 3, 4) " + need + ", file has " + std::to_string(b.size()));
  }
  SUBCASE("truncated data, gzip") {
    Bytes b = image_file();
    b.pop_back();
    write_gz(img, b);
    check_fault(load, img, need + " after decompression, got " + std::to_string(b.size()));
  }
  SUBCASE("trailing garbage, raw") {
    Bytes b = image_file();
    b.insert(b.end(), {1, 2, 3});
    write_raw(img, b);
    check_fault(load, img, "trailing garbage: 3 bytes after the expected");
  }
  SUBCASE("trailing garbage, gzip") {
    Bytes b = image_file();
    b.push_back(7);
    write_gz(img, b);
    check_fault(load, img, "trailing garbage");
  }
  SUBCASE("absurd size is refused before reading any data") {
    write_raw(img, idx_bytes(0x803, {60000, 65535, 65535}, {}));
    check_fault(load, img, "size too large: dims (60000, 65535, 65535)");
    write_gz(img, idx_bytes(0x803, {4294967295u, 4294967295u, 4294967295u}, {}));
    check_fault(load, img, "size too large");
  }
  SUBCASE("zero rows or cols") {
    write_raw(img, idx_bytes(0x803, {kCount, 0, kCols}, {}));
    check_fault(load, img, "zero dimension in dims (5, 0, 4)");
    write_raw(img, idx_bytes(0x803, {kCount, kRows, 0}, {}));
    check_fault(load, img, "zero dimension in dims (5, 3, 0)");
  }
}

TEST_CASE("image and label files that disagree raise DataError naming both") {
  TempDir dir;
  const fs::path img = dir / "images-idx3-ubyte", lab = dir / "labels-idx1-ubyte";
  write_raw(img, image_file());
  SUBCASE("count mismatch") {
    Bytes labels = sample_labels();
    labels.pop_back();
    write_raw(lab, idx_bytes(0x801, {kCount - 1}, labels));
    const std::string msg = data_error([&] { pmap::train::load_idx_pair(img, lab); });
    INFO(msg);
    CHECK(contains(msg, img.string() + " holds 5 images"));
    CHECK(contains(msg, lab.string() + " holds 4 labels"));
  }
  SUBCASE("label out of range") {
    Bytes labels = sample_labels();
    labels[3] = 10;
    write_raw(lab, idx_bytes(0x801, {kCount}, labels));
    check_fault([&] { pmap::train::load_idx_pair(img, lab); }, lab, "label 10 at index 3 is out of range [0, 10)");
    // Labels 0, 3, 6, 9, 2: with 4 classes the first bad one is index 2 (value 6).
    write_raw(lab, label_file());
    check_fault([&] { pmap::train::load_idx_pair(img, lab, 4); }, lab, "label 6 at index 2 is out of range [0, 4)");
  }
  SUBCASE("num_classes outside [1, 256] is a ValueError") {
    write_raw(lab, label_file());
    CHECK_THROWS_AS(pmap::train::load_idx_pair(img, lab, 0), pmap::ValueError);
    CHECK_THROWS_AS(pmap::train::load_idx_pair(img, lab, 257), pmap::ValueError);
  }
}

TEST_CASE("corrupt gzip streams raise DataError") {
  TempDir dir;
  const fs::path img = dir / "images-idx3-ubyte.gz";
  write_gz(img, image_file());
  const Bytes gz = read_all(img);
  REQUIRE(gz.size() > 20);
  SUBCASE("bad CRC in the trailer") {
    Bytes b = gz;
    b[b.size() - 8] ^= 0xff;
    write_raw(img, b);
    check_fault([&] { pmap::io::read_idx(img, 3); }, img, "corrupt gzip stream");
  }
  SUBCASE("invalid deflate block type") {
    Bytes b = gz;
    b[10] = 0xff;  // first byte after the 10-byte gzip header: BTYPE 11 is reserved
    write_raw(img, b);
    check_fault([&] { pmap::io::read_idx(img, 3); }, img, "corrupt gzip stream");
  }
  SUBCASE("compressed stream cut short") {
    Bytes b = gz;
    b.resize(b.size() - 4);  // drop ISIZE: the data is all there, the stream is not
    write_raw(img, b);
    check_fault([&] { pmap::io::read_idx(img, 3); }, img, "truncated gzip stream");
  }
}

TEST_CASE("every truncation of a valid file raises DataError") {
  TempDir dir;
  const fs::path path = dir / "cut";
  write_gz(dir / "whole.gz", image_file());
  const std::array<std::pair<Bytes, int>, 3> files = {
      std::pair{image_file(), 3}, std::pair{label_file(), 1}, std::pair{read_all(dir / "whole.gz"), 3}};
  for (const auto& [bytes, rank] : files) {
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      write_raw(path, Bytes(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)));
      INFO("rank " << rank << ", first " << n << " of " << bytes.size() << " bytes");
      CHECK_THROWS_AS(pmap::io::read_idx(path, rank), pmap::DataError);
    }
  }
}

TEST_CASE("any single corrupted byte either loads or raises DataError") {
  TempDir dir;
  const fs::path path = dir / "flipped";
  write_gz(dir / "whole.gz", image_file());
  for (const Bytes& good : {image_file(), read_all(dir / "whole.gz")}) {
    for (std::size_t i = 0; i < good.size(); ++i) {
      Bytes b = good;
      b[i] ^= 0xa5;
      write_raw(path, b);
      INFO("byte " << i << " of " << good.size());
      try {
        const auto arr = pmap::io::read_idx(path, 3);
        CHECK(arr.data.size() == kCount * kRows * kCols);
      } catch (const pmap::DataError&) {
      }
    }
  }
}

TEST_CASE("load_mnist finds raw or .gz files, honours limit, and says what it looked for") {
  TempDir dir;
  write_gz(dir / "train-images-idx3-ubyte.gz", image_file());
  write_raw(dir / "train-labels-idx1-ubyte", label_file());
  check_sample(pmap::train::load_mnist(dir.path, Split::train));
  check_sample(pmap::train::load_mnist(dir.path, Split::train, 100));

  const Dataset first3 = pmap::train::load_mnist(dir.path, Split::train, 3);
  CHECK(first3.count == 3);
  const Bytes pixels = sample_pixels();
  CHECK(first3.images == Bytes(pixels.begin(), pixels.begin() + 3 * kRows * kCols));
  CHECK(first3.labels == Bytes{0, 3, 6});
  CHECK_THROWS_AS(pmap::train::load_mnist(dir.path, Split::train, 0), pmap::ValueError);
  CHECK_THROWS_AS(pmap::train::load_mnist(dir.path, Split::train, -2), pmap::ValueError);

  const std::string msg = data_error([&] { pmap::train::load_mnist(dir.path, Split::test); });
  INFO(msg);
  CHECK(contains(msg, (dir / "t10k-images-idx3-ubyte").string() + " and "));
  CHECK(contains(msg, (dir / "t10k-images-idx3-ubyte.gz").string()));
  CHECK(contains(data_error([&] { pmap::train::load_mnist(dir / "nope", Split::train); }), "does not exist"));
}

TEST_CASE("gather_batch scales pixels to [0, 1] and keeps the order of the indices") {
  Dataset d;
  d.count = 4;
  d.rows = 2;
  d.cols = 3;
  for (int i = 0; i < 4 * 6; ++i) d.images.push_back(static_cast<std::uint8_t>(i == 5 ? 255 : 11 * i));
  d.labels = {7, 1, 9, 0};
  const std::vector<std::uint32_t> idx = {3, 0, 3, 1};
  std::vector<float> x(idx.size() * 6, -1.f);
  std::vector<std::int32_t> y(idx.size(), -1);
  pmap::train::gather_batch(d, idx, x.data(), y.data());
  for (std::size_t b = 0; b < idx.size(); ++b) {
    CHECK(y[b] == d.labels[idx[b]]);
    for (std::size_t p = 0; p < 6; ++p) CHECK(x[b * 6 + p] == static_cast<float>(d.images[idx[b] * 6 + p]) / 255.f);
  }
  CHECK(x[6 + 0] == 0.f);  // image 0, pixel 0 = 0
  CHECK(x[6 + 5] == 1.f);  // image 0, pixel 5 = 255

  const std::vector<std::uint32_t> bad = {1, 4};
  std::vector<float> untouched(12, -1.f);
  CHECK_THROWS_AS(pmap::train::gather_batch(d, bad, untouched.data(), y.data()), pmap::ValueError);
  CHECK(untouched == std::vector<float>(12, -1.f));
}

TEST_CASE("steps_per_epoch drops the last partial batch") {
  CHECK(pmap::train::steps_per_epoch(60000, 128) == 468);
  CHECK(pmap::train::steps_per_epoch(256, 128) == 2);
  CHECK(pmap::train::steps_per_epoch(127, 128) == 0);
  CHECK(pmap::train::steps_per_epoch(0, 1) == 0);
  CHECK_THROWS_AS(pmap::train::steps_per_epoch(10, 0), pmap::ValueError);
  CHECK_THROWS_AS(pmap::train::steps_per_epoch(-1, 8), pmap::ValueError);
}

namespace {

// Loads dataset `name` from data/<name> and checks sizes and the per-class label counts.
void check_real(const std::string& name, const std::array<std::int64_t, 10>& train_hist,
                const std::array<std::int64_t, 10>& test_hist) {
  const fs::path dir = fs::path(PMAPCC_SOURCE_DIR) / "data" / name;
  if (!fs::exists(dir / "train-images-idx3-ubyte") && !fs::exists(dir / "train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: no " << name << " in " << dir.string() << " (run scripts/get_data.sh)");
    return;
  }
  for (const auto& [split, count, hist] : {std::tuple{Split::train, 60000, train_hist},
                                           std::tuple{Split::test, 10000, test_hist}}) {
    const Dataset d = pmap::train::load_mnist(dir, split);
    CHECK(d.count == count);
    CHECK(d.rows == 28);
    CHECK(d.cols == 28);
    CHECK(d.images.size() == std::size_t(count) * 28 * 28);
    std::array<std::int64_t, 10> got{};
    for (std::uint8_t label : d.labels) ++got[label];
    std::int64_t total = 0;
    for (std::int64_t c : got) total += c;
    CHECK(total == count);
    CHECK(got == hist);
  }
}

}  // namespace

TEST_CASE("real MNIST, when present: 60000/10000 images of 28x28 and the known class counts") {
  check_real("mnist", {5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949},
             {980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009});
}

TEST_CASE("real Fashion-MNIST, when present: balanced classes") {
  std::array<std::int64_t, 10> train{}, test{};
  train.fill(6000);
  test.fill(1000);
  check_real("fashion-mnist", train, test);
}

}  // namespace PMAPCC_TEST_FILE
