// Reading and writing safetensors files (Hugging Face's format), the checkpoint format of pmapcc:
// an 8-byte little-endian header length N, N bytes of JSON header, then the tensors' bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pmap/dtype.h>
#include <pmap/error.h>

#include <pmapcc/io/json.h>

namespace pmap::io {

// One named tensor: dense, row-major ('C' order), little-endian bytes.
struct TensorEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;  // [] is a scalar; a 0 anywhere makes an empty tensor
  std::vector<std::byte> data;      // exactly product(shape) * size_of(dtype) bytes
};

// The contents of a safetensors file.
struct SafetensorsFile {
  std::filesystem::path path;                   // where it was read from (for error messages)
  std::vector<TensorEntry> tensors;             // in the order of their bytes in the file
  std::map<std::string, std::string> metadata;  // the "__metadata__" map (empty when absent)

  // The tensor called `name`, or nullptr.
  const TensorEntry* find(std::string_view name) const;
  // The tensor called `name`; throws pmap::DataError naming the file when it is absent.
  const TensorEntry& at(std::string_view name) const;
  // metadata[key] parsed as JSON (we store JSON texts there). Throws pmap::DataError naming the file
  // and key when the key is missing or its value is not valid JSON.
  Json metadata_json(std::string_view key) const;
};

// The largest header load_safetensors accepts, in bytes (the reference implementation's limit).
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

// "F32", "F64", "I32", "I64", "U32", "U8": the spelling of a dtype in a safetensors header.
std::string_view safetensors_dtype_name(DType t);

// Writes `tensors` (in the given order, contiguous, no padding between them) and `metadata` to `path`,
// atomically: the bytes go to a uniquely named temp file in the same directory, which is fsynced and
// renamed over `path`; then the directory is fsynced. If anything fails, `path` keeps its previous
// content (or stays absent) and the temp file is removed. The header is padded with spaces so the
// byte buffer starts at a multiple of 8. Blocking; host memory only.
// Throws pmap::ValueError for a duplicate or reserved ("__metadata__") tensor name or a non-UTF-8
// string, pmap::ShapeError for a negative dimension or data whose size does not match shape and dtype,
// pmap::IoError (naming the path and the OS error) when the file system refuses. An IoError from the
// final directory fsync means the new file is in place but may not survive a power loss.
void save_safetensors(const std::filesystem::path& path, const std::vector<TensorEntry>& tensors,
                      const std::map<std::string, std::string>& metadata);

// Writes `bytes` to `path` atomically, as save_safetensors writes its file (temp file, fsync, rename,
// directory fsync; on failure `path` keeps its previous content and the temp file is removed): for other
// formats written whole (ONNX models). ValueError for a path that names no file, IoError as above.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

// Reads and validates a whole safetensors file: header length within the file and under
// safetensors_max_header_bytes; header a JSON object starting with '{' (trailing spaces allowed) and
// without duplicate keys; dtypes among F32 F64 I32 I64 U32 U8; non-negative dimensions without overflow;
// data_offsets [begin, end] with end - begin == product(shape) * dtype size; and the tensors tiling the
// byte buffer exactly (no overlap, no hole, no trailing byte). "__metadata__", if present, must map
// strings to strings. Allocates no more than the file's size. Blocking.
// Throws pmap::DataError "<path>: <fault>" for a missing or malformed file, pmap::IoError for other
// OS failures (permissions, read errors).
SafetensorsFile load_safetensors(const std::filesystem::path& path);

// A tensor entry holding a copy of `values` (row-major, size must be product(shape): pmap::ShapeError).
template <Element T>
TensorEntry make_tensor(std::string name, std::vector<std::int64_t> shape, std::span<const T> values) {
  std::size_t count = 1;
  bool fits = true;
  for (std::int64_t d : shape) {
    const auto u = static_cast<std::size_t>(d);
    if (d < 0 || (u != 0 && count > SIZE_MAX / u)) fits = false;
    if (fits) count *= u;
  }
  if (!fits || count != values.size())
    throw ShapeError("make_tensor " + name + ": shape does not hold " + std::to_string(values.size()) +
                     " elements");
  TensorEntry e{std::move(name), dtype_of<T>, std::move(shape), std::vector<std::byte>(values.size_bytes())};
  if (!values.empty()) std::memcpy(e.data.data(), values.data(), values.size_bytes());
  return e;
}

// The entry's elements as T. Throws pmap::ShapeError when T does not match the entry's dtype.
template <Element T>
std::vector<T> tensor_values(const TensorEntry& e) {
  if (e.dtype != dtype_of<T>)
    throw ShapeError("tensor " + e.name + " is " + std::string(name(e.dtype)) + ", read as " +
                     std::string(name(dtype_of<T>)));
  std::vector<T> out(e.data.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), e.data.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace pmap::io
