// Json::parse: a strict recursive-descent RFC 8259 parser that reports the source and byte offset of
// the first fault. Input may be hostile (safetensors headers): depth, UTF-8 and numbers are checked.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>

#include <pmap/error.h>

#include <pmapcc/ensemble/json.h>

namespace pmap::ensemble {
namespace {

class Parser {
 public:
  Parser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  Json run() {
    skip_ws();
    Json v = value(0);
    skip_ws();
    if (pos_ != text_.size()) fail("unexpected " + describe(pos_) + " after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
    throw DataError(std::string(source_) + ": byte " + std::to_string(at) + ": " + what);
  }
  // "'x'", "byte 0x07" or "end of input", for error messages.
  std::string describe(std::size_t at) const {
    if (at >= text_.size()) return "end of input";
    const auto c = static_cast<unsigned char>(text_[at]);
    if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
    char buf[16];
    std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  bool next_is(char c) const { return !at_end() && text_[pos_] == c; }
  void skip_ws() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }
  void expect(char c, const char* context) {
    if (!next_is(c))
      fail(std::string("expected '") + c + "' " + context + ", got " + describe(pos_));
    ++pos_;
  }

  Json value(int depth) {
    switch (peek()) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return Json(string());
      case 't': literal("true"); return Json(true);
      case 'f': literal("false"); return Json(false);
      case 'n': literal("null"); return Json(nullptr);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return number();
        fail("expected a value, got " + describe(pos_));
    }
  }

  void literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word)
      fail("invalid literal (expected '" + std::string(word) + "')");
    pos_ += word.size();
  }

  void check_depth(int depth) const {
    if (depth > Json::max_depth) fail("nesting deeper than " + std::to_string(Json::max_depth) + " levels");
  }

  Json array(int depth) {
    check_depth(depth);
    ++pos_;  // '['
    Json::Array items;
    skip_ws();
    if (next_is(']')) {
      ++pos_;
      return Json(std::move(items));
    }
    for (;;) {
      skip_ws();
      items.push_back(value(depth));
      skip_ws();
      if (next_is(',')) {
        ++pos_;
        continue;
      }
      expect(']', "or ',' in array");
      return Json(std::move(items));
    }
  }

  Json object(int depth) {
    check_depth(depth);
    ++pos_;  // '{'
    Json::Object members;
    std::vector<std::size_t> key_offsets;
    skip_ws();
    if (next_is('}')) {
      ++pos_;
      return Json(std::move(members));
    }
    for (;;) {
      skip_ws();
      if (!next_is('"')) fail("expected a string key, got " + describe(pos_));
      key_offsets.push_back(pos_);
      std::string key = string();
      skip_ws();
      expect(':', "after an object key");
      skip_ws();
      members.emplace_back(std::move(key), value(depth));
      skip_ws();
      if (next_is(',')) {
        ++pos_;
        continue;
      }
      expect('}', "or ',' in object");
      check_unique(members, key_offsets);
      return Json(std::move(members));
    }
  }

  // Rejects duplicate keys in O(n log n), naming the first repeated key in text order.
  void check_unique(const Json::Object& members, const std::vector<std::size_t>& offsets) const {
    if (members.size() < 2) return;
    std::vector<std::size_t> order(members.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return members[a].first < members[b].first; });
    std::size_t first_dup = members.size();
    for (std::size_t i = 1; i < order.size(); ++i)
      if (members[order[i]].first == members[order[i - 1]].first) first_dup = std::min(first_dup, order[i]);
    if (first_dup == members.size()) return;
    fail_at(offsets[first_dup], "duplicate object key " + detail::quoted(members[first_dup].first));
  }

  unsigned hex4() {
    unsigned v = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = peek();
      unsigned d = 0;
      if (at_end()) fail("unterminated \\u escape");
      if (c >= '0' && c <= '9')
        d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<unsigned>(c - 'A' + 10);
      else
        fail("invalid hex digit " + describe(pos_) + " in \\u escape");
      v = v * 16 + d;
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // The code point of a \uXXXX escape (pos_ just past the 'u'), joining surrogate pairs.
  unsigned unicode_escape(std::size_t escape_at) {
    const unsigned hi = hex4();
    if (hi >= 0xDC00 && hi <= 0xDFFF) fail_at(escape_at, "lone low surrogate in \\u escape");
    if (hi < 0xD800 || hi > 0xDBFF) return hi;
    if (text_.substr(pos_, 2) != "\\u") fail_at(escape_at, "high surrogate not followed by a low surrogate");
    pos_ += 2;
    const unsigned lo = hex4();
    if (lo < 0xDC00 || lo > 0xDFFF) fail_at(escape_at, "high surrogate not followed by a low surrogate");
    return 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
  }

  std::string string() {
    const std::size_t start = pos_++;  // '"'
    std::string out;
    for (;;) {
      if (at_end()) fail_at(start, "unterminated string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("unescaped control character " + describe(pos_) + " in string");
      if (c == '\\') {
        escape(out);
        continue;
      }
      const std::size_t n = detail::utf8_length(text_, pos_);
      if (n == 0) fail("invalid UTF-8 in string");
      out.append(text_.substr(pos_, n));
      pos_ += n;
    }
  }

  void escape(std::string& out) {
    const std::size_t escape_at = pos_++;
    const char c = peek();
    if (at_end()) fail_at(escape_at, "unterminated escape");
    ++pos_;
    switch (c) {
      case '"': out += '"'; return;
      case '\\': out += '\\'; return;
      case '/': out += '/'; return;
      case 'b': out += '\b'; return;
      case 'f': out += '\f'; return;
      case 'n': out += '\n'; return;
      case 'r': out += '\r'; return;
      case 't': out += '\t'; return;
      case 'u': append_utf8(out, unicode_escape(escape_at)); return;
      default: fail_at(escape_at, "invalid escape character " + describe(escape_at + 1) + " after '\\'");
    }
  }

  bool digit() const { return !at_end() && peek() >= '0' && peek() <= '9'; }
  void digits(const char* what) {
    if (!digit()) fail(std::string("expected a digit ") + what + ", got " + describe(pos_));
    while (digit()) ++pos_;
  }

  Json number() {
    const std::size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (next_is('0'))
      ++pos_;
    else
      digits("in number");
    bool integral = true;
    if (next_is('.')) {
      ++pos_;
      digits("after '.'");
      integral = false;
    }
    if (next_is('e') || next_is('E')) {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      digits("in exponent");
      integral = false;
    }
    const std::string_view token = text_.substr(start, pos_ - start);
    if (integral) {
      std::int64_t i = 0;
      const auto r = std::from_chars(token.data(), token.data() + token.size(), i);
      if (r.ec == std::errc()) return Json(i);  // else beyond int64: read as a double
    }
    double d = 0;
    const auto r = std::from_chars(token.data(), token.data() + token.size(), d);
    if (r.ec == std::errc::result_out_of_range) {
      if (decimal_magnitude(token) > 0) fail_at(start, "number out of the range of a double");
      return Json(token[0] == '-' ? -0.0 : 0.0);  // underflow
    }
    if (r.ec != std::errc() || r.ptr != token.data() + token.size()) fail_at(start, "invalid number");
    return Json(d);
  }

  // Roughly log10 |x| of a well-formed number token: positive for overflow, negative for underflow.
  static long long decimal_magnitude(std::string_view t) {
    std::size_t i = (t[0] == '-') ? 1 : 0;
    long long mag = 0;
    if (t[i] != '0') {
      while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i, ++mag;
    } else {
      i += (i + 1 < t.size() && t[i + 1] == '.') ? 2 : 1;  // past "0."
      while (i < t.size() && t[i] == '0') ++i, --mag;
    }
    const std::size_t e = t.find_first_of("eE");
    if (e == std::string_view::npos) return mag;
    long long exp = 0;
    std::size_t j = e + 1;
    const bool negative = t[j] == '-';
    if (t[j] == '-' || t[j] == '+') ++j;
    for (; j < t.size(); ++j) exp = std::min(exp * 10 + (t[j] - '0'), 1'000'000'000LL);
    return mag + (negative ? -exp : exp);
  }

  std::string_view text_;
  std::string_view source_;
  std::size_t pos_ = 0;
};

}  // namespace

Json Json::parse(std::string_view text, std::string_view source_name) {
  return Parser(text, source_name).run();
}

}  // namespace pmap::ensemble
