// Json values: typed access, building, serialization (dump), and JsonView's path-carrying access.
// Parsing lives in json_parse.cpp.
#include <pmapcc/ensemble/json.h>

#include <charconv>
#include <cmath>
#include <cstdio>

#include <pmap/error.h>

namespace pmap::ensemble {
namespace detail {

std::size_t utf8_length(std::string_view s, std::size_t pos) noexcept {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[pos + i]); };
  const unsigned char lead = b(0);
  if (lead < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF)
    n = 2;
  else if (lead == 0xE0)
    n = 3, lo = 0xA0;
  else if (lead >= 0xE1 && lead <= 0xEC)
    n = 3;
  else if (lead == 0xED)
    n = 3, hi = 0x9F;  // no UTF-16 surrogates
  else if (lead >= 0xEE && lead <= 0xEF)
    n = 3;
  else if (lead == 0xF0)
    n = 4, lo = 0x90;
  else if (lead >= 0xF1 && lead <= 0xF3)
    n = 4;
  else if (lead == 0xF4)
    n = 4, hi = 0x8F;  // nothing above U+10FFFF
  else
    return 0;
  if (s.size() - pos < n) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i)
    if (b(i) < 0x80 || b(i) > 0xBF) return 0;
  return n;
}

std::string quoted(std::string_view s, std::size_t max_bytes) {
  std::string out = "\"";
  std::size_t i = 0;
  while (i < s.size() && i < max_bytes) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = detail::utf8_length(s, i);
    char buf[8];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f || n == 0) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    ++i;
  }
  out += i < s.size() ? "\"..." : "\"";
  return out;
}

}  // namespace detail

namespace {

bool is_identifier(std::string_view key) {
  if (key.empty() || key.size() > 64 || (key[0] >= '0' && key[0] <= '9')) return false;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  return true;
}

std::string key_path(const std::string& parent, std::string_view key) {
  if (!is_identifier(key)) return parent + "[" + detail::quoted(key) + "]";
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

std::string index_path(const std::string& parent, std::size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

[[noreturn]] void type_mismatch(Json::Type expected, Json::Type got) {
  throw DataError("expected " + std::string(Json::type_name(expected)) + ", got " +
                  std::string(Json::type_name(got)));
}

// One step of the path from the root to the value being written, for dump()'s error messages.
struct PathLink {
  const PathLink* parent;
  std::string_view key;
  std::size_t index;
  bool is_key;
};

std::string format_path(const PathLink* link) {
  if (link == nullptr) return "";
  const std::string parent = format_path(link->parent);
  return link->is_key ? key_path(parent, link->key) : index_path(parent, link->index);
}

class Writer {
 public:
  explicit Writer(int indent) : indent_(indent) {}
  std::string take() { return std::move(out_); }

  void value(const Json& v, const PathLink* at, int level) {
    switch (v.type()) {
      case Json::Type::null: out_ += "null"; return;
      case Json::Type::boolean: out_ += v.as_bool() ? "true" : "false"; return;
      case Json::Type::integer: out_ += std::to_string(v.as_int()); return;
      case Json::Type::number: number(v.as_double(), at); return;
      case Json::Type::string: string(v.as_string(), at); return;
      case Json::Type::array: array(v.as_array(), at, level); return;
      case Json::Type::object: object(v.as_object(), at, level); return;
    }
  }

 private:
  [[noreturn]] static void fail(const PathLink* at, const std::string& what) {
    const std::string path = format_path(at);
    throw ValueError("Json::dump: " + (path.empty() ? "" : path + ": ") + what);
  }

  void newline(int level) {
    if (indent_ < 0) return;
    out_ += '\n';
    out_.append(static_cast<std::size_t>(level) * static_cast<std::size_t>(indent_), ' ');
  }

  void number(double d, const PathLink* at) {
    if (!std::isfinite(d))
      fail(at, std::string(std::isnan(d) ? "NaN" : "Inf") + " is not representable in JSON");
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, d);  // shortest form that reads back exactly
    const std::string_view s(buf, static_cast<std::size_t>(r.ptr - buf));
    out_ += s;
    if (s.find_first_of(".e") == std::string_view::npos) out_ += ".0";  // stays a double when read back
  }

  void string(std::string_view s, const PathLink* at) {
    out_ += '"';
    for (std::size_t i = 0; i < s.size();) {
      const auto c = static_cast<unsigned char>(s[i]);
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\b': out_ += "\\b"; break;
        case '\f': out_ += "\\f"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out_ += buf;
          } else {
            const std::size_t n = detail::utf8_length(s, i);
            if (n == 0) fail(at, "string " + detail::quoted(s) + " is not valid UTF-8");
            out_.append(s.substr(i, n));
            i += n;
            continue;
          }
      }
      ++i;
    }
    out_ += '"';
  }

  void array(const Json::Array& items, const PathLink* at, int level) {
    out_ += '[';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out_ += ',';
      newline(level + 1);
      const PathLink link{at, {}, i, false};
      value(items[i], &link, level + 1);
    }
    if (!items.empty()) newline(level);
    out_ += ']';
  }

  void object(const Json::Object& members, const PathLink* at, int level) {
    out_ += '{';
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i > 0) out_ += ',';
      newline(level + 1);
      const PathLink link{at, members[i].first, 0, true};
      string(members[i].first, &link);
      out_ += indent_ < 0 ? ":" : ": ";
      value(members[i].second, &link, level + 1);
    }
    if (!members.empty()) newline(level);
    out_ += '}';
  }

  int indent_;
  std::string out_;
};

}  // namespace

void Json::throw_unsigned_overflow() { throw ValueError("Json: unsigned integer above INT64_MAX"); }

std::string_view Json::type_name(Type t) noexcept {
  switch (t) {
    case Type::null: return "null";
    case Type::boolean: return "a boolean";
    case Type::integer: return "an integer";
    case Type::number: return "a number";
    case Type::string: return "a string";
    case Type::array: return "an array";
    case Type::object: return "an object";
  }
  return "?";
}

std::string Json::dump(int indent) const {
  Writer w(indent);
  w.value(*this, nullptr, 0);
  return w.take();
}

bool Json::as_bool() const {
  if (!is_bool()) type_mismatch(Type::boolean, type());
  return std::get<bool>(value_);
}
std::int64_t Json::as_int() const {
  if (!is_integer()) type_mismatch(Type::integer, type());
  return std::get<std::int64_t>(value_);
}
double Json::as_double() const {
  if (is_integer()) return static_cast<double>(std::get<std::int64_t>(value_));
  if (!is_double()) type_mismatch(Type::number, type());
  return std::get<double>(value_);
}
const std::string& Json::as_string() const {
  if (!is_string()) type_mismatch(Type::string, type());
  return std::get<std::string>(value_);
}
const Json::Array& Json::as_array() const {
  if (!is_array()) type_mismatch(Type::array, type());
  return std::get<Array>(value_);
}
Json::Array& Json::as_array() {
  if (!is_array()) type_mismatch(Type::array, type());
  return std::get<Array>(value_);
}
const Json::Object& Json::as_object() const {
  if (!is_object()) type_mismatch(Type::object, type());
  return std::get<Object>(value_);
}
Json::Object& Json::as_object() {
  if (!is_object()) type_mismatch(Type::object, type());
  return std::get<Object>(value_);
}

const Json* Json::find(std::string_view key) const {
  for (const Member& m : as_object())
    if (m.first == key) return &m.second;
  return nullptr;
}
Json* Json::find(std::string_view key) {
  for (Member& m : as_object())
    if (m.first == key) return &m.second;
  return nullptr;
}

Json& Json::set(std::string_view key, Json value) {
  if (Json* existing = find(key)) return *existing = std::move(value);
  return as_object().emplace_back(std::string(key), std::move(value)).second;
}

Json& Json::push_back(Json value) { return as_array().emplace_back(std::move(value)); }

std::size_t Json::size() const {
  if (is_array()) return as_array().size();
  return as_object().size();
}

// ---- JsonView ----

void JsonView::fail(std::string_view what) const {
  throw DataError(source_ + ": " + (path_.empty() ? "" : path_ + ": ") + std::string(what));
}

std::string JsonView::child_path(std::string_view key) const { return key_path(path_, key); }
std::string JsonView::child_path(std::size_t i) const { return index_path(path_, i); }

void JsonView::expect(Json::Type t) const {
  if (value_->type() != t)
    fail("expected " + std::string(Json::type_name(t)) + ", got " + std::string(Json::type_name(type())));
}

JsonView JsonView::operator[](std::string_view key) const {
  expect(Json::Type::object);
  const Json* child = value_->find(key);
  if (child == nullptr) JsonView(*value_, source_, child_path(key)).fail("missing");
  return JsonView(*child, source_, child_path(key));
}

JsonView JsonView::operator[](std::size_t i) const {
  expect(Json::Type::array);
  if (i >= value_->size())
    JsonView(*value_, source_, child_path(i))
        .fail("missing (array has " + std::to_string(value_->size()) + " elements)");
  return JsonView(value_->as_array()[i], source_, child_path(i));
}

bool JsonView::contains(std::string_view key) const {
  expect(Json::Type::object);
  return value_->find(key) != nullptr;
}

std::size_t JsonView::size() const {
  if (!value_->is_array() && !value_->is_object()) fail("expected an array or an object");
  return value_->size();
}

bool JsonView::as_bool() const {
  expect(Json::Type::boolean);
  return value_->as_bool();
}
std::int64_t JsonView::as_int() const {
  expect(Json::Type::integer);
  return value_->as_int();
}
double JsonView::as_double() const {
  if (!value_->is_number()) expect(Json::Type::number);
  return value_->as_double();
}
const std::string& JsonView::as_string() const {
  expect(Json::Type::string);
  return value_->as_string();
}
const Json::Array& JsonView::as_array() const {
  expect(Json::Type::array);
  return value_->as_array();
}
const Json::Object& JsonView::as_object() const {
  expect(Json::Type::object);
  return value_->as_object();
}

}  // namespace pmap::ensemble
