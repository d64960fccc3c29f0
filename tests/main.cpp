// Entry point of the single pmapcc test binary (doctest). Arrays made uninitialized are poisoned (every
// byte 0xff, NaN as floats) unless the environment says otherwise, so an output a kernel leaves partly
// unwritten fails the tests that read it. A run that names test cases (--test-case / -tc, as each CTest
// entry does) and matches none fails: CTest registers a name cut short (doctest_discover_tests splits at
// ';') or a case renamed since the build, and such an entry must not pass by running nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

namespace {

// How many test cases passed the run's filters (-1 until a run ends: listing runs none).
int g_cases_matched = -1;

// A listener that reads the run's totals; it reports nothing.
struct MatchCount : doctest::IReporter {
  explicit MatchCount(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    g_cases_matched = static_cast<int>(s.numTestCasesPassingFilters);
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

bool names_test_cases(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    while (*a == '-') ++a;
    if (std::strncmp(a, "test-case=", 10) == 0 || std::strncmp(a, "tc=", 3) == 0) return true;
  }
  return false;
}

}  // namespace

REGISTER_LISTENER("match_count", 1, MatchCount);

int main(int argc, char** argv) {
  setenv("PMAPCC_POISON_UNINITIALIZED", "1", /*overwrite=*/0);
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (rc == 0 && g_cases_matched == 0 && names_test_cases(argc, argv)) {
    std::cerr << "pmapcc_tests: error: the --test-case filter matches no test case (a name cut at ';' or renamed "
                 "since CTest listed it?): nothing ran\n";
    return 3;
  }
  return rc;
}
