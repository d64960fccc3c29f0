// JSON for the file formats: nlohmann::ordered_json (objects keep their insertion order, so files read in the
// order they were written), parsed with the limits a file from disk needs, and a view whose errors name the
// file and the path of the value ("ckpt.safetensors: __metadata__.step: expected an integer, got a string").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace pmap::io {

using Json = nlohmann::ordered_json;

// Deepest nesting of arrays and objects that parse_json accepts.
inline constexpr int kMaxJsonDepth = 64;

// Parses one JSON text (RFC 8259, UTF-8) read from `source` (a file name, or "file: header"). Besides what
// nlohmann rejects (trailing text, invalid UTF-8, lone surrogates, numbers beyond a double), rejects
// NUL bytes, duplicate object keys and nesting deeper than kMaxJsonDepth; a UTF-8 byte order mark is skipped.
// Throws pmap::DataError "<source>: <what>", with the byte (counted from 1) for a syntax error.
Json parse_json(std::string_view text, std::string_view source);

// Serializes: compact for indent < 0, else one member per line, indented by `indent` spaces per level.
// Doubles are written in the shortest form that reads back bit-exact (0.1, 1.0); NaN and infinities become
// null. Throws pmap::ValueError for a string that is not valid UTF-8.
std::string dump_json(const Json& value, int indent = -1);

// "null", "a boolean", "an integer", "a number", "a string", "an array", "an object".
std::string_view json_type_name(const Json& value) noexcept;

// `s` in double quotes with JSON escapes, for an error message: invalid UTF-8 shows as U+FFFD, and the text
// is cut after `max_bytes` bytes ("..." follows the closing quote).
std::string quoted(std::string_view s, std::size_t max_bytes = 64);

// A read-only view of a Json value that remembers its source and path, so type errors read
// "<source>: <path>: expected a string, got an integer" (paths like `__metadata__.step`, `shape[1]`,
// `["a.b"].dtype`). Holds a reference: the viewed value must outlive the view.
class JsonView {
 public:
  // A view of the root `value` of `source` ("ckpt.safetensors"), or of a value found at `path` in it.
  JsonView(const Json& value, std::string source, std::string path = {})
      : value_(&value), source_(std::move(source)), path_(std::move(path)) {}

  const Json& json() const noexcept { return *value_; }
  const std::string& path() const noexcept { return path_; }

  // Member `key` of an object; DataError if this is not an object or the key is missing.
  JsonView operator[](std::string_view key) const;
  // Element i of an array; DataError if this is not an array or i is out of range.
  JsonView operator[](std::size_t i) const;
  // Whether an object has member `key` (DataError if this is not an object).
  bool contains(std::string_view key) const;
  std::size_t size() const;  // array elements or object members; DataError for other types

  bool is_null() const noexcept { return value_->is_null(); }
  bool as_bool() const;
  std::int64_t as_int() const;  // an integer (not 3.0) in int64 range
  double as_double() const;     // any number; an integer is converted
  const std::string& as_string() const;
  const Json& as_object() const;  // the value, checked to be an object (iterate with .items())

  // Throws pmap::DataError "<source>: <path>: <what>" (the path omitted at the root).
  [[noreturn]] void fail(std::string_view what) const;
  // The path of member `key` / element `i` below this one.
  std::string child_path(std::string_view key) const;
  std::string child_path(std::size_t i) const;

 private:
  [[noreturn]] void mismatch(std::string_view expected) const;

  const Json* value_;
  std::string source_;
  std::string path_;
};

}  // namespace pmap::io
