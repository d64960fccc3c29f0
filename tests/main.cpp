// Entry point of the single pmapcc test binary (doctest). Arrays made uninitialized are poisoned (every
// byte 0xff, NaN as floats) unless the environment says otherwise, so an output a kernel leaves partly
// unwritten fails the tests that read it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  setenv("PMAPCC_POISON_UNINITIALIZED", "1", /*overwrite=*/0);
  return doctest::Context(argc, argv).run();
}
