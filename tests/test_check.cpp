// The checking-macro generator (pmap/detail/check.h) under the CUDA, NCCL and MPI checks: the expression
// is evaluated once, an accepted status passes, anything else reaches the thrower with the expression's
// text, file and line, and the message names them.
#include <doctest/doctest.h>
#include <pmap/detail/check.h>
#include <pmap/error.h>

#include <string>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

struct Thrown {
  int status;
  std::string message;
};

[[noreturn]] void throw_status(int status, const pmap::detail::CheckSite& site) {
  throw Thrown{status, pmap::detail::check_message(site, "process 7", "status " + std::to_string(status))};
}

bool even(int status) { return status % 2 == 0; }

}  // namespace

TEST_CASE("check macros evaluate the call once and throw with its text, file and line unless it is accepted") {
  int calls = 0;
  auto call = [&](int status) {
    ++calls;
    return status;
  };
  PMAPCC_CHECK_GEN(call(0), 0, throw_status);
  CHECK(calls == 1);
  PMAPCC_CHECK_IF(call(4), even, throw_status);
  CHECK(calls == 2);
  int line = 0;
  try {
    line = __LINE__ + 1;
    PMAPCC_CHECK_GEN(call(3), 0, throw_status);
    FAIL("a status other than ok must throw");
  } catch (const Thrown& t) {
    CHECK(calls == 3);
    CHECK(t.status == 3);
    CHECK(t.message == "call(3) failed at " + std::string(__FILE__) + ":" + std::to_string(line) +
                           " on process 7: status 3");
  }
  CHECK_THROWS_AS(PMAPCC_CHECK_IF(call(5), even, throw_status), Thrown);
  CHECK(calls == 4);
}

}  // namespace PMAPCC_TEST_FILE
