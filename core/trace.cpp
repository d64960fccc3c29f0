// The trace of a differentiated call: recording primitives applied to traced values, and the backward
// pass that runs their VJPs in reverse order, adding cotangents of a value used more than once in a fixed
// order (the order of the uses, last first), so gradients are the same bits run after run.
#include <pmapcc/core/trace.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/program.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <utility>

#include <pmap/collectives.h>
#include <pmap/detail/trace.h>
#include <pmap/error.h>

#include <pmapcc/kernels/eager/array_ops.h>

namespace pmap::core {

void register_traced_collectives() noexcept;  // core/collectives.cpp
void register_traced_shard_map() noexcept;    // core/shard_map_grad.cpp

namespace {

thread_local Trace* tls_active = nullptr;
std::atomic<std::uint64_t> next_serial{1};
std::atomic<std::uint64_t> fused_masks{0};
std::atomic<std::uint64_t> over_input_masks{0};

constexpr std::uint64_t tag_of(std::uint64_t serial, std::size_t slot) {
  return serial << 32 | (static_cast<std::uint64_t>(slot) + 1);
}

// A view of x's storage that no trace follows: what primitives evaluate on.
Array untagged(const Array& x) { return plain_view(x); }

// Pauses the calling thread's trace (the backward pass and evaluation are not recorded).
class Paused {
 public:
  Paused() : trace_(tls_active) { tls_active = nullptr; }
  ~Paused() { tls_active = trace_; }
  Paused(const Paused&) = delete;
  Paused& operator=(const Paused&) = delete;

 private:
  Trace* trace_;
};

}  // namespace

struct Trace::Node {
  std::shared_ptr<const Primitive> primitive;
  std::vector<std::size_t> inputs;  // slot, or kConstant
  std::vector<Array> constants;     // copies of the untraced inputs, in input order
  std::vector<std::size_t> outputs;
  std::vector<std::string> varying;  // with tracking: the operands' axes and the collective's, sorted
  bool over_input = false;  // asked to write input 0's cotangent over input 0 (Primitive::masking_input)
  static constexpr std::size_t kConstant = static_cast<std::size_t>(-1);
};

Trace::Trace(std::string function) : function_(std::move(function)), serial_(next_serial++) {
  if (tls_active != nullptr) {
    throw NotAvailable("grad of '" + function_ + "' inside '" + tls_active->function_ +
                       "', itself being differentiated: higher-order derivatives are not supported yet");
  }
  if (serial_ >= (std::uint64_t{1} << 31)) throw Error("grad: trace counter exhausted");
  register_traced_collectives();
  register_traced_shard_map();
  tls_active = this;
}

Trace::~Trace() {
  if (tls_active == this) tls_active = nullptr;
}

Trace* Trace::active() { return tls_active; }

Array Trace::view(std::size_t slot) const {
  Array v = untagged(values_[slot]);
  detail::set_trace_tag(v, tag_of(serial_, slot));
  return v;
}

Array Trace::input(const Array& leaf, const std::string& where) {
  if (!leaf.valid()) throw ValueError("grad of '" + function_ + "': " + where + " is an empty Array handle");
  if (leaf.dtype() != DType::f32) {
    throw ValueError("grad of '" + function_ + "': " + where + " is " + leaf.str() +
                     ", which is not differentiable (only f32 leaves are); pass it as an argument not "
                     "differentiated (argnums), as JAX does for integer inputs such as labels");
  }
  BatchLevel* level = BatchLevel::active();
  const bool member = level != nullptr && level->holds(leaf, "grad of '" + function_ + "'", 0);
  const Array& value = member ? level->stacked(leaf) : leaf;  // inside vmap: every member's, stacked
  if (detail::trace_tag(value) != 0) {
    throw ValueError("grad of '" + function_ + "': " + where + " is a value of another differentiated function");
  }
  if (level == nullptr) {
    values_.push_back(untagged(value));
    varying_.resize(values_.size());
    fixed_.resize(values_.size());
    return view(values_.size() - 1);
  }
  // Inside vmap each member has its own gradient (JAX's per-example gradients): a value every member reads
  // is differentiated as if each member had its own copy.
  values_.push_back(member ? untagged(value) : broadcast_members(value, level->members()));
  varying_.resize(values_.size());
  fixed_.resize(values_.size());
  return level->wrap(view(values_.size() - 1));
}

namespace {

std::vector<std::string> sorted_axes(const AxisNames& axes) {
  std::vector<std::string> out = axes.names();
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

Array Trace::input(const Array& leaf, const std::string& where, const AxisNames& varying) {
  Array v = input(leaf, where);
  varying_[values_.size() - 1] = sorted_axes(varying);
  return v;
}

Array Trace::fixed_input(const Array& leaf, const AxisNames& varying) {
  if (!leaf.valid()) throw ValueError("grad of '" + function_ + "': an empty Array handle");
  if (detail::trace_tag(leaf) != 0)
    throw ValueError("grad of '" + function_ + "': " + leaf.str() + " is a value of another transformation");
  values_.push_back(untagged(leaf));
  varying_.push_back(sorted_axes(varying));
  fixed_.push_back(1);
  return view(values_.size() - 1);
}

const std::vector<std::string>& Trace::varying(const Array& x) const {
  static const std::vector<std::string> none;  // an untraced value: the same on every device
  return traces(x, "grad of '" + function_ + "'", 0) ? varying_.at(slot_of(x)) : none;
}

void Trace::suspend() {
  if (tls_active == this) tls_active = nullptr;
}

void Trace::resume() {
  if (tls_active == this) return;
  if (tls_active != nullptr)
    throw NotAvailable("grad of '" + function_ + "' resumed inside '" + tls_active->function_ + "'");
  tls_active = this;
}

std::size_t Trace::slot_of(const Array& x) const {
  return static_cast<std::size_t>(detail::trace_tag(x) & 0xffffffffu) - 1;
}

bool Trace::traces(const Array& x, const std::string& op, std::size_t operand) const {
  const std::uint64_t tag = detail::trace_tag(x);
  if (tag == 0) return false;
  if (tag >> 32 == serial_ && slot_of(x) < values_.size()) return true;
  throw ValueError(op + ": operand " + std::to_string(operand) + " (" + x.str() +
                   ") is a value computed inside a differentiated function after that function returned; "
                   "keep only what the function returns");
}

std::vector<Array> Trace::record(std::shared_ptr<const Primitive> p, const std::vector<const Array*>& inputs,
                                 std::vector<Array> outputs) {
  if (done_) throw Error("grad of '" + function_ + "': a primitive recorded after the backward pass");
  Node node;
  node.primitive = std::move(p);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (traces(*inputs[i], node.primitive->name(), i)) {
      node.inputs.push_back(slot_of(*inputs[i]));
    } else {
      node.inputs.push_back(Node::kConstant);
      Paused paused;
      node.constants.push_back(ops::eager::copy(untagged(*inputs[i])));  // the caller may free it before backward
    }
  }
  std::vector<std::string> result_axes;
  if (tracking_) {
    std::vector<std::string>& all = node.varying;
    for (std::size_t s : node.inputs)
      if (s != Node::kConstant) all.insert(all.end(), varying_[s].begin(), varying_[s].end());
    const AxisNames collective = node.primitive->collective_axes();
    const std::vector<std::string>& own = collective.names();
    all.insert(all.end(), own.begin(), own.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    for (const std::string& a : all)
      if (!node.primitive->result_invariant() || std::find(own.begin(), own.end(), a) == own.end())
        result_axes.push_back(a);
  }
  std::vector<Array> views;
  for (Array& out : outputs) {
    values_.push_back(std::move(out));
    varying_.push_back(result_axes);
    fixed_.push_back(0);
    node.outputs.push_back(values_.size() - 1);
    views.push_back(view(values_.size() - 1));
  }
  nodes_.push_back(std::move(node));
  return views;
}

void Trace::fuse_relu_masks(std::size_t differentiated) {
  std::vector<std::size_t> maker(values_.size(), Node::kConstant);  // slot -> the node that made it
  std::vector<std::vector<std::size_t>> readers(values_.size());    // slot -> the nodes that read it
  std::vector<bool> fusable(values_.size(), true);                  // every reader masks it as its input 0
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    for (std::size_t s : nodes_[k].outputs) maker[s] = k;
    for (std::size_t i = 0; i < nodes_[k].inputs.size(); ++i) {
      const std::size_t s = nodes_[k].inputs[i];
      if (s == Node::kConstant) continue;
      readers[s].push_back(k);
      if (i != 0) fusable[s] = false;  // (a node reading it twice, too)
    }
  }
  for (std::size_t s = 0; s < values_.size(); ++s) {
    if (s == differentiated || maker[s] == Node::kConstant || readers[s].empty() || !fusable[s]) continue;
    Node& made = nodes_[maker[s]];
    if (made.outputs.size() != 1 || !made.primitive->output_is_relu()) continue;
    // r's only reader may write the cotangent over r when the trace owns r: nothing reads r after that VJP
    // (the maker's premasked VJP does not; the differentiated value is never r, and the caller holds no other
    // view of the trace's values: backward's precondition).
    const bool over_input = readers[s].size() == 1 && values_[s].owns_data();
    std::vector<std::shared_ptr<const Primitive>> masking;
    for (std::size_t k : readers[s]) {
      masking.push_back(nodes_[k].primitive->masking_input(over_input));
      if (!masking.back()) break;
    }
    auto premasked = masking.size() == readers[s].size() && masking.back() ? made.primitive->premasked() : nullptr;
    if (!premasked) continue;
    for (std::size_t j = 0; j < readers[s].size(); ++j) {
      nodes_[readers[s][j]].primitive = std::move(masking[j]);
      nodes_[readers[s][j]].over_input = over_input;
    }
    made.primitive = std::move(premasked);
    ++fused_masks;
  }
}

std::uint64_t Trace::fused_relu_masks() noexcept { return fused_masks; }
std::uint64_t Trace::masks_over_input() noexcept { return over_input_masks; }

void Trace::backward(const Array& result) {
  if (done_) throw Error("grad of '" + function_ + "': backward twice");
  // Inside vmap, each member's value: their sum is differentiated, which gives each member its gradient.
  BatchLevel* level = BatchLevel::active();
  const Array& value =
      level != nullptr && level->holds(result, "grad of '" + function_ + "'", 0) ? level->stacked(result) : result;
  done_ = true;
  Paused paused;
  gradients_.clear();
  gradients_.resize(values_.size());
  if (detail::trace_tag(value) == 0) return;  // the value does not depend on the differentiated inputs
  traces(value, "grad of '" + function_ + "'", 0);
  gradients_[slot_of(value)] = ops::eager::ones(value.shape(), value.device());
  fuse_relu_masks(slot_of(value));
  for (auto n = nodes_.rbegin(); n != nodes_.rend(); ++n) {
    bool any = false;
    for (std::size_t s : n->outputs) any = any || gradients_[s].valid();
    if (!any) continue;
    std::vector<Array> zeros;  // cotangents of outputs nothing flowed back to
    std::vector<const Array*> ins, outs, cts;
    std::vector<bool> wanted;
    std::size_t c = 0;
    for (std::size_t s : n->inputs) {
      ins.push_back(s == Node::kConstant ? &n->constants[c++] : &values_[s]);
      wanted.push_back(s != Node::kConstant && fixed_[s] == 0);
    }
    zeros.reserve(n->outputs.size());
    for (std::size_t s : n->outputs) {
      outs.push_back(&values_[s]);
      if (!gradients_[s].valid()) zeros.push_back(ops::eager::zeros_like(values_[s]));
      cts.push_back(gradients_[s].valid() ? &gradients_[s] : &zeros.back());
    }
    std::vector<Array> in_cts = tracking_ ? n->primitive->tracked_vjp(ins, outs, cts, wanted)
                                          : n->primitive->vjp(ins, outs, cts, wanted);
    if (n->over_input && !in_cts.empty() && in_cts[0].size() > 0 && in_cts[0].raw_data() == ins[0]->raw_data())
      ++over_input_masks;
    for (std::size_t s : n->outputs) {
      if (!n->inputs.empty()) gradients_[s] = Array();  // consumed: free it early (inputs are earlier slots)
    }
    for (std::size_t i = 0; i < n->inputs.size(); ++i) {
      const std::size_t s = n->inputs[i];
      if (!wanted[i] || i >= in_cts.size() || !in_cts[i].valid()) continue;
      if (in_cts[i].shape() != values_[s].shape()) {
        throw Error("grad: the VJP of " + n->primitive->name() + " gave " + in_cts[i].signature() +
                    " for operand " + std::to_string(i) + " of shape " + values_[s].signature());
      }
      if (tracking_ && !n->primitive->keeps_cotangents()) {  // used with values that vary more: summed over them
        std::vector<std::string> more;
        std::set_difference(n->varying.begin(), n->varying.end(), varying_[s].begin(), varying_[s].end(),
                            std::back_inserter(more));
        if (!more.empty()) in_cts[i] = psum(in_cts[i], AxisNames(std::move(more)));
      }
      gradients_[s] = gradients_[s].valid() ? ops::eager::add(gradients_[s], in_cts[i]) : std::move(in_cts[i]);
    }
  }
}

Array Trace::gradient(const Array& input) {
  BatchLevel* level = BatchLevel::active();
  const bool member = level != nullptr && level->holds(input, "grad of '" + function_ + "'", 0);
  const std::size_t s = slot_of(member ? level->stacked(input) : input);
  if (!done_ || s >= gradients_.size()) throw Error("grad of '" + function_ + "': no backward pass ran");
  Paused paused;
  Array& held = gradients_[s];
  Array g;
  if (!held.valid()) {
    g = ops::eager::zeros_like(values_[s]);
  } else if (held.owns_data() && detail::trace_tag(held) == 0) {
    g = std::move(held);  // the backward pass's own buffer: moved out, a borrowed view left for a second call
    held = untagged(g);
  } else {
    g = ops::eager::copy(untagged(held));  // borrowed storage, or a value an outer grad traces
  }
  return member ? level->wrap(std::move(g)) : std::move(g);
}

void Trace::release(Array& result) const {
  BatchLevel* level = BatchLevel::active();
  if (level != nullptr && level->holds(result, "grad of '" + function_ + "'", 0)) {
    const Array& stacked = level->stacked(result);
    if (detail::trace_tag(stacked) == 0) return;  // computed without the differentiated inputs: vmap's own
    traces(stacked, "grad of '" + function_ + "'", 0);
    Paused paused;
    result = level->wrap(ops::eager::copy(untagged(stacked)));
    return;
  }
  if (detail::trace_tag(result) == 0) return;
  traces(result, "grad of '" + function_ + "'", 0);
  Paused paused;
  result = ops::eager::copy(untagged(result));
}

Program Trace::program(const std::string& name, std::size_t inputs,
                       const std::vector<const Array*>& results) const {
  Paused paused;
  std::vector<Program::Value> values;
  values.reserve(values_.size());
  for (const Array& v : values_) values.push_back({v.shape(), v.dtype()});
  std::vector<Array> constants;
  auto constant = [&](const Array& c) {
    constants.push_back(ops::eager::copy(untagged(c)));
    return Program::Operand{constants.size() - 1, true};
  };
  std::vector<Program::Equation> equations;
  equations.reserve(nodes_.size());
  for (const Node& n : nodes_) {
    Program::Equation e{n.primitive, {}, n.outputs};
    std::size_t c = 0;
    for (std::size_t s : n.inputs)
      e.inputs.push_back(s == Node::kConstant ? constant(n.constants[c++]) : Program::Operand{s, false});
    equations.push_back(std::move(e));
  }
  std::vector<Program::Operand> outputs;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (!results[i]->valid()) throw ValueError(name + ": result " + std::to_string(i) + " is an empty Array handle");
    outputs.push_back(traces(*results[i], name, i) ? Program::Operand{slot_of(*results[i]), false}
                                                   : constant(*results[i]));
  }
  return Program(name, std::move(values), inputs, std::move(constants), std::move(equations), std::move(outputs));
}

namespace {

// apply for inputs that are not members' views inside vmap: evaluated at once, recorded when grad traces an
// input.
std::vector<Array> apply_traced(std::shared_ptr<const Primitive> p, const std::vector<const Array*>& inputs) {
  Trace* trace = Trace::active();
  bool traced = false;
  std::vector<Array> views;
  views.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const bool mine = trace != nullptr && trace->traces(*inputs[i], "ops::" + p->name(), i);
    if (!mine && detail::trace_tag(*inputs[i]) != 0) {
      throw ValueError("ops::" + p->name() + ": operand " + std::to_string(i) + " (" + inputs[i]->str() +
                       ") is a value computed inside a differentiated function after that function returned");
    }
    traced = traced || mine;
    views.push_back(untagged(*inputs[i]));
  }
  std::vector<const Array*> ptrs;
  for (const Array& v : views) ptrs.push_back(&v);
  std::vector<Array> outputs;
  {
    Paused paused;
    outputs = p->eval(ptrs);
  }
  if (!traced) return outputs;
  return trace->record(std::move(p), inputs, std::move(outputs));
}

}  // namespace

std::vector<Array> apply(std::shared_ptr<const Primitive> p, std::vector<const Array*> inputs) {
  BatchLevel* level = BatchLevel::active();
  std::vector<bool> batched(inputs.size(), false);
  bool any = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]->valid()) {
      throw ValueError("ops::" + p->name() + ": operand " + std::to_string(i) + " is an empty Array handle");
    }
    if ((detail::trace_tag(*inputs[i]) & detail::kBatchedTag) == 0) continue;
    if (level == nullptr || !level->holds(*inputs[i], "ops::" + p->name(), i)) {
      throw ValueError("ops::" + p->name() + ": operand " + std::to_string(i) + " (" + inputs[i]->signature() +
                       ") is a value computed inside vmap after that vmap returned; keep only what it returns");
    }
    inputs[i] = &level->stacked(*inputs[i]);
    batched[i] = any = true;
  }
  if (!any) return apply_traced(std::move(p), inputs);
  std::vector<Array> stacked = apply_traced(batched_primitive(std::move(p), std::move(batched), level->members()), inputs);
  std::vector<Array> views;
  for (Array& s : stacked) views.push_back(level->wrap(std::move(s)));
  return views;
}

Array apply1(std::shared_ptr<const Primitive> p, std::vector<const Array*> inputs) {
  auto out = apply(std::move(p), std::move(inputs));
  return std::move(out.at(0));
}

}  // namespace pmap::core
