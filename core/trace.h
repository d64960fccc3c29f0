// Trace: the record of one differentiated call on one thread (reverse mode, as JAX's linearize-and-transpose
// or a tape): the differentiated leaves, every primitive applied to a traced value, and their values, kept
// until the call returns. pmapcc/core/grad.h drives it; users call grad and value_and_grad, not this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pmap/array.h>

#include <pmapcc/core/primitive.h>

namespace pmap::core {

class Program;  // pmapcc/core/program.h

class Trace {
 public:
  // Begins tracing on the calling thread. `function` names the differentiated function in errors. A trace
  // already active on this thread (grad inside a differentiated function: higher-order derivatives) raises
  // NotAvailable.
  explicit Trace(std::string function);
  ~Trace();  // ends tracing; every traced value's storage is freed
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  const std::string& function() const { return function_; }
  // A traced view of a leaf to differentiate with respect to (f32; `where` names it in errors: "argument 0,
  // leaf 'w1'"). The leaf must outlive the trace; its bits are not copied.
  Array input(const Array& leaf, const std::string& where);
  // Varying-axes tracking, for a shard_map differentiated from outside (pmap/shard_map.h; JAX's varying manual
  // axes), called before any input: each traced value knows the mesh axes along which it may differ between
  // devices. An input varies along the axes input() names; a primitive's results along its traced operands'
  // and its collective_axes(), less those when result_invariant(); a value computed from no input, or
  // captured, along none. The backward pass runs each primitive's tracked_vjp and gives an operand that varies
  // along fewer axes than the primitive the sum of its cotangent over the others (JAX's implicit pvary,
  // transposed: psum), unless the primitive keeps_cotangents(). Runs on a device of a mesh with those axes.
  void track_varying() { tracking_ = true; }
  // input(), varying along `varying` (with track_varying).
  Array input(const Array& leaf, const std::string& where, const AxisNames& varying);
  // A traced view of a leaf that is not differentiated (any dtype: integer indices), varying along `varying`:
  // what is computed from it knows the axes; its gradient is never computed. The leaf must outlive the trace.
  Array fixed_input(const Array& leaf, const AxisNames& varying);
  // The axes a value of this trace varies along (with track_varying; sorted).
  const std::vector<std::string>& varying(const Array& x) const;
  // Stops recording on the calling thread without ending the trace (its values stay, for a backward pass
  // later), and starts again on the calling thread (NotAvailable while another trace is active there): each
  // device's trace of a shard_map's body lives from the forward pass to the backward pass.
  void suspend();
  void resume();

  // The backward pass from the function's value: a traced scalar f32, or an untraced one (every gradient
  // is then zero). Once per trace. The caller holds no view of a traced value but `value` (release() the
  // others first: grad.h releases the auxiliary result): the pass may write over values it has spent.
  // Inside vmap (pmapcc/core/batching.h) the value is each member's, and input() gives every member its own
  // copy of a leaf the members share, so each gets its own gradient.
  void backward(const Array& value);
  // After backward: the gradient of a value input() returned (zeros of its shape where nothing flowed). The
  // backward pass's own buffer is moved out (a second call for the same input copies it, so the first
  // result must outlive it); borrowed storage or a value an outer grad traces is copied.
  Array gradient(const Array& input);
  // A result of the function made independent of the trace: a traced value is replaced by an untraced
  // copy; anything else is left as it is.
  void release(Array& result) const;
  // The record so far as a Program named `name` (pmapcc/core/program.h; make_program's): its inputs the first
  // `inputs` values input() gave, before anything was recorded; its outputs `results`, values of this trace or
  // constants (copied, as the constants the equations read are).
  Program program(const std::string& name, std::size_t inputs, const std::vector<const Array*>& results) const;

  // How many values' ReLU masks backward passes have fused into the VJP that reads them (Primitive::
  // masking_input), in the whole process: tests check that a fusion happened.
  static std::uint64_t fused_relu_masks() noexcept;
  // ... and how many times the one reader's VJP wrote the cotangent over the ReLU's output (spent by then):
  // its result is that storage.
  static std::uint64_t masks_over_input() noexcept;

  // ---- for core::apply --------------------------------------------------------------------------------
  // The trace active on the calling thread, or null.
  static Trace* active();
  // Whether x is a value of this trace. A value of a trace that has ended raises ValueError (`op` and
  // `operand` name the call in the message).
  bool traces(const Array& x, const std::string& op, std::size_t operand) const;
  // Records p applied to inputs with outputs; returns the traced views of the outputs handed to the user.
  std::vector<Array> record(std::shared_ptr<const Primitive> p, const std::vector<const Array*>& inputs,
                            std::vector<Array> outputs);

 private:
  struct Node;
  std::size_t slot_of(const Array& x) const;
  // Primitive::output_is_relu / masking_input / premasked: swaps in the fused copies where they apply.
  void fuse_relu_masks(std::size_t differentiated);
  Array view(std::size_t slot) const;

  std::string function_;
  std::uint64_t serial_;
  Trace* outer_ = nullptr;
  std::vector<Array> values_;  // slot i: the value tagged serial_ << 32 | (i + 1) (owned, or a leaf's view)
  std::vector<Node> nodes_;
  std::vector<Array> gradients_;  // per slot, after backward
  std::vector<std::vector<std::string>> varying_;  // per slot, with tracking_: its axes, sorted
  std::vector<char> fixed_;                         // per slot: fixed_input's (never differentiated)
  bool tracking_ = false;
  bool done_ = false;
};

}  // namespace pmap::core
