// grad of a function that calls shard_map (pmap/shard_map.h): the call on traced values becomes one primitive
// of the trace. Its evaluation is the shard_map itself (the arguments' leaves split by their in specs, the body
// on every device, the result assembled whole); its VJP is a second shard_map whose body runs the first one's
// again on each device under a trace that tracks the axes each value varies along (Trace::track_varying) and
// pulls the cotangents' blocks back through it: JAX's transpose of shard_map.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pmap/detail/trace.h>
#include <pmap/error.h>
#include <pmap/shard_map.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/primitive.h>
#include <pmapcc/core/trace.h>
#include <pmapcc/kernels/eager/array_ops.h>

namespace pmap::core {
namespace {

using Body = std::function<std::vector<Array>(const std::vector<Array>&)>;

// The axes a leaf split by `spec` varies along: those the spec names.
AxisNames named_axes(const P& spec) {
  std::vector<std::string> names;
  for (const AxisNames& dim : spec.dims()) names.insert(names.end(), dim.names().begin(), dim.names().end());
  return AxisNames(std::move(names));
}

// body as shard_map over `leaves` (a vector tree: leaf i's path is "i") split by `in_specs`; the outputs
// checked against out_specs() (asked once the body has run, as shard_map does) and assembled whole.
std::vector<Array> run_shard_map(const Mesh& mesh, const std::vector<Array>& leaves, const std::vector<P>& in_specs,
                                 const Body& body, const std::function<std::vector<P>()>& out_specs, bool check) {
  Specs by_index;
  for (std::size_t i = 0; i < in_specs.size(); ++i) by_index.set(std::to_string(i), in_specs[i]);
  const Sharded<std::vector<Array>> blocks = detail::shard_as("shard_map", leaves, mesh, by_index);
  auto out = pmap([&body](const std::vector<Array>& mine) { return body(mine); }, mesh)(blocks);
  const std::vector<std::string> paths = detail::array_paths(out[0]);
  const std::vector<P> specs = out_specs();
  std::vector<detail::OutputLeaves> per_device;
  for (const std::vector<Array>& tree : out) per_device.push_back(detail::output_leaves(tree));
  detail::check_outputs(mesh, paths, specs, per_device, check);
  std::vector<LeafSpec> leaf_specs;
  for (std::size_t i = 0; i < paths.size(); ++i) leaf_specs.push_back({paths[i], specs[i]});
  return unshard(Sharded<std::vector<Array>>(std::move(out.values()), std::move(leaf_specs),
                                             detail::mesh_identity(mesh)),
                 mesh);
}

class ShardMap final : public Primitive {
 public:
  explicit ShardMap(detail::TracedShardMap call) : call_(std::move(call)) {}
  std::string name() const override { return "shard_map"; }
  Attributes attributes() const override {
    std::string specs;
    for (const P& p : call_.in_specs) specs += (specs.empty() ? "" : ", ") + p.str();
    return {{"mesh", call_.mesh->str()}, {"in_specs", specs}};
  }

  std::vector<Array> eval(Arrays in) const override {
    std::vector<Array> leaves;
    for (const Array* a : in) leaves.push_back(plain_view(*a));
    return run_shard_map(*call_.mesh, leaves, call_.in_specs, call_.body, call_.out_specs, call_.check);
  }

  // On each device: the body again, traced with its f32 blocks as inputs (each varying along its in spec's
  // axes) and the cotangents' blocks (along their out spec's); the sum of each f32 output times its
  // cotangent is differentiated, whose gradient in a block is the VJP (the cotangent enters through a
  // product with 1, exactly). The gradients are assembled by the inputs' in specs: a block that varies along
  // fewer axes than the values it met has had its cotangent summed over the others already.
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted) const override {
    const std::size_t inputs = in.size(), outputs = out.size();
    const std::vector<P> out_specs = call_.out_specs();
    std::vector<Array> leaves;
    std::vector<P> specs = call_.in_specs;
    for (const Array* a : in) leaves.push_back(plain_view(*a));
    for (std::size_t j = 0; j < outputs; ++j) {
      leaves.push_back(plain_view(*cts[j]));
      specs.push_back(out_specs.at(j));
    }
    std::vector<std::size_t> differentiated;
    std::vector<P> gradient_specs;
    for (std::size_t i = 0; i < inputs; ++i)
      if (wanted[i] && in[i]->dtype() == DType::f32) {
        differentiated.push_back(i);
        gradient_specs.push_back(call_.in_specs[i]);
      }
    std::vector<Array> grads(inputs);
    if (differentiated.empty()) return grads;
    const Body& body = call_.body;
    const std::vector<P>& in_specs = call_.in_specs;
    auto pullback = [&](const std::vector<Array>& blocks) {
      Trace trace("shard_map's body");
      trace.track_varying();
      std::vector<Array> mine;
      for (std::size_t i = 0; i < inputs; ++i)
        mine.push_back(blocks[i].dtype() == DType::f32
                           ? trace.input(blocks[i], "input leaf " + std::to_string(i), named_axes(in_specs[i]))
                           : plain_view(blocks[i]));
      std::vector<Array> ct(outputs);
      for (std::size_t j = 0; j < outputs; ++j)
        if (blocks[inputs + j].dtype() == DType::f32)
          ct[j] = trace.input(blocks[inputs + j], "cotangent " + std::to_string(j), named_axes(out_specs[j]));
      std::vector<Array> results = body(mine);
      if (results.size() != outputs)
        throw Error("shard_map: f returned " + std::to_string(results.size()) + " arrays in its backward pass, " +
                    std::to_string(outputs) + " before");
      Array total;
      for (std::size_t j = 0; j < outputs; ++j) {
        if (results[j].dtype() != DType::f32 || !ct[j].valid()) continue;
        Array term = ops::sum(ops::multiply(results[j], ct[j]));
        total = total.valid() ? ops::add(total, term) : std::move(term);
      }
      results.clear();  // (backward's precondition: no other view of a traced value is held)
      if (total.valid()) trace.backward(total);
      std::vector<Array> g;
      for (std::size_t i : differentiated)
        g.push_back(total.valid() ? trace.gradient(mine[i]) : ops::eager::zeros_like(blocks[i]));
      return g;
    };
    std::vector<Array> whole =
        run_shard_map(*call_.mesh, leaves, specs, pullback, [&gradient_specs] { return gradient_specs; }, call_.check);
    for (std::size_t k = 0; k < differentiated.size(); ++k) {
      const std::size_t i = differentiated[k];
      grads[i] = whole[k].device() == in[i]->device() ? std::move(whole[k]) : whole[k].to(in[i]->device());
    }
    return grads;
  }

 private:
  detail::TracedShardMap call_;
};

std::vector<Array> traced_shard_map(const detail::TracedShardMap& call, const std::vector<const Array*>& leaves) {
  return core::apply(std::make_shared<ShardMap>(call), leaves);
}

}  // namespace

// Called by every Trace (so that this file is linked whenever grad is used).
void register_traced_shard_map() noexcept { detail::set_traced_shard_map_handler(&traced_shard_map); }

}  // namespace pmap::core
