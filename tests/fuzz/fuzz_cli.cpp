// libFuzzer target: ensemble::parse_cli, mnist_ensemble's command line. The input is the argument list,
// arguments separated by NUL bytes (as the kernel hands argv over). A bad command line may only raise
// UsageError (the program prints it on one line and exits 2); an accepted one names a known
// dataset, and parsing it again gives the same options.
#include <string>
#include <vector>

#include "examples/mnist_ensemble/cli.h"
#include "tests/fuzz/fuzz_common.h"

namespace se = pmap::ensemble;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args;
  std::string arg;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(arg);
      arg.clear();
    } else {
      arg += static_cast<char>(data[i]);
    }
  }
  if (size > 0) args.push_back(arg);
  se::CliOptions o;
  try {
    o = se::parse_cli(args);
  } catch (const se::UsageError&) {
    return 0;
  }
  if (o.help) return 0;
  if (o.train.dataset != "mnist" && o.train.dataset != "fashion-mnist")
    pmap::fuzz::violated("fuzz_cli", "accepted the unknown dataset '" + o.train.dataset + "'");
  const se::CliOptions again = se::parse_cli(args);
  if (again.train.to_json() != o.train.to_json() || again.data != o.data || again.members_subset != o.members_subset ||
      again.progress != o.progress)
    pmap::fuzz::violated("fuzz_cli", "parsing the same arguments twice gave different options");
  return 0;
}
