// Program (pmapcc/core/program.h): recorded through grad's trace, printed, and run again primitive by primitive.
#include <pmapcc/core/program.h>

#include <cstdio>
#include <utility>

#include <pmap/detail/trace.h>
#include <pmap/error.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/trace.h>

namespace pmap::core {

const Attribute* find_attribute(const Attributes& attributes, const std::string& name) {
  for (const auto& [key, value] : attributes)
    if (key == name) return &value;
  return nullptr;
}

Program::Program(std::string name, std::vector<Value> values, std::size_t inputs, std::vector<Array> constants,
                 std::vector<Equation> equations, std::vector<Operand> outputs)
    : name_(std::move(name)),
      values_(std::move(values)),
      inputs_(inputs),
      constants_(std::move(constants)),
      equations_(std::move(equations)),
      outputs_(std::move(outputs)) {}

std::string attribute_text(const Attribute& a) {
  if (const auto* i = std::get_if<std::int64_t>(&a)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&a)) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", *d);
    return text;
  }
  if (const auto* v = std::get_if<std::vector<std::int64_t>>(&a)) return shape_str(*v);
  return "'" + std::get<std::string>(a) + "'";
}

std::string Program::str() const {
  auto value = [&](std::size_t v) {
    return "%" + std::to_string(v) + ":" + std::string(pmap::name(values_[v].dtype)) + shape_str(values_[v].shape);
  };
  auto operand = [&](const Operand& o) {
    if (!o.constant) return "%" + std::to_string(o.index);
    return "c" + std::to_string(o.index) + ":" + constants_[o.index].signature();
  };
  std::string s = "{ lambda";
  for (std::size_t i = 0; i < inputs_; ++i) s += " " + value(i);
  s += ". let  # " + name_ + "\n";
  for (const Equation& e : equations_) {
    s += "   ";
    for (std::size_t k = 0; k < e.outputs.size(); ++k) s += (k ? " " : "") + value(e.outputs[k]);
    s += " = " + e.primitive->name();
    const Attributes attributes = e.primitive->attributes();
    if (!attributes.empty()) {
      s += "[";
      for (std::size_t k = 0; k < attributes.size(); ++k)
        s += (k ? ", " : "") + attributes[k].first + "=" + attribute_text(attributes[k].second);
      s += "]";
    }
    for (const Operand& o : e.inputs) s += " " + operand(o);
    s += "\n";
  }
  s += "  in (";
  for (std::size_t k = 0; k < outputs_.size(); ++k) s += (k ? ", " : "") + operand(outputs_[k]);
  return s + ") }\n";
}

std::vector<Array> Program::run(const std::vector<const Array*>& inputs) const {
  if (inputs.size() != inputs_) {
    throw ValueError("program '" + name_ + "': " + std::to_string(inputs.size()) + " inputs given, it takes " +
                     std::to_string(inputs_));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]->valid())
      throw ValueError("program '" + name_ + "': input " + std::to_string(i) + " is an empty Array handle");
    if (inputs[i]->dtype() != values_[i].dtype || inputs[i]->shape() != values_[i].shape) {
      throw ShapeError("program '" + name_ + "': input " + std::to_string(i) + " is " + inputs[i]->signature() +
                       ", recorded as " + std::string(pmap::name(values_[i].dtype)) + shape_str(values_[i].shape));
    }
    if (inputs[i]->device() != inputs[0]->device()) {
      throw ValueError("program '" + name_ + "': input " + std::to_string(i) + " is on " +
                       inputs[i]->device().str() + ", input 0 on " + inputs[0]->device().str());
    }
  }
  const Device device = inputs.empty() ? Device{} : inputs[0]->device();
  std::vector<Array> moved;  // constants copied to the inputs' device, where they are elsewhere
  moved.reserve(constants_.size());
  for (const Array& c : constants_) moved.push_back(c.device() == device ? Array() : c.to(device));
  auto constant = [&](std::size_t c) -> const Array* { return moved[c].valid() ? &moved[c] : &constants_[c]; };
  std::vector<Array> computed(values_.size());
  auto at = [&](const Operand& o) -> const Array* {
    if (o.constant) return constant(o.index);
    return o.index < inputs_ ? inputs[o.index] : &computed[o.index];
  };
  for (const Equation& e : equations_) {
    std::vector<const Array*> operands;
    for (const Operand& o : e.inputs) operands.push_back(at(o));
    std::vector<Array> out = apply(e.primitive, operands);
    for (std::size_t k = 0; k < e.outputs.size(); ++k) computed[e.outputs[k]] = std::move(out.at(k));
  }
  std::vector<Array> results;
  for (const Operand& o : outputs_) results.push_back(at(o)->copy());
  return results;
}

Program make_program(const std::string& name, const std::vector<const Array*>& inputs,
                     const ProgramFunction& function) {
  if (const Trace* outer = Trace::active()) {
    throw NotAvailable("make_program of '" + name + "' inside '" + outer->function() +
                       "', which is being differentiated: a program is recorded outside grad");
  }
  if (BatchLevel::active() != nullptr)
    throw NotAvailable("make_program of '" + name + "' inside vmap: a program is recorded outside vmap");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string which = "make_program of '" + name + "': input " + std::to_string(i);
    if (!inputs[i]->valid()) throw ValueError(which + " is an empty Array handle");
    if (inputs[i]->dtype() != DType::f32) {
      throw ValueError(which + " is " + inputs[i]->str() +
                       "; a program's inputs are f32 (its other values are constants: close over them)");
    }
    if (detail::trace_tag(*inputs[i]) != 0)
      throw ValueError(which + " is a value of a differentiated or vmapped function");
    if (inputs[i]->device() != inputs[0]->device()) {
      throw ValueError(which + " is on " + inputs[i]->device().str() + ", input 0 on " + inputs[0]->device().str() +
                       ": a program runs on one device");
    }
  }
  Trace trace(name);
  std::vector<Array> traced;
  traced.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    traced.push_back(trace.input(*inputs[i], "input " + std::to_string(i)));
  const std::vector<Array> results = function(traced);
  std::vector<const Array*> ptrs;
  for (const Array& r : results) ptrs.push_back(&r);
  return trace.program(name, inputs.size(), ptrs);
}

}  // namespace pmap::core
