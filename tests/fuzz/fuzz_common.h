// What the fuzz targets (tests/fuzz/fuzz_*.cpp) share: a scratch file per process that an input is
// written to (the parsers read paths, as the program does), and the rule every target enforces: a parser
// of outside bytes may only refuse them with the pmapcc errors its header documents. Any other exception
// escapes LLVMFuzzerTestOneInput, which libFuzzer (and the replay driver) reports as a crash.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

namespace pmap::fuzz {

// A directory of this process's scratch files: in /dev/shm when there is one (no disk writes at
// thousands of inputs a second), else the system temp directory. Removed when the process exits.
class ScratchDir {
 public:
  ScratchDir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path base = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    dir_ = base / ("pmapcc-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // dir/name holding exactly `bytes` (replaced if it exists).
  std::filesystem::path write(const std::string& name, std::span<const std::uint8_t> bytes) const {
    const std::filesystem::path p = dir_ / name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::fprintf(stderr, "fuzz: cannot write the scratch file %s\n", p.c_str());
      std::abort();
    }
    return p;
  }
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

inline const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

// A property the target checks on an accepted input failed: report it the way libFuzzer reports a crash.
[[noreturn]] inline void violated(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: property violated: %s\n", target, what.c_str());
  std::abort();
}

}  // namespace pmap::fuzz
