// Tests of the error hierarchy, the dtype table and how arrays appear in messages.
#include <doctest/doctest.h>

#include <pmap/dtype.h>
#include <pmap/error.h>
#include <pmap/pmap.h>

#include <cstdint>
#include <string>
#include <vector>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

TEST_CASE("errors carry the device they were raised on") {
  pmap::ShapeError e("bad shape");
  CHECK(std::string(e.what()) == "bad shape");
  e.set_device("cpu:3");
  CHECK(std::string(e.what()) == "cpu:3: bad shape");
  CHECK(e.message() == "bad shape");
  e.set_device("cpu:4");  // the first device sticks
  CHECK(e.device() == "cpu:3");
  pmap::Error& base = e;
  CHECK(dynamic_cast<pmap::ShapeError*>(&base) != nullptr);
}

TEST_CASE("dtype table") {
  CHECK(pmap::size_of(pmap::DType::f32) == 4);
  CHECK(pmap::size_of(pmap::DType::u8) == 1);
  CHECK(pmap::dtype_of<float> == pmap::DType::f32);
  CHECK(pmap::dtype_of<std::int32_t> == pmap::DType::i32);
  CHECK(pmap::name(pmap::DType::i64) == "i64");
  CHECK(pmap::is_floating(pmap::DType::f64));
  CHECK_FALSE(pmap::is_floating(pmap::DType::u32));
}

TEST_CASE("shapes print as Python tuples and an error raised on a device names it once") {
  CHECK(pmap::shape_str({}) == "()");
  CHECK(pmap::shape_str({1003}) == "(1003,)");
  CHECK(pmap::shape_str({2, 3}) == "(2, 3)");
  const pmap::Array x({1003}, pmap::DType::f32);
  CHECK(x.signature() == "f32(1003,)");
  CHECK(x.str() == "f32(1003,) on cpu:0");

  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "i");
  std::string what;
  try {
    pmap::pmap([] { pmap::pmean(pmap::Array::from_host(std::vector<std::int32_t>{1}, {}, pmap::current_device()), "i"); },
               mesh)();
  } catch (const pmap::ValueError& e) {
    what = e.what();
  }
  const std::string device = what.substr(0, what.find(':', 4));
  CHECK((device == "cpu:0" || device == "cpu:1"));
  CHECK(what == device + ": pmean of i32(): needs a floating dtype (f32 or f64)");
}

}  // namespace PMAPCC_TEST_FILE
