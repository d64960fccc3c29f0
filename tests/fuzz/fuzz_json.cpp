// libFuzzer target: ensemble::Json::parse, the parser of safetensors headers, checkpoint metadata and
// metrics files. Bad text may only raise pmap::DataError; accepted text must survive dump() and parse()
// unchanged, compact and indented (integers stay integers, doubles read back bit-exact).
#include <string_view>

#include <pmap/error.h>

#include <pmapcc/ensemble/json.h>
#include "tests/fuzz/fuzz_common.h"

using pmap::ensemble::Json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Json value;
  try {
    value = Json::parse(text, "fuzz.json");
  } catch (const pmap::DataError&) {
    return 0;
  }
  for (int indent : {-1, 2}) {
    const std::string dumped = value.dump(indent);
    Json again;
    try {
      again = Json::parse(dumped, "dumped.json");
    } catch (const pmap::DataError& e) {
      pmap::fuzz::violated("fuzz_json", std::string("dump() wrote text parse() refuses: ") + e.what());
    }
    if (!(again == value)) pmap::fuzz::violated("fuzz_json", "dump(" + std::to_string(indent) + ") then parse() changed the value");
    if (again.dump(indent) != dumped) pmap::fuzz::violated("fuzz_json", "dump() is not stable");
  }
  return 0;
}
