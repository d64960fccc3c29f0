// parse_json's limits and error messages over nlohmann's parser, dump_json, and JsonView.
#include <pmapcc/io/json.h>

#include <set>
#include <vector>

#include <pmap/error.h>

namespace pmap::io {
namespace {

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line 1, column 5: " prefix.
std::string plain_message(const nlohmann::json::exception& e) {
  std::string_view m = e.what();
  if (const auto close = m.find("] "); m.starts_with("[json.exception.") && close != m.npos) m.remove_prefix(close + 2);
  if (m.starts_with("parse error")) {
    if (const auto colon = m.find(": "); colon != m.npos) m.remove_prefix(colon + 2);
  }
  return std::string(m);
}

// Tracks the objects and arrays being parsed: their depth, and each object's keys so far.
class Limits {
 public:
  explicit Limits(std::string_view source) : source_(source) {}

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (open_.size() == kMaxJsonDepth)
          throw DataError(std::string(source_) + ": nesting deeper than " + std::to_string(kMaxJsonDepth) +
                          " arrays and objects");
        open_.emplace_back();
        break;
      case E::object_end:
      case E::array_end: open_.pop_back(); break;
      case E::key:
        if (!open_.back().insert(parsed.get_ref<const std::string&>()).second)
          throw DataError(std::string(source_) + ": duplicate key " + io::quoted(parsed.get_ref<const std::string&>()));
        break;
      case E::value: break;
    }
    return true;
  }

 private:
  std::string_view source_;
  std::vector<std::set<std::string>> open_;  // one key set per open object or array, outermost first
};

bool is_identifier(std::string_view key) {
  if (key.empty() || key.size() > 64 || (key[0] >= '0' && key[0] <= '9')) return false;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace

Json parse_json(std::string_view text, std::string_view source) {
  // nlohmann stops at a NUL byte as at the end of input; JSON text never holds one (not even in a string).
  if (const auto nul = text.find('\0'); nul != text.npos)
    throw DataError(std::string(source) + ": byte " + std::to_string(nul + 1) + ": a NUL byte");
  try {
    return Json::parse(text.begin(), text.end(), Limits(source));
  } catch (const Json::parse_error& e) {
    throw DataError(std::string(source) + ": byte " + std::to_string(e.byte) + ": " + plain_message(e));
  } catch (const Json::exception& e) {  // out_of_range.406: a number beyond a double
    throw DataError(std::string(source) + ": " + plain_message(e));
  }
}

std::string dump_json(const Json& value, int indent) {
  try {
    return value.dump(indent);
  } catch (const Json::type_error& e) {  // type_error.316: invalid UTF-8
    throw ValueError("JSON output: " + plain_message(e));
  }
}

std::string_view json_type_name(const Json& value) noexcept {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "a binary value";
  }
}

std::string quoted(std::string_view s, std::size_t max_bytes) {
  const bool cut = s.size() > max_bytes;
  const Json text = std::string(s.substr(0, max_bytes));
  return text.dump(-1, ' ', false, Json::error_handler_t::replace) + (cut ? "..." : "");
}

void JsonView::fail(std::string_view what) const {
  throw DataError(source_ + ": " + (path_.empty() ? "" : path_ + ": ") + std::string(what));
}

void JsonView::mismatch(std::string_view expected) const {
  fail("expected " + std::string(expected) + ", got " + std::string(json_type_name(*value_)));
}

std::string JsonView::child_path(std::string_view key) const {
  if (!is_identifier(key)) return path_ + "[" + io::quoted(key) + "]";
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

std::string JsonView::child_path(std::size_t i) const { return path_ + "[" + std::to_string(i) + "]"; }

JsonView JsonView::operator[](std::string_view key) const {
  const Json& object = as_object();
  const auto it = object.find(key);
  if (it == object.end()) JsonView(*value_, source_, child_path(key)).fail("missing");
  return JsonView(*it, source_, child_path(key));
}

JsonView JsonView::operator[](std::size_t i) const {
  if (!value_->is_array()) mismatch("an array");
  if (i >= value_->size())
    JsonView(*value_, source_, child_path(i))
        .fail("missing (array has " + std::to_string(value_->size()) + " elements)");
  return JsonView((*value_)[i], source_, child_path(i));
}

bool JsonView::contains(std::string_view key) const { return as_object().contains(key); }

std::size_t JsonView::size() const {
  if (!value_->is_array() && !value_->is_object()) mismatch("an array or an object");
  return value_->size();
}

bool JsonView::as_bool() const {
  if (!value_->is_boolean()) mismatch("a boolean");
  return value_->get<bool>();
}

std::int64_t JsonView::as_int() const {
  if (value_->is_number_unsigned()) {
    const auto u = value_->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(INT64_MAX)) fail("integer " + std::to_string(u) + " is above INT64_MAX");
    return static_cast<std::int64_t>(u);
  }
  if (!value_->is_number_integer()) mismatch("an integer");
  return value_->get<std::int64_t>();
}

double JsonView::as_double() const {
  if (!value_->is_number()) mismatch("a number");
  return value_->get<double>();
}

const std::string& JsonView::as_string() const {
  if (!value_->is_string()) mismatch("a string");
  return value_->get_ref<const std::string&>();
}

const Json& JsonView::as_object() const {
  if (!value_->is_object()) mismatch("an object");
  return *value_;
}

}  // namespace pmap::io
