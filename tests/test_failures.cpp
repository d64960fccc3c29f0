// Tests of pmap's failure semantics: mismatched collectives, exceptions on one device, timeouts,
// devices that return early, and thread cleanup. None of them may hang.
#include <doctest/doctest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include <pmap/pmap.h>

#include "fault_program.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

using fault_program::baseline_thread_count;
using fault_program::settled_thread_count;

namespace {

pmap::Mesh mesh_of(int n, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  pmap::MeshOptions o;
  o.collective_timeout = timeout;
  return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), "i", o);
}

pmap::Array ones(std::int64_t n) { return pmap::Array::from_host(std::vector<float>(static_cast<std::size_t>(n), 1.0f), {n}); }

// Runs body on every device and records what each device raised (type name), then rethrows.
struct Outcomes {
  std::mutex mu;
  std::vector<std::string> kind;
  explicit Outcomes(int n) : kind(static_cast<std::size_t>(n), "none") {}
  template <class F> void run(int d, F&& body) {
    try {
      body();
    } catch (const pmap::CollectiveMismatch&) {
      set(d, "mismatch");
      throw;
    } catch (const pmap::Aborted&) {
      set(d, "aborted");
      throw;
    } catch (const pmap::Timeout&) {
      set(d, "timeout");
      throw;
    } catch (...) {
      set(d, "other");
      throw;
    }
  }
  void set(int d, const char* k) {
    std::lock_guard lk(mu);
    kind[static_cast<std::size_t>(d)] = k;
  }
};

}  // namespace

TEST_CASE("devices calling different collectives all raise instead of hanging") {
  auto mesh = mesh_of(3);
  SUBCASE("different op") {
    Outcomes o(3);
    CHECK_THROWS_WITH_AS(pmap::pmap([&] {
      int d = pmap::axis_index("i");
      o.run(d, [&] { d == 1 ? (void)pmap::pmax(ones(4), "i") : (void)pmap::psum(ones(4), "i"); });
    }, mesh)(), doctest::Contains("different collectives"), pmap::CollectiveMismatch);
    CHECK(o.kind == std::vector<std::string>{"mismatch", "mismatch", "mismatch"});
  }
  SUBCASE("different shape") {
    Outcomes o(3);
    CHECK_THROWS_WITH_AS(pmap::pmap([&] {
      int d = pmap::axis_index("i");
      o.run(d, [&] { pmap::psum(ones(d == 2 ? 5 : 4), "i"); });
    }, mesh)(), doctest::Contains("f32[5]"), pmap::CollectiveMismatch);
    CHECK(o.kind == std::vector<std::string>{"mismatch", "mismatch", "mismatch"});
  }
  SUBCASE("different dtype") {
    Outcomes o(3);
    CHECK_THROWS_AS(pmap::pmap([&] {
      int d = pmap::axis_index("i");
      o.run(d, [&] {
        if (d == 0) pmap::psum(pmap::Array({4}, pmap::DType::i32), "i");
        else pmap::psum(ones(4), "i");
      });
    }, mesh)(), pmap::CollectiveMismatch);
    CHECK(o.kind == std::vector<std::string>{"mismatch", "mismatch", "mismatch"});
  }
}

TEST_CASE("devices naming different axes of a 2-D mesh raise instead of hanging") {
  pmap::MeshOptions opt;
  opt.collective_timeout = std::chrono::seconds(30);
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"data", 2}, {"model", 2}}, opt);
  Outcomes o(4);
  CHECK_THROWS_AS(pmap::pmap([&] {
    int d = pmap::axis_index({"data", "model"});
    o.run(d, [&] { pmap::psum(ones(2), d == 3 ? "data" : "model"); });
  }, mesh)(), pmap::CollectiveMismatch);
  // Devices 0 and 1 form a complete "model" group and may legitimately finish their psum; the devices
  // whose groups cannot complete (2 waits for 3 along "model", 3 for 1 along "data") raise.
  CHECK(o.kind[2] == "mismatch");
  CHECK(o.kind[3] == "mismatch");
}

TEST_CASE("a device that returns without the collective its peers wait in is reported") {
  auto mesh = mesh_of(2);
  CHECK_THROWS_WITH_AS(pmap::pmap([&] {
    if (pmap::axis_index("i") == 0) pmap::psum(ones(3), "i");
  }, mesh)(), doctest::Contains("returned after 0 collective(s)"), pmap::CollectiveMismatch);
}

TEST_CASE("an exception on one device releases the others and is rethrown with its device") {
  auto mesh = mesh_of(4);
  Outcomes o(4);
  try {
    pmap::pmap([&] {
      int d = pmap::axis_index("i");
      o.run(d, [&] {
        if (d == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are waiting by now
          throw pmap::ValueError("bad value on purpose");
        }
        pmap::psum(ones(8), "i");
      });
    }, mesh)();
    FAIL("pmap did not throw");
  } catch (const pmap::ValueError& e) {
    CHECK(std::string(e.what()) == "cpu:2: bad value on purpose");
    CHECK(e.device() == "cpu:2");
  }
  CHECK(o.kind == std::vector<std::string>{"aborted", "aborted", "other", "aborted"});
  // A non-pmapcc exception comes back as DeviceError, still naming the device.
  CHECK_THROWS_WITH_AS(pmap::pmap([] {
    if (pmap::axis_index("i") == 1) throw std::runtime_error("plain failure");
  }, mesh)(), "cpu:1: plain failure", pmap::DeviceError);
  // The mesh stays usable.
  auto out = pmap::pmap([] { return pmap::psum(pmap::axis_index("i") + 1, "i"); }, mesh)();
  for (int v : out) CHECK(v == 10);
}

TEST_CASE("a collective timeout reaches every device as Timeout, naming the devices that never arrived") {
  // Several rounds: which waiting device's deadline passes first varies, the outcome must not.
  auto mesh = mesh_of(4, std::chrono::milliseconds(150));
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    Outcomes o(4);
    auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(pmap::pmap([&] {
      int d = pmap::axis_index("i");
      o.run(d, [&] {
        if (d == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
        pmap::psum(ones(2), "i");
      });
    }, mesh)(), doctest::Contains("waiting for cpu:1"), pmap::Timeout);
    auto took = std::chrono::steady_clock::now() - start;
    CHECK(took < std::chrono::seconds(10));
    // The waiting devices all see the Timeout (code that catches it inside the function sees it on every
    // device), and so does the late one, which finds the call ended by that timeout.
    CHECK(o.kind == std::vector<std::string>(4, "timeout"));
  }
  auto out = pmap::pmap([] { return pmap::psum(1, "i"); }, mesh)();
  CHECK(out[0] == 4);
  // A device that fails is another matter: the devices waiting for it are released with Aborted.
  Outcomes o(4);
  CHECK_THROWS_AS(pmap::pmap([&] {
    int d = pmap::axis_index("i");
    o.run(d, [&] {
      if (d == 2) throw pmap::ValueError("device 2 fails");
      pmap::psum(ones(2), "i");
    });
  }, mesh)(), pmap::ValueError);
  CHECK(o.kind == std::vector<std::string>{"aborted", "aborted", "other", "aborted"});
}

TEST_CASE("a device waiting for a peer that waits in another collective blames the device that never came") {
  // cpu:1 and cpu:3 share a group over "a", cpu:0 and cpu:1 one over "b", cpu:2 and cpu:3 another. cpu:3
  // never comes; cpu:1 waits for it in the psum over "a" from 100 ms on. cpu:0's deadline in the psum over
  // "b" passes first (600 ms), while cpu:1 is still waiting inside its own collective: cpu:0 must not blame
  // cpu:1. The first real timeout (cpu:1's or cpu:2's, ~700 ms) waits for cpu:3, and every device says so.
  pmap::MeshOptions options;
  options.collective_timeout = std::chrono::milliseconds(600);
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"a", 2}, {"b", 2}}, options);
  Outcomes o(4);
  std::vector<std::string> messages(4);
  CHECK_THROWS_AS(pmap::pmap([&] {
    const int d = pmap::axis_index({"a", "b"});
    o.run(d, [&] {
      try {
        if (d == 3) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
        if (d == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        pmap::psum(ones(2), "a");  // {cpu:0, cpu:2} completes; {cpu:1, cpu:3} waits
        if (d == 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        pmap::psum(ones(2), "b");
      } catch (const pmap::Error& e) {
        std::lock_guard lk(o.mu);
        messages[static_cast<std::size_t>(d)] = e.what();
        throw;
      }
    });
  }, mesh)(), pmap::Timeout);
  CHECK(o.kind == std::vector<std::string>(4, "timeout"));
  for (int d = 0; d < 4; ++d) {
    CAPTURE(messages[static_cast<std::size_t>(d)]);
    CHECK(messages[static_cast<std::size_t>(d)].find("timed out after 600 ms waiting for cpu:3") != std::string::npos);
    CHECK(messages[static_cast<std::size_t>(d)].find("waiting for cpu:1") == std::string::npos);
  }
}

TEST_CASE("meshes leave no threads behind") {
  // One mesh first: runtimes that start helper threads with the first thread (ThreadSanitizer's) have then.
  { auto warm = mesh_of(2); }
  const int before = baseline_thread_count();
  for (int round = 0; round < 5; ++round) {
    auto mesh = mesh_of(8);
    CHECK(settled_thread_count(before + 8) == before + 8);
    pmap::pmap([] { pmap::psum(1, "i"); }, mesh)();
    CHECK_THROWS(pmap::pmap([] { throw pmap::ValueError("x"); }, mesh)());
  }
  CHECK(settled_thread_count(before) == before);
}

}  // namespace PMAPCC_TEST_FILE
