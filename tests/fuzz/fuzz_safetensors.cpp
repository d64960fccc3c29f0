// libFuzzer target: io::load_safetensors, the reader of checkpoints (8-byte header length, JSON
// header, tensor bytes). Malformed files may only raise pmap::DataError. An accepted file must be what
// the header says (every tensor's bytes the size of its shape and dtype, together exactly the bytes after
// the header, names findable, metadata values
// either JSON or refused with DataError), and writing it back with save_safetensors and reading that
// again must give the same tensors and metadata.
#include <algorithm>

#include <pmap/error.h>

#include <pmapcc/io/safetensors.h>
#include "tests/fuzz/fuzz_common.h"

namespace se = pmap::io;

namespace {

[[noreturn]] void violated(const std::string& what) { pmap::fuzz::violated("fuzz_safetensors", what); }

bool same(const se::TensorEntry& a, const se::TensorEntry& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.data == b.data;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = pmap::fuzz::scratch().write("input.safetensors", {data, size});
  se::SafetensorsFile f;
  try {
    f = se::load_safetensors(path);
  } catch (const pmap::DataError&) {
    return 0;
  }
  std::size_t total = 0;
  for (const se::TensorEntry& t : f.tensors) {
    std::size_t count = 1;
    for (std::int64_t d : t.shape) {
      if (d < 0) violated("accepted a negative dimension in " + t.name);
      count *= static_cast<std::size_t>(d);
    }
    if (count * pmap::size_of(t.dtype) != t.data.size()) violated("tensor " + t.name + " has the wrong byte count");
    if (f.find(t.name) != &t || &f.at(t.name) != &t) violated("tensor " + t.name + " is not found by name");
    total += t.data.size();
  }
  // The tensors tile the data buffer: their bytes are exactly what follows the header.
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | data[i];
  if (header > size - 8 || total != size - 8 - header)
    violated("the tensors hold " + std::to_string(total) + " bytes, the data buffer has " +
             std::to_string(size - 8 - std::min<std::uint64_t>(header, size - 8)));
  for (const auto& [key, value] : f.metadata) {
    try {
      (void)f.metadata_json(key);
    } catch (const pmap::DataError&) {
    }
  }
  try {
    (void)f.at("no such tensor: fuzz");
    violated("at() found a tensor that is not there");
  } catch (const pmap::DataError&) {
  }

  const auto copy = pmap::fuzz::scratch().path() / "copy.safetensors";
  try {
    se::save_safetensors(copy, f.tensors, f.metadata);
  } catch (const pmap::Error& e) {
    violated(std::string("an accepted file cannot be written back: ") + e.what());
  }
  se::SafetensorsFile g;
  try {
    g = se::load_safetensors(copy);
  } catch (const pmap::Error& e) {
    violated(std::string("a file save_safetensors wrote is refused: ") + e.what());
  }
  if (g.metadata != f.metadata || g.tensors.size() != f.tensors.size()) violated("the written-back file differs");
  for (std::size_t i = 0; i < f.tensors.size(); ++i)
    if (!same(f.tensors[i], g.tensors[i])) violated("tensor " + f.tensors[i].name + " differs after writing back");
  return 0;
}
