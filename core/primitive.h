// Primitive: one differentiable operation, defined once (MLX's Primitive): its name, how it is evaluated
// (through the kernels of the operands' device: pmap::ops::eager, the runtime's collectives), and its
// vector-Jacobian product written in other ops, so grad can differentiate any program built from
// primitives. core::apply is the one way an op runs: it evaluates the primitive and, while a function is
// being differentiated on the calling thread (pmapcc/core/grad.h), records it for the backward pass; inside
// vmap (pmapcc/core/vmap.h) it evaluates the primitive's batching rule over the members instead.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <pmap/array.h>
#include <pmap/mesh.h>

namespace pmap::core {

using Arrays = std::span<const Array* const>;

// A primitive's static parameters, what its operands do not say (a jaxpr equation's params): strides, axes, a
// fused ReLU. Printed by Program::str() and read by exporters (export/onnx), by name, in the primitive's order.
using Attribute = std::variant<std::int64_t, double, std::vector<std::int64_t>, std::string>;
using Attributes = std::vector<std::pair<std::string, Attribute>>;

class Primitive {
 public:
  virtual ~Primitive() = default;
  // "matmul", "psum": what error messages and the trace name.
  virtual std::string name() const = 0;
  // Its static parameters (none by default). Every parameter that changes what eval computes is listed, so an
  // exporter that knows the name and reads these reproduces eval.
  virtual Attributes attributes() const { return {}; }
  // The outputs of the inputs, new arrays on the inputs' device. Inputs are untagged views (no trace
  // follows them). Checks shapes and dtypes: ShapeError / ValueError naming the op and the operand.
  virtual std::vector<Array> eval(Arrays inputs) const = 0;
  // The cotangents of the inputs for which wanted[i] is true, given the inputs, the outputs and one
  // cotangent per output (zeros where nothing flowed back), each of its output's shape; written in
  // pmap::ops (run eagerly: the backward pass is not itself traced). Entries not wanted may be left
  // empty (Array()). An input that is not differentiable (i32 labels) is never wanted.
  virtual std::vector<Array> vjp(Arrays inputs, Arrays outputs, Arrays cotangents,
                                 const std::vector<bool>& wanted) const = 0;

  // ---- vmap's batching rules (pmapcc/core/vmap.h) -------------------------------------------------------
  // The outputs of `members` members at once: inputs[i] is stacked, (members, its shape), where batched[i],
  // else one value every member reads; each output stacked (members, its shape). The default evaluates
  // member by member on views of each member's part and stacks the results (always right, one kernel call
  // per member); a primitive overrides it when one call can do every member (its kernels take a member
  // count, or a leading axis changes nothing: element-wise ops, rows of a pool).
  virtual std::vector<Array> batch(Arrays inputs, const std::vector<bool>& batched, std::int64_t members) const;
  // The VJP of batch(): inputs as for batch, outputs and cotangents stacked; the cotangent of a batched input
  // is stacked, that of an input every member reads is the sum of the members' (added in member order, as
  // grad of the members' summed values gives). The default runs vjp member by member.
  virtual std::vector<Array> batch_vjp(Arrays inputs, Arrays outputs, Arrays cotangents,
                                       const std::vector<bool>& wanted, const std::vector<bool>& batched,
                                       std::int64_t members) const;

  // ---- a ReLU's mask fused into the VJP before it (the Trainer's avg_pool_relu_backward) --------------------
  // grad's backward pass, for a value r made by a primitive whose output_is_relu() (r = max(pre, 0)) when
  // every primitive that reads r reads it as input 0 and has a masking_input(): each of those runs its VJP
  // as that copy, which gives input 0's cotangent already multiplied by (r > 0), and r's maker runs as its
  // premasked() copy, which takes the cotangent of its output as the pre-activation's (no mask pass of its
  // own). The mask is idempotent, so the gradients are the unfused ones (bit for bit but for the sign of a
  // zero: the fused pass writes +0 where a -0 cotangent passes the mask); one pass over r fewer. A premasked()
  // copy's VJP does not read its output. When the reader is r's only one and r is storage the trace owns, r
  // is spent once that VJP has read it (the backward pass's caller guarantees that it holds no view of r:
  // Trace::backward): masking_input(true) asks for a copy that writes the cotangent over r (as the Trainer's
  // backward through a ReLU does) and returns a view of it (or a new buffer, where it cannot).
  virtual bool output_is_relu() const { return false; }
  // nullptr: cannot
  virtual std::shared_ptr<const Primitive> masking_input(bool /*over_input*/) const { return nullptr; }
  virtual std::shared_ptr<const Primitive> premasked() const { return nullptr; }

  // ---- the mesh axes a value varies along (a shard_map differentiated from outside: Trace::track_varying) -----
  // A collective's axes (none for other primitives): its result varies along its operand's axes and these.
  virtual AxisNames collective_axes() const { return {}; }
  // Whether its result is the same on every device along collective_axes() (psum, pmean, pmax, pmin,
  // all_gather, all_gather_invariant): the result then does not vary along them.
  virtual bool result_invariant() const { return false; }
  // The VJP under tracking, where a result that does not vary along an axis has the whole cotangent on every
  // device along it (not each device's share) and the backward pass itself sums an operand's cotangent over the
  // axes the primitive varies along and the operand does not: all_gather's is this device's block of the
  // cotangent, pvary's the cotangent itself. By default vjp.
  virtual std::vector<Array> tracked_vjp(Arrays inputs, Arrays outputs, Arrays cotangents,
                                         const std::vector<bool>& wanted) const {
    return vjp(inputs, outputs, cotangents, wanted);
  }
  // tracked_vjp of the primitive under vmap (the members stacked along axis 0, as batch_vjp takes them). By
  // default batch_vjp, right where tracked_vjp is vjp; a primitive with a tracked_vjp of its own batches it too.
  virtual std::vector<Array> batch_tracked_vjp(Arrays inputs, Arrays outputs, Arrays cotangents,
                                               const std::vector<bool>& wanted, const std::vector<bool>& batched,
                                               std::int64_t members) const {
    return batch_vjp(inputs, outputs, cotangents, wanted, batched, members);
  }
  // Whether the backward pass leaves the operands' cotangents as tracked_vjp gives them, not summed over the
  // axes they do not vary along (a sum of terms each of which stands for itself).
  virtual bool keeps_cotangents() const { return false; }
};

// The attribute `name` of p, or nullptr.
const Attribute* find_attribute(const Attributes& attributes, const std::string& name);
// As Program::str() prints it: 3, 0.5, (2, 3), 'fp32'.
std::string attribute_text(const Attribute& attribute);

// Evaluates p on inputs (all on one device, in the order p expects) and returns its outputs. While the
// calling thread differentiates a function and an input is one of its traced values, the call is recorded
// and the outputs are traced values too (their storage belongs to the trace until the differentiated
// function returns). An input traced by a function that has already returned raises ValueError. An input
// that is one member's value inside vmap makes the call the primitive's batching rule over every member;
// the outputs are then members' values too.
std::vector<Array> apply(std::shared_ptr<const Primitive> p, std::vector<const Array*> inputs);
// apply for a primitive of one output.
Array apply1(std::shared_ptr<const Primitive> p, std::vector<const Array*> inputs);

}  // namespace pmap::core
