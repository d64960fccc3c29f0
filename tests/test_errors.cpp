// Tests of the error hierarchy and dtype table.
#include <doctest/doctest.h>

#include <pmap/dtype.h>
#include <pmap/error.h>

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
