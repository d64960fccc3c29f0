// libFuzzer target: io::parse_json, the parser of safetensors headers, checkpoint metadata and metrics
// files (nlohmann-json under the project's limits). Bad text may only raise pmap::DataError; accepted text
// must survive dump_json() and parse_json() unchanged, compact and indented.
#include <string_view>

#include <pmap/error.h>

#include <pmapcc/io/json.h>
#include "tests/fuzz/fuzz_common.h"

using pmap::io::Json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Json value;
  try {
    value = pmap::io::parse_json(text, "fuzz.json");
  } catch (const pmap::DataError&) {
    return 0;
  }
  for (int indent : {-1, 2}) {
    const std::string dumped = pmap::io::dump_json(value, indent);
    Json again;
    try {
      again = pmap::io::parse_json(dumped, "dumped.json");
    } catch (const pmap::DataError& e) {
      pmap::fuzz::violated("fuzz_json", std::string("dump_json() wrote text parse_json() refuses: ") + e.what());
    }
    if (!(again == value))
      pmap::fuzz::violated("fuzz_json",
                           "dump_json(" + std::to_string(indent) + ") then parse_json() changed the value");
    if (pmap::io::dump_json(again, indent) != dumped) pmap::fuzz::violated("fuzz_json", "dump_json() is not stable");
  }
  return 0;
}
