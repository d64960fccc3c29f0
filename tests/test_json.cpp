// Tests of io/json.h, what the project adds to nlohmann-json: parse_json's limits (duplicate keys, depth)
// and its errors (source and byte offset), dump_json's UTF-8 error, JsonView's path-naming errors; and the
// properties of the library the formats rely on (insertion order, exact integers, bit-exact doubles).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <pmap/error.h>

#include <pmapcc/io/json.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

using pmap::io::Json;
using pmap::io::JsonView;
using pmap::io::parse_json;

namespace {

std::string parse_error(std::string_view text) {
  try {
    (void)parse_json(text, "t.json");
  } catch (const pmap::DataError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string nested(int depth) {
  return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']');
}

}  // namespace

TEST_CASE("json: objects keep insertion order, integers and doubles round-trip exactly") {
  Json doc = Json::object();
  doc["step"] = 1200;
  doc["name"] = "ensemble";
  doc["lr"] = 0.1;
  doc["list"] = {1, -2.5, "x", Json::object(), Json::array()};
  doc["step"] = 1201;  // replaces in place, keeps the position
  CHECK(pmap::io::dump_json(doc) == R"({"step":1201,"name":"ensemble","lr":0.1,"list":[1,-2.5,"x",{},[]]})");
  CHECK(pmap::io::dump_json(Json{{"a", 1}}, 2) == "{\n  \"a\": 1\n}");
  CHECK(parse_json(pmap::io::dump_json(doc, 2), "t") == doc);

  for (std::int64_t v : {std::int64_t{0}, std::int64_t{-1}, std::numeric_limits<std::int64_t>::min(),
                         std::numeric_limits<std::int64_t>::max(), std::int64_t{9007199254740993}}) {
    const Json back = parse_json(Json(v).dump(), "t");
    CHECK(JsonView(back, "t").as_int() == v);
  }
  CHECK(Json(1.0).dump() == "1.0");  // written so it reads back as a double
  CHECK(parse_json("1.0", "t").is_number_float());

  std::uint64_t state = 0x9E3779B97F4A7C15ULL;
  int tested = 0;
  for (int i = 0; i < 20000; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;  // every bit pattern is a candidate
    const double d = std::bit_cast<double>(state);
    if (!std::isfinite(d)) continue;
    const Json back = parse_json(Json(d).dump(), "t");
    REQUIRE(back.is_number_float());
    CHECK(std::bit_cast<std::uint64_t>(back.get<double>()) == state);
    ++tested;
  }
  CHECK(tested > 19000);
  CHECK(Json(std::nan("")).dump() == "null");
}

TEST_CASE("json: parse errors name the source, and the byte offset of a syntax error") {
  CHECK(parse_error("[1, 2,]").starts_with("t.json: byte 7: syntax error while parsing value"));
  CHECK(parse_error("{\"a\": 1} x").starts_with("t.json: byte 10: syntax error while parsing value"));
  CHECK(parse_error("").starts_with("t.json: byte 1: "));
  CHECK(parse_error("1e400") == "t.json: number overflow parsing '1e400'");
  for (const char* bad : {"01", "1.", ".5", "+1", "-", "NaN", "tru", "[", "{\"a\":", "'a'", "\"\xff\"", "\"\xc0\x80\"",
                          "\"\xed\xa0\x80\"", R"("\ud83d")", R"("\ude00")", "\"a\nb\""})
    CHECK_MESSAGE(parse_error(bad).starts_with("t.json: byte "), parse_error(bad));
  CHECK(parse_error(std::string("[1]\0", 4)) == "t.json: byte 4: a NUL byte");
  CHECK(parse_error(std::string("[\"a\0\"]", 6)) == "t.json: byte 4: a NUL byte");
  CHECK(parse_json("\xef\xbb\xbf[]", "t") == Json::array());  // a byte order mark is skipped
}

TEST_CASE("json: duplicate keys and deep nesting are refused") {
  CHECK(parse_error(R"({"a": 1, "b": 2, "a": 3})") == "t.json: duplicate key \"a\"");
  CHECK(parse_error(R"({"x": {"a": 1}, "y": {"a": 2}})") == "(no error)");  // per object
  CHECK(parse_error(R"([{"a": 1}, {"a": 2, "a": 3}])") == "t.json: duplicate key \"a\"");
  CHECK(parse_error(nested(pmap::io::kMaxJsonDepth)) == "(no error)");
  CHECK(parse_error(nested(pmap::io::kMaxJsonDepth + 1)) == "t.json: nesting deeper than 64 arrays and objects");
  CHECK_THROWS_AS(parse_json(std::string(1'000'000, '['), "t"), pmap::DataError);
}

TEST_CASE("json: a string that is not UTF-8 cannot be written, quoted() shows any bytes") {
  CHECK_THROWS_AS(pmap::io::dump_json(Json(std::string("\xff"))), pmap::ValueError);
  CHECK_THROWS_AS(pmap::io::dump_json(Json{{"\xc0", 1}}), pmap::ValueError);
  CHECK(pmap::io::quoted("a\"b\n") == R"("a\"b\n")");
  CHECK(pmap::io::quoted("\xff") == "\"\xef\xbf\xbd\"");  // U+FFFD
  CHECK(pmap::io::quoted(std::string(100, 'x'), 4) == "\"xxxx\"...");
}

TEST_CASE("json: truncations and byte flips of a document raise DataError or round-trip") {
  const std::string doc = R"({"a":[1,-2.5e-3,true,false,null],"b\u00e9":{"c":"d\n\ud83d\ude00"},"e":1234567890123})";
  REQUIRE_NOTHROW(parse_json(doc, "t"));
  for (std::size_t n = 0; n < doc.size(); ++n) CHECK_THROWS_AS(parse_json(doc.substr(0, n), "t"), pmap::DataError);
  for (std::size_t i = 0; i < doc.size(); ++i) {
    for (unsigned mask : {0x01u, 0x02u, 0x20u, 0x80u, 0xFFu}) {
      std::string flipped = doc;
      flipped[i] = static_cast<char>(static_cast<unsigned char>(flipped[i]) ^ mask);
      try {
        const Json j = parse_json(flipped, "t");
        CHECK(parse_json(pmap::io::dump_json(j), "t") == j);
      } catch (const pmap::DataError&) {
      }
    }
  }
}

TEST_CASE("json: JsonView names the source and the path of a missing or mistyped value") {
  const Json doc = parse_json(R"({"__metadata__":{"step":12},"w.b":{"shape":[2,"x",1.5,18446744073709551615]}})", "t");
  const JsonView root(doc, "checkpoint.safetensors");
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const pmap::DataError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(message([&] { (void)root["__metadata__"]["step"].as_string(); }) ==
        "checkpoint.safetensors: __metadata__.step: expected a string, got an integer");
  CHECK(message([&] { (void)root["w.b"]["shape"][1].as_int(); }) ==
        "checkpoint.safetensors: [\"w.b\"].shape[1]: expected an integer, got a string");
  CHECK(message([&] { (void)root["w.b"]["shape"][2].as_int(); }) ==
        "checkpoint.safetensors: [\"w.b\"].shape[2]: expected an integer, got a number");
  CHECK(message([&] { (void)root["w.b"]["shape"][3].as_int(); }) ==
        "checkpoint.safetensors: [\"w.b\"].shape[3]: integer 18446744073709551615 is above INT64_MAX");
  CHECK(message([&] { (void)root["w.b"]["shape"][9]; }) ==
        "checkpoint.safetensors: [\"w.b\"].shape[9]: missing (array has 4 elements)");
  CHECK(message([&] { (void)root["nope"]; }) == "checkpoint.safetensors: nope: missing");
  CHECK(message([&] { (void)root[0]; }) == "checkpoint.safetensors: expected an array, got an object");
  CHECK(message([&] { (void)root["w.b"]["shape"].as_bool(); }) ==
        "checkpoint.safetensors: [\"w.b\"].shape: expected a boolean, got an array");
  CHECK(root["__metadata__"]["step"].as_int() == 12);
  CHECK(root["__metadata__"]["step"].as_double() == 12.0);
  CHECK(root["w.b"]["shape"][2].as_double() == 1.5);
  CHECK(root.contains("w.b"));
  CHECK_FALSE(root.contains("w"));
  CHECK(root.size() == 2);
}

}  // namespace PMAPCC_TEST_FILE
