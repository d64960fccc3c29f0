// Tests of pmap::ensemble::Json: round trips (exact integers and doubles), escaping, strictness of the
// parser (errors with source and byte offset), the depth limit, and JsonView's path-naming errors.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <pmapcc/ensemble/json.h>
#include "pmap/error.h"

using pmap::ensemble::Json;
using pmap::ensemble::JsonView;

namespace {

std::string parse_error(std::string_view text) {
  try {
    Json::parse(text, "t.json");
  } catch (const pmap::DataError& e) { return e.what(); }
  return "(no error)";
}

}  // namespace

TEST_CASE("json: build, dump and parse back") {
  Json doc = Json::object();
  doc.set("name", "ensemble");
  doc.set("step", 1200);
  doc.set("lr", 0.1);
  doc.set("ok", true);
  doc.set("none", nullptr);
  Json list = Json::array();
  list.push_back(1);
  list.push_back(-2.5);
  list.push_back("x");
  list.push_back(Json::object());
  list.push_back(Json::array());
  doc.set("list", std::move(list));
  doc.set("step", 1201);  // replaces in place, keeps the position

  CHECK(doc.dump() ==
        R"({"name":"ensemble","step":1201,"lr":0.1,"ok":true,"none":null,"list":[1,-2.5,"x",{},[]]})");
  CHECK(Json::parse(doc.dump(), "a") == doc);
  CHECK(Json::parse(doc.dump(2), "b") == doc);
  CHECK(Json(Json::Object{{"a", 1}}).dump(2) == "{\n  \"a\": 1\n}");
  CHECK(doc.find("missing") == nullptr);
  CHECK(doc.find("step")->as_int() == 1201);
  CHECK(doc.size() == 6);
}

TEST_CASE("json: integers are exact and distinct from doubles") {
  const std::int64_t extremes[] = {0, -1, std::numeric_limits<std::int64_t>::min(),
                                   std::numeric_limits<std::int64_t>::max(), 9007199254740993};  // 2^53 + 1
  for (std::int64_t v : extremes) {
    const Json back = Json::parse(Json(v).dump(), "t");
    CHECK(back.is_integer());
    CHECK(back.as_int() == v);
  }
  CHECK(Json::parse("1.0", "t").is_double());
  CHECK(Json::parse("1e2", "t").is_double());
  CHECK(Json(1.0).dump() == "1.0");
  CHECK(Json(1e300).dump() == "1e+300");
  CHECK(Json::parse("9223372036854775808", "t").is_double());  // beyond int64: read as a double
  CHECK(Json(1) != Json(1.0));
  CHECK_THROWS_AS(Json(std::uint64_t{1} << 63), pmap::ValueError);
  CHECK(Json(std::uint64_t{7}).as_int() == 7);
}

TEST_CASE("json: doubles round-trip bit for bit") {
  std::uint64_t state = 0x9E3779B97F4A7C15ULL;
  int tested = 0;
  for (int i = 0; i < 20000; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;  // every bit pattern is a candidate
    const double d = std::bit_cast<double>(state);
    if (!std::isfinite(d)) continue;
    const Json back = Json::parse(Json(d).dump(), "t");
    REQUIRE(back.is_double());
    CHECK(std::bit_cast<std::uint64_t>(back.as_double()) == state);
    ++tested;
  }
  CHECK(tested > 19000);
  for (double d : {0.1, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1.0 / 3}) {
    CHECK(std::bit_cast<std::uint64_t>(Json::parse(Json(d).dump(), "t").as_double()) ==
          std::bit_cast<std::uint64_t>(d));
  }
  CHECK(Json::parse("1e-400", "t").as_double() == 0.0);
  CHECK(std::signbit(Json::parse("-1e-400", "t").as_double()));
  CHECK(parse_error("1e400").find("out of the range") != std::string::npos);
  CHECK(parse_error("-123456789e999999999999999999").find("out of the range") != std::string::npos);
}

TEST_CASE("json: NaN and Inf are refused at write time, naming the path") {
  Json doc = Json::object();
  doc.set("metrics", Json::Object{{"loss", std::nan("")}});
  try {
    doc.dump();
    FAIL("dump accepted NaN");
  } catch (const pmap::ValueError& e) {
    CHECK(std::string(e.what()) == "Json::dump: metrics.loss: NaN is not representable in JSON");
  }
  CHECK_THROWS_AS(Json(Json::Array{1, std::numeric_limits<double>::infinity()}).dump(), pmap::ValueError);
}

TEST_CASE("json: strings are escaped and unescaped completely") {
  const std::string raw =
      std::string("q\" b\\ /\b\f\n\r\t") + '\x01' + '\0' + "\x7f" + "\xc3\xa9\xf0\x9f\x98\x80";
  const std::string text = Json(raw).dump();
  CHECK(text == "\"q\\\" b\\\\ /\\b\\f\\n\\r\\t\\u0001\\u0000\x7f\xc3\xa9\xf0\x9f\x98\x80\"");
  CHECK(Json::parse(text, "t").as_string() == raw);
  CHECK(Json::parse(R"("\u00e9\u20AC\ud83d\ude00\/")", "t").as_string() ==
        "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/");
  CHECK(parse_error(R"("\ud83d")").find("byte 1: high surrogate") != std::string::npos);
  CHECK(parse_error(R"("\ud83dx")").find("high surrogate") != std::string::npos);
  CHECK(parse_error(R"("\ud83d\u0041")").find("high surrogate") != std::string::npos);
  CHECK(parse_error(R"("\ude00")").find("lone low surrogate") != std::string::npos);
  CHECK(parse_error(R"("\u12g4")").find("invalid hex digit") != std::string::npos);
  CHECK(parse_error(R"("\x")").find("invalid escape") != std::string::npos);
  CHECK(parse_error("\"a\nb\"").find("unescaped control character") != std::string::npos);
  for (const char* bad :
       {"\"\xc0\x80\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xe2\x82\"", "\"\xff\"", "\"\x80\""})
    CHECK(parse_error(bad).find("invalid UTF-8") != std::string::npos);
  CHECK_THROWS_AS(Json(std::string("\xff")).dump(), pmap::ValueError);
  CHECK_THROWS_AS(Json(Json::Object{{"\xc0", 1}}).dump(), pmap::ValueError);
}

TEST_CASE("json: parse errors name the source and the byte offset") {
  CHECK(parse_error("[1, 2,]") == "t.json: byte 6: expected a value, got ']'");
  CHECK(parse_error("{\"a\": 1} x") == "t.json: byte 9: unexpected 'x' after the JSON value");
  CHECK(parse_error("{\"a\": 1, \"b\": 2, \"a\": 3}") == "t.json: byte 17: duplicate object key \"a\"");
  CHECK(parse_error("") == "t.json: byte 0: expected a value, got end of input");
  CHECK(parse_error("{\"a\" 1}") == "t.json: byte 5: expected ':' after an object key, got '1'");
  CHECK(parse_error("{1: 2}") == "t.json: byte 1: expected a string key, got '1'");
  CHECK(parse_error("[1 2]") == "t.json: byte 3: expected ']' or ',' in array, got '2'");
  CHECK(parse_error("\"abc") == "t.json: byte 0: unterminated string");
  CHECK(parse_error(std::string("[1]\0", 4)) == "t.json: byte 3: unexpected byte 0x00 after the JSON value");
  for (const char* bad :
       {"01",  "1.",  ".5",   "+1", "-", "1e",      "1e+", "0x10",           "NaN", "Infinity", "-Infinity",
        "tru", "nul", "fals", "[",  "{", "{\"a\":", "[1,", "\xef\xbb\xbf{}", "'a'", "[1,]",     "{,}"})
    CHECK_MESSAGE(parse_error(bad).rfind("t.json: byte ", 0) == 0, bad);
  CHECK(Json::parse(" \t\r\n{ \"a\" : [ 1 , 2 ] } \n ", "t") == Json(Json::Object{{"a", Json::Array{1, 2}}}));
}

TEST_CASE("json: nesting is limited, deep input never exhausts the stack") {
  auto nested = [](int depth) {
    return std::string(static_cast<std::size_t>(depth), '[') +
           std::string(static_cast<std::size_t>(depth), ']');
  };
  CHECK_NOTHROW(Json::parse(nested(Json::max_depth), "t"));
  CHECK(parse_error(nested(Json::max_depth + 1)).find("nesting deeper than 64") != std::string::npos);
  CHECK_THROWS_AS(Json::parse(std::string(1'000'000, '['), "t"), pmap::DataError);
  std::string objects;
  for (int i = 0; i < 100; ++i) objects += "{\"a\":";
  CHECK_THROWS_AS(Json::parse(objects, "t"), pmap::DataError);
}

TEST_CASE("json: truncations and byte flips of a document never crash") {
  const std::string doc =
      R"({"a":[1,-2.5e-3,true,false,null],"b\u00e9":{"c":"d\n\ud83d\ude00"},"e":1234567890123})";
  REQUIRE_NOTHROW(Json::parse(doc, "t"));
  for (std::size_t n = 0; n < doc.size(); ++n)
    CHECK_THROWS_AS(Json::parse(doc.substr(0, n), "t"), pmap::DataError);
  for (std::size_t i = 0; i < doc.size(); ++i) {
    for (unsigned mask : {0x01u, 0x02u, 0x20u, 0x80u, 0xFFu}) {
      std::string flipped = doc;
      flipped[i] = static_cast<char>(static_cast<unsigned char>(flipped[i]) ^ mask);
      try {
        const Json j = Json::parse(flipped, "t");
        CHECK(Json::parse(j.dump(), "t") == j);  // whatever parses must round-trip
      } catch (const pmap::DataError&) {}
    }
  }
}

TEST_CASE("json: accessors and JsonView name the path of a type mismatch") {
  const Json doc = Json::parse(R"({"__metadata__":{"step":12},"w.b":{"shape":[2,"x"]}})", "t");
  const JsonView root(doc, "checkpoint.safetensors");
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const pmap::DataError& e) { return std::string(e.what()); }
    return std::string("(no error)");
  };
  CHECK(message([&] { (void)root["__metadata__"]["step"].as_string(); }) ==
        "checkpoint.safetensors: __metadata__.step: expected a string, got an integer");
  CHECK(message([&] { (void)root["w.b"]["shape"][1].as_int(); }) ==
        "checkpoint.safetensors: [\"w.b\"].shape[1]: expected an integer, got a string");
  CHECK(message([&] { (void)root["w.b"]["shape"][5]; }) ==
        "checkpoint.safetensors: [\"w.b\"].shape[5]: missing (array has 2 elements)");
  CHECK(message([&] { (void)root["nope"]; }) == "checkpoint.safetensors: nope: missing");
  CHECK(message([&] { (void)root.as_array(); }) ==
        "checkpoint.safetensors: expected an array, got an object");
  CHECK(message([&] { (void)doc.as_bool(); }) == "expected a boolean, got an object");
  CHECK(root["__metadata__"]["step"].as_int() == 12);
  CHECK(root["__metadata__"]["step"].as_double() == 12.0);
  CHECK(root.contains("w.b"));
  CHECK_FALSE(root.contains("w"));
  CHECK(root.size() == 2);
}
