// grad of a function that calls shard_map (pmap/shard_map.h): the call on traced values becomes one primitive
// of the trace. Its evaluation is the shard_map, with each device's run of the body recorded by a trace of its
// own that tracks the mesh axes each value varies along (Trace::track_varying); that trace is kept until the
// backward pass, which is a second shard_map: each device resumes its trace with the cotangents' blocks and
// runs its backward pass. JAX's transpose of shard_map (with the residuals of the forward pass, so f runs once).
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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

// The axes a leaf split by `spec` varies along: those the spec names.
AxisNames named_axes(const P& spec) {
  std::vector<std::string> names;
  for (const AxisNames& dim : spec.dims()) names.insert(names.end(), dim.names().begin(), dim.names().end());
  return AxisNames(std::move(names));
}

Specs by_index(const std::vector<P>& specs) {
  Specs out;
  for (std::size_t i = 0; i < specs.size(); ++i) out.set(std::to_string(i), specs[i]);
  return out;
}

// The devices' output leaves checked against `specs` (as shard_map checks them) and assembled whole.
std::vector<Array> assemble(const Mesh& mesh, Sharded<std::vector<Array>> out, const std::vector<P>& specs,
                            bool check) {
  const std::vector<std::string> paths = detail::array_paths(out[0]);
  std::vector<detail::OutputLeaves> per_device;
  for (const std::vector<Array>& tree : out) per_device.push_back(detail::output_leaves(tree));
  detail::check_outputs(mesh, paths, specs, per_device, check);
  std::vector<LeafSpec> leaf_specs;
  for (std::size_t i = 0; i < paths.size(); ++i) leaf_specs.push_back({paths[i], specs[i]});
  return unshard(Sharded<std::vector<Array>>(std::move(out.values()), std::move(leaf_specs),
                                             detail::mesh_identity(mesh)),
                 mesh);
}

// The sum of the cotangent terms (one per output) whose cotangents pass to each term as they are: each term
// stands for itself, whatever the axes it varies along (one that varies along none is one value, not one per
// device).
class SumOfTerms final : public Primitive {
 public:
  std::string name() const override { return "shard_map_cotangent_terms"; }
  std::vector<Array> eval(Arrays in) const override {
    Array total = ops::eager::copy(*in[0]);
    for (std::size_t i = 1; i < in.size(); ++i) total = ops::eager::add(total, *in[i]);
    std::vector<Array> out;
    out.push_back(std::move(total));
    return out;
  }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& wanted) const override {
    std::vector<Array> g(in.size());
    for (std::size_t i = 0; i < in.size(); ++i)
      if (wanted[i]) g[i] = ops::eager::copy(*cts[0]);
    return g;
  }
  bool keeps_cotangents() const override { return true; }
};

// What the forward pass leaves for the backward pass: the argument's blocks, and on each device (by its index
// over every mesh axis) its trace, its traced inputs and its outputs.
struct Residuals {
  struct Device {
    std::unique_ptr<Trace> trace;
    std::vector<Array> inputs, outputs;
  };
  std::mutex mutex;
  Sharded<std::vector<Array>> blocks;  // (declared first: destroyed after the traces that view it)
  std::map<int, Device> devices;
  std::vector<P> out_specs;
};

class ShardMap final : public Primitive {
 public:
  explicit ShardMap(detail::TracedShardMap call) : call_(std::move(call)), kept_(std::make_shared<Residuals>()) {
    std::vector<std::string> names;
    for (const AxisSpec& a : call_.mesh->axes()) names.push_back(a.name);
    all_ = AxisNames(std::move(names));
  }
  std::string name() const override { return "shard_map"; }
  Attributes attributes() const override {
    std::string specs;
    for (const P& p : call_.in_specs) specs += (specs.empty() ? "" : ", ") + p.str();
    return {{"mesh", call_.mesh->str()}, {"in_specs", specs}};
  }

  // The body on every device under its own trace (f32 blocks differentiable, the others fixed; each varying
  // along its in spec's axes), kept; an output that varies along an axis its out spec does not name raises (JAX's
  // check_vma: its cotangent would be counted once per device).
  std::vector<Array> eval(Arrays in) const override {
    Residuals& kept = *kept_;
    std::vector<Array> leaves;
    for (const Array* a : in) leaves.push_back(plain_view(*a));
    kept.blocks = detail::shard_as("shard_map", leaves, *call_.mesh, by_index(call_.in_specs));
    auto out = pmap([this, &kept](const std::vector<Array>& mine) {
      auto trace = std::make_unique<Trace>("shard_map's body");
      trace->track_varying();
      std::vector<Array> inputs;
      for (std::size_t i = 0; i < mine.size(); ++i) {
        const AxisNames axes = named_axes(call_.in_specs[i]);
        inputs.push_back(mine[i].dtype() == DType::f32 ? trace->input(mine[i], "input leaf " + std::to_string(i), axes)
                                                       : trace->fixed_input(mine[i], axes));
      }
      std::vector<Array> outputs = call_.body(inputs);
      trace->suspend();
      const std::vector<P> specs = call_.out_specs();
      std::vector<Array> views;
      for (std::size_t j = 0; j < outputs.size(); ++j) {
        std::vector<std::string> extra;
        const AxisNames named = named_axes(specs.at(j));
        for (const std::string& a : trace->varying(outputs[j]))
          if (std::find(named.names().begin(), named.names().end(), a) == named.names().end()) extra.push_back(a);
        if (!extra.empty())
          throw ValueError("shard_map: output leaf " + std::to_string(j) + " " + outputs[j].signature() +
                           " varies along " + AxisNames(extra).str() + " (it is computed from values that differ "
                           "between those devices), which its out spec " + specs[j].str() + " does not name; under " +
                           "grad its cotangent would count once per device: reduce it (psum, pmean) or name the axis");
        views.push_back(plain_view(outputs[j]));
      }
      std::lock_guard<std::mutex> lock(kept.mutex);
      kept.devices[axis_index(all_)] = {std::move(trace), std::move(inputs), std::move(outputs)};
      return views;
    }, *call_.mesh)(kept.blocks);
    kept.out_specs = call_.out_specs();
    return assemble(*call_.mesh, std::move(out), kept.out_specs, call_.check);
  }

  // On each device: its trace resumed, the cotangents' blocks traced (each varying along its out spec's axes),
  // the sum of each f32 output times its cotangent differentiated (the cotangent enters through a product with
  // 1, exactly), whose gradient in an input block is the VJP. Assembled by the inputs' in specs: a block that
  // varies along fewer axes than the values it met has had its cotangent summed over the others already.
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& wanted) const override {
    Residuals& kept = *kept_;
    std::vector<std::size_t> differentiated;
    std::vector<P> gradient_specs;
    for (std::size_t i = 0; i < in.size(); ++i)
      if (wanted[i] && in[i]->dtype() == DType::f32) {
        differentiated.push_back(i);
        gradient_specs.push_back(call_.in_specs[i]);
      }
    std::vector<Array> grads(in.size());
    if (differentiated.empty()) return grads;
    std::vector<Array> leaves;
    for (const Array* c : cts) leaves.push_back(plain_view(*c));
    const Sharded<std::vector<Array>> blocks =
        detail::shard_as("shard_map", leaves, *call_.mesh, by_index(kept.out_specs));
    auto out = pmap([&](const std::vector<Array>& ct_blocks) {
      Residuals::Device mine;
      {
        std::lock_guard<std::mutex> lock(kept.mutex);
        auto found = kept.devices.find(axis_index(all_));
        if (found == kept.devices.end()) throw Error("shard_map: no forward pass on this device to differentiate");
        mine = std::move(found->second);
        kept.devices.erase(found);
      }
      Trace& trace = *mine.trace;
      trace.resume();
      std::vector<Array> grads_here;
      try {
        std::vector<Array> terms;
        for (std::size_t j = 0; j < mine.outputs.size(); ++j) {
          if (mine.outputs[j].dtype() != DType::f32 || ct_blocks[j].dtype() != DType::f32) continue;
          const Array ct = trace.input(ct_blocks[j], "cotangent " + std::to_string(j), named_axes(kept.out_specs[j]));
          terms.push_back(ops::sum(ops::multiply(mine.outputs[j], ct)));
        }
        mine.outputs.clear();  // (backward's precondition: no other view of a traced value is held)
        Array total;
        if (terms.size() == 1) total = std::move(terms[0]);
        if (terms.size() > 1) {
          std::vector<const Array*> ptrs;
          for (const Array& t : terms) ptrs.push_back(&t);
          total = apply1(std::make_shared<SumOfTerms>(), ptrs);
        }
        terms.clear();
        if (total.valid()) trace.backward(total);
        for (std::size_t i : differentiated)
          grads_here.push_back(total.valid() ? trace.gradient(mine.inputs[i])
                                             : ops::eager::zeros_like(plain_view(mine.inputs[i])));
      } catch (...) {
        trace.suspend();
        throw;
      }
      trace.suspend();
      return grads_here;
    }, *call_.mesh)(blocks);
    std::vector<Array> whole = assemble(*call_.mesh, std::move(out), gradient_specs, call_.check);
    for (std::size_t k = 0; k < differentiated.size(); ++k) {
      const std::size_t i = differentiated[k];
      grads[i] = whole[k].device() == in[i]->device() ? std::move(whole[k]) : whole[k].to(in[i]->device());
    }
    return grads;
  }

 private:
  detail::TracedShardMap call_;
  std::shared_ptr<Residuals> kept_;  // (a primitive is const: what its evaluation leaves is kept here)
  AxisNames all_;
};

std::vector<Array> traced_shard_map(const detail::TracedShardMap& call, const std::vector<const Array*>& leaves) {
  return core::apply(std::make_shared<ShardMap>(call), leaves);
}

}  // namespace

// Called by every Trace (so that this file is linked whenever grad is used).
void register_traced_shard_map() noexcept { detail::set_traced_shard_map_handler(&traced_shard_map); }

}  // namespace pmap::core
