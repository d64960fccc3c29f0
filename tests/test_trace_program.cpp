// core::make_program (pmapcc/core/program.h): what a function's record holds, its listing, running it again on
// other inputs, and the refusals.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <pmap/error.h>
#include <pmap/random.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/program.h>
#include <pmapcc/core/vmap.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace ops = pmap::ops;
using pmap::Array;
using pmap::core::Program;

namespace {

Array uniform_array(std::uint32_t seed, pmap::Shape shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<std::size_t>(n));
  pmap::uniform(pmap::key(seed), v, -1.0f, 1.0f);
  return Array::from_host(v, std::move(shape));
}

// A small network: a ReLU layer, a scale by a constant made inside (from no input), a second layer, the
// log-softmax; and a second result that is a constant.
std::vector<Array> mlp(const std::vector<Array>& in) {
  const Array h = ops::linear(in[0], in[1], in[2], true);
  const Array half = Array::from_host(std::vector<float>{0.5f}, {1});
  const Array scaled = ops::multiply(h, half);
  std::vector<Array> out;
  out.push_back(ops::log_softmax(ops::matmul(scaled, in[3])));
  out.push_back(ops::scale(half, 4.0f));  // depends on no input: a constant of the program
  return out;
}

}  // namespace

TEST_CASE("program: make_program records the primitives, prints them and runs them again bit for bit") {
  const Array x = uniform_array(1, {4, 3}), w = uniform_array(2, {3, 5}), b = uniform_array(3, {5}),
              v = uniform_array(4, {5, 2});
  const Program p = pmap::core::make_program("mlp", {&x, &w, &b, &v}, mlp);
  CHECK(p.name() == "mlp");
  CHECK(p.input_count() == 4);
  REQUIRE(p.equations().size() == 4);
  std::vector<std::string> names;
  for (const Program::Equation& e : p.equations()) names.push_back(e.primitive->name());
  CHECK(names == std::vector<std::string>{"linear(relu)", "multiply", "matmul", "log_softmax"});
  // multiply reads the linear's output and the constant made inside.
  const Program::Equation& mul = p.equations()[1];
  REQUIRE(mul.inputs.size() == 2);
  CHECK(!mul.inputs[0].constant);
  CHECK(mul.inputs[0].index == p.equations()[0].outputs[0]);
  CHECK(mul.inputs[1].constant);
  CHECK(p.constants()[mul.inputs[1].index].to_vector<float>() == std::vector<float>{0.5f});
  // Values: the inputs, then each equation's output, with their shapes.
  REQUIRE(p.values().size() == 8);
  CHECK(p.values()[4].shape == pmap::Shape{4, 5});
  CHECK(p.values()[7].shape == pmap::Shape{4, 2});
  REQUIRE(p.outputs().size() == 2);
  CHECK(!p.outputs()[0].constant);
  CHECK(p.outputs()[0].index == 7);
  CHECK(p.outputs()[1].constant);
  CHECK(p.constants()[p.outputs()[1].index].to_vector<float>() == std::vector<float>{2.0f});
  // The listing names the primitives with their attributes.
  const std::string text = p.str();
  CHECK(text.find("{ lambda %0:f32(4, 3) %1:f32(3, 5) %2:f32(5,) %3:f32(5, 2). let  # mlp") != std::string::npos);
  CHECK(text.find("%4:f32(4, 5) = linear(relu)[relu=1, precision='fp32'] %0 %1 %2") != std::string::npos);
  CHECK(text.find("= matmul[transpose_a=0, transpose_b=0, precision='fp32'] %5 %3") != std::string::npos);
  CHECK(text.find("in (%7, c1:f32(1,)) }") != std::string::npos);

  // Run again on other inputs of the same shapes: the function's own bits.
  const Array x2 = uniform_array(5, {4, 3}), w2 = uniform_array(6, {3, 5});
  const std::vector<Array> got = p.run({&x2, &w2, &b, &v});
  std::vector<Array> args;
  for (const Array* a : {&x2, &w2, &b, &v}) args.push_back(a->copy());
  const std::vector<Array> want = mlp(args);
  REQUIRE(got.size() == 2);
  CHECK(got[0].to_vector<float>() == want[0].to_vector<float>());
  CHECK(got[1].to_vector<float>() == std::vector<float>{2.0f});

  // run() is differentiable like the function: grad through the program equals grad of the function.
  auto through_program = [&](const Array& wt) { return ops::sum(p.run({&x, &wt, &b, &v})[0]); };
  auto through_function = [&](const Array& wt) {
    std::vector<Array> a;
    a.push_back(x.copy());
    a.push_back(wt.copy());
    a.push_back(b.copy());
    a.push_back(v.copy());
    return ops::sum(mlp(a)[0]);
  };
  const Array g1 = pmap::grad(through_program)(w);
  const Array g2 = pmap::grad(through_function)(w);
  CHECK(g1.to_vector<float>() == g2.to_vector<float>());
}

TEST_CASE("program: bad inputs and records made where they cannot be are refused, naming what is wrong") {
  const Array x = uniform_array(1, {2, 3}), w = uniform_array(2, {3, 5}), b = uniform_array(3, {5}),
              v = uniform_array(4, {5, 2});
  const Array labels = Array::from_host(std::vector<std::int32_t>{1, 0}, {2});
  auto one = [](const std::vector<Array>& in) {
    std::vector<Array> out;
    out.push_back(ops::relu(in[0]));
    return out;
  };
  CHECK_THROWS_WITH_AS(pmap::core::make_program("f", {&labels}, one),
                       doctest::Contains("make_program of 'f': input 0 is i32(2,) on cpu:0; a program's inputs "
                                         "are f32"),
                       pmap::ValueError);
  const Array empty;
  CHECK_THROWS_WITH_AS(pmap::core::make_program("f", {&empty}, one),
                       "make_program of 'f': input 0 is an empty Array handle", pmap::ValueError);
  // Inside grad: the trace is grad's.
  auto inside = [&](const Array& a) {
    pmap::core::make_program("inner", {&x}, one);
    return ops::sum(a);
  };
  CHECK_THROWS_WITH_AS(pmap::grad(inside, "outer")(x), doctest::Contains("make_program of 'inner' inside 'outer'"),
                       pmap::NotAvailable);

  // Inside vmap.
  const Array stacked = uniform_array(5, {3, 2});
  CHECK_THROWS_WITH_AS(pmap::vmap([&](const Array& row) {
                         pmap::core::make_program("in vmap", {&x}, one);
                         return ops::relu(row);
                       }, {0}, "rows")(stacked),
                       "make_program of 'in vmap' inside vmap: a program is recorded outside vmap", pmap::NotAvailable);

  const Program p = pmap::core::make_program("mlp", {&x, &w, &b, &v}, mlp);
  CHECK_THROWS_WITH_AS(p.run({&x, &w}), "program 'mlp': 2 inputs given, it takes 4", pmap::ValueError);
  CHECK_THROWS_WITH_AS(p.run({&x, &empty, &b, &v}), "program 'mlp': input 1 is an empty Array handle",
                       pmap::ValueError);
  const Array elsewhere = w.to(pmap::Device{pmap::DeviceKind::cpu, 1, 1});
  CHECK_THROWS_WITH_AS(p.run({&x, &elsewhere, &b, &v}), "program 'mlp': input 1 is on cpu:1, input 0 on cpu:0",
                       pmap::ValueError);
  const Array wide = uniform_array(5, {2, 4});
  CHECK_THROWS_WITH_AS(p.run({&wide, &w, &b, &v}), "program 'mlp': input 0 is f32(2, 4), recorded as f32(2, 3)",
                       pmap::ShapeError);
}

}  // namespace PMAPCC_TEST_FILE
