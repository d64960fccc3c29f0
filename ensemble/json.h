// A small JSON value type (parse, build, dump) for checkpoint headers and metrics output.
// Integers and doubles stay distinct so integers round-trip exactly; objects keep insertion order.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace pmap::ensemble {

class Json {
 public:
  enum class Type : std::uint8_t { null, boolean, integer, number, string, array, object };
  using Array = std::vector<Json>;
  using Member = std::pair<std::string, Json>;
  using Object = std::vector<Member>;  // insertion order; keys unique when built by parse() or set()

  // Deepest nesting of arrays/objects that parse() accepts (a guard against stack exhaustion).
  static constexpr int max_depth = 64;

  Json() noexcept = default;  // null
  Json(std::nullptr_t) noexcept {}
  Json(bool b) noexcept : value_(b) {}
  // Any integer type. Throws pmap::ValueError for an unsigned value above INT64_MAX.
  template <std::integral T>
  requires(!std::same_as<T, bool>) Json(T v) : value_(to_int64(v)) {}
  // Any floating type; stored as double. NaN and Inf may be stored but dump() rejects them.
  template <std::floating_point T>
  Json(T v) noexcept : value_(static_cast<double>(v)) {}
  Json(const char* s) : value_(std::string(s)) {}
  Json(std::string_view s) : value_(std::string(s)) {}
  Json(std::string s) noexcept : value_(std::move(s)) {}
  Json(Array a) noexcept : value_(std::move(a)) {}
  Json(Object o) noexcept : value_(std::move(o)) {}

  static Json array() { return Json(Array{}); }
  static Json object() { return Json(Object{}); }

  // Parses one JSON text (RFC 8259, UTF-8). Rejects trailing non-whitespace, duplicate object keys,
  // invalid UTF-8, lone surrogates, nesting deeper than max_depth, and numbers that overflow a double.
  // Integers without fraction or exponent that fit in int64 become integers, other numbers doubles.
  // Throws pmap::DataError "<source_name>: byte <offset>: <what is wrong>".
  static Json parse(std::string_view text, std::string_view source_name);

  // Serializes. indent < 0: compact ("{"a":1}"); indent >= 0: one member per line, indented by
  // `indent` spaces per level. Doubles are written in the shortest form that reads back bit-exact and
  // always with a '.' or exponent, so they parse back as doubles. Throws pmap::ValueError naming the
  // path for NaN/Inf or a string that is not valid UTF-8.
  std::string dump(int indent = -1) const;

  Type type() const noexcept { return static_cast<Type>(value_.index()); }
  bool is_null() const noexcept { return type() == Type::null; }
  bool is_bool() const noexcept { return type() == Type::boolean; }
  bool is_integer() const noexcept { return type() == Type::integer; }
  bool is_double() const noexcept { return type() == Type::number; }
  bool is_number() const noexcept { return is_integer() || is_double(); }
  bool is_string() const noexcept { return type() == Type::string; }
  bool is_array() const noexcept { return type() == Type::array; }
  bool is_object() const noexcept { return type() == Type::object; }

  // Typed access. Each throws pmap::DataError "expected <a type>, got <the type>" on a mismatch;
  // use JsonView for messages that also name the source and the path.
  bool as_bool() const;
  std::int64_t as_int() const;
  double as_double() const;  // an integer is converted
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Objects: the value under `key`, or nullptr when absent (throws if this is not an object).
  const Json* find(std::string_view key) const;
  Json* find(std::string_view key);
  // Objects: replaces the value under `key`, or appends the member at the end. Returns the value.
  Json& set(std::string_view key, Json value);
  // Arrays: appends. Returns the new element.
  Json& push_back(Json value);
  // Number of elements of an array or members of an object; throws for other types.
  std::size_t size() const;

  // Structural equality: types must match (1 != 1.0) and object members compare in order.
  friend bool operator==(const Json&, const Json&) = default;

  // "null", "a boolean", "an integer", "a number", "a string", "an array", "an object".
  static std::string_view type_name(Type t) noexcept;

 private:
  template <class T>
  static std::int64_t to_int64(T v) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      if (v > static_cast<T>(INT64_MAX)) throw_unsigned_overflow();
    }
    return static_cast<std::int64_t>(v);
  }
  [[noreturn]] static void throw_unsigned_overflow();

  std::variant<std::nullptr_t, bool, std::int64_t, double, std::string, Array, Object> value_;
};

// A read-only view of a Json value that remembers its source and path, so type errors read
// "<source>: <path>: expected a string, got an integer" (path like `__metadata__.step`, `shape[1]`,
// `["a.b"].dtype`). Holds a reference: the viewed Json must outlive the view.
class JsonView {
 public:
  // A view of the root `value` of `source` ("ckpt.safetensors"), or of a value found at `path` in it.
  JsonView(const Json& value, std::string source, std::string path = {})
      : value_(&value), source_(std::move(source)), path_(std::move(path)) {}

  const Json& json() const noexcept { return *value_; }
  const std::string& path() const noexcept { return path_; }
  Json::Type type() const noexcept { return value_->type(); }

  // Member `key` of an object; throws DataError if this is not an object or the key is missing.
  JsonView operator[](std::string_view key) const;
  // Element i of an array; throws DataError if this is not an array or i is out of range.
  JsonView operator[](std::size_t i) const;
  // Whether an object has member `key` (throws DataError if this is not an object).
  bool contains(std::string_view key) const;
  std::size_t size() const;  // array elements or object members

  bool as_bool() const;
  std::int64_t as_int() const;
  double as_double() const;
  const std::string& as_string() const;
  const Json::Array& as_array() const;
  const Json::Object& as_object() const;

  // Throws pmap::DataError "<source>: <path>: <what>" (the path omitted at the root).
  [[noreturn]] void fail(std::string_view what) const;
  // The path of member `key` / element `i` below this one.
  std::string child_path(std::string_view key) const;
  std::string child_path(std::size_t i) const;

 private:
  void expect(Json::Type t) const;

  const Json* value_;
  std::string source_;
  std::string path_;
};

namespace detail {
// Length (1-4) of the well-formed UTF-8 sequence starting at s[pos], or 0 if it is malformed
// (overlong, surrogate, above U+10FFFF, truncated). pos must be < s.size().
std::size_t utf8_length(std::string_view s, std::size_t pos) noexcept;
// s in double quotes for an error message: escaped, invalid UTF-8 shown as \xNN, cut after max_bytes.
std::string quoted(std::string_view s, std::size_t max_bytes = 64);
}  // namespace detail

}  // namespace pmap::ensemble
