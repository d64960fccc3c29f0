// Program: the primitives a function applies to its inputs, recorded once on example inputs (JAX's
// make_jaxpr): each equation a primitive (pmapcc/core/primitive.h) with its attributes, reading inputs,
// earlier results or constants (values the function computed without the inputs: a scale made with
// ops::full), and writing new values. An exporter walks it (export/onnx: one emitter per primitive); str()
// prints it; run() evaluates it again on other inputs of the same shapes.
//
//   core::Program p = core::make_program("mlp", {&x, &w}, [](const std::vector<Array>& in) {
//     std::vector<Array> out;
//     out.push_back(ops::relu(ops::matmul(in[0], in[1])));
//     return out;
//   });
//   std::printf("%s", p.str().c_str());   // { lambda %0:f32(2, 3) %1:f32(3, 4). let %2:f32(2, 4) = matmul ...
//
// - The inputs are f32 (as grad's differentiated leaves); the function is recorded through grad's trace, so
//   what grad follows is recorded (pmap::ops, the collectives), and what it does not follow is not: a host
//   read, Array::to(), an op on values the function made without the inputs (that result is a constant).
// - The function runs once, eagerly, on the inputs' device, with every op: the record is of that run (a
//   branch on a value's bits records the branch taken, as JAX's tracing does with concrete values).
// - Not inside grad (NotAvailable: the trace is grad's) nor inside vmap (NotAvailable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <pmap/array.h>

#include <pmapcc/core/primitive.h>

namespace pmap::core {

class Program {
 public:
  struct Value {
    Shape shape;
    DType dtype = DType::f32;
  };
  // An operand: a value of the program (index into values()), or constant c (index into constants()).
  struct Operand {
    std::size_t index = 0;
    bool constant = false;
  };
  struct Equation {
    std::shared_ptr<const Primitive> primitive;
    std::vector<Operand> inputs;
    std::vector<std::size_t> outputs;  // values, in the primitive's output order
  };

  Program() = default;
  Program(std::string name, std::vector<Value> values, std::size_t inputs, std::vector<Array> constants,
          std::vector<Equation> equations, std::vector<Operand> outputs);

  const std::string& name() const { return name_; }
  // Every value: the inputs first (in the order given), then each equation's outputs in order.
  const std::vector<Value>& values() const { return values_; }
  std::size_t input_count() const { return inputs_; }
  // The constants equations read, on the device the function ran on.
  const std::vector<Array>& constants() const { return constants_; }
  const std::vector<Equation>& equations() const { return equations_; }
  // The function's results, in order: a value, or a constant (a result that does not depend on the inputs).
  const std::vector<Operand>& outputs() const { return outputs_; }

  // A jaxpr-like listing: the inputs, one line per equation ("%4:f32(2, 10) = linear[relu=1, precision=fp32]
  // %3 %1 %2"; a constant "c0:f32(10)"), the outputs.
  std::string str() const;
  // The outputs of the program on `inputs` (one per input, each of that input's shape and dtype; any one
  // device, which the constants are copied to): each equation's primitive evaluated in order. ShapeError /
  // ValueError naming the input that does not fit.
  std::vector<Array> run(const std::vector<const Array*>& inputs) const;

 private:
  std::string name_;
  std::vector<Value> values_;
  std::size_t inputs_ = 0;
  std::vector<Array> constants_;
  std::vector<Equation> equations_;
  std::vector<Operand> outputs_;
};

using ProgramFunction = std::function<std::vector<Array>(const std::vector<Array>& inputs)>;

// Records `function` applied to `inputs` (f32 arrays on one device; `name` names it in errors and in str()).
// The inputs are not copied and must outlive the call.
Program make_program(const std::string& name, const std::vector<const Array*>& inputs, const ProgramFunction& function);

}  // namespace pmap::core
