// Tensor parallelism (Megatron-LM's) in module code: each Dense and Conv layer of a model runs whole,
// column-parallel (its output features split over a mesh axis) or row-parallel (its input features split, the
// partial products psum'd) as the layout of its parameters says, with pvary, psum and all_gather_invariant
// (core/ops.h) where the split features need them, so grad gives each device its block of the unsplit model's
// gradients. The parameters a device holds are its blocks of the layout's (pmap::shard by the same specs), and
// the model runs inside pmap over a mesh with those axes. A model written with a TensorParallel runs unsplit
// when it has no layout (nullptr): one apply serves both.
//
//   nn::TensorParallel tp(call.sharding);                                  // train::Call::sharding
//   nn::Features h = tp.conv(conv0, p.Conv_0, "Conv_0", nn::features(x), /*relu=*/true);
//   h.value = ops::avg_pool(h.value, 2, 2, 2, 2);     // acts on each feature alone: the blocks stay as they are
//   const Array flat = tp.whole(h, "Flatten");        // a reshape mixes the features: whole
//   h = tp.dense(dense0, p.Dense_0, "Dense_0", {ops::reshape(flat, {n, -1})}, /*relu=*/true);  // column
//   h = tp.dense(dense1, p.Dense_1, "Dense_1", h);                                           // row: psum
//   Array logits = tp.whole(h, "the logits");
#pragma once

#include <functional>
#include <string>

#include <pmap/array.h>
#include <pmap/mesh.h>
#include <pmap/partition.h>

#include <pmapcc/nn/layers.h>

namespace pmap::nn {

// A model's layout for tensor parallelism (Keras's LayoutMap once resolved against the model's names):
// - params: specs by parameter name. A kernel (..., in, out) may split its output features (P(none, "model"):
//   column-parallel, its bias P("model") alike) or its input features (P("model", none): row-parallel, bias
//   whole), not both and no other dimension; a parameter not named is whole on every device.
// - outputs: specs by "<layer>/output" (Keras's "d2/output"): where the layer's features are after it. The last
//   entry none gathers them whole at once; an axis keeps them split (making them whole later is then an
//   error). The entries before the last may not split anything but the first (the examples).
struct Sharding {
  Specs params;
  Specs outputs;
  bool empty() const { return params.by_path().empty() && outputs.by_path().empty(); }
};

// Activations whose features (the last axis) may be split over mesh axes: each device then holds its block of
// them, as a column-parallel layer leaves them.
struct Features {
  Array value;
  AxisNames split = {};     // the axes the features are split over; empty: whole on every device
  std::string kept_by = {};  // the output layout that keeps them split ("Dense_0/output"): whole() refuses them
};
// x as whole features: a view of it that grad and vmap follow (x itself stays the caller's).
Features features(const Array& x);

// Runs layers under a Sharding (not owned; nullptr or empty: every layer whole). Errors are ValueError naming
// the parameter or output, its layout and what the layer cannot do.
class TensorParallel {
 public:
  explicit TensorParallel(const Sharding* sharding) : sharding_(sharding) {}

  bool active() const { return sharding_ != nullptr && !sharding_->empty(); }

  // The layer `name` ("Dense_0": its parameters are "<name>/kernel" and "<name>/bias") on x. Whole and
  // column-parallel layers take the whole features (gathered first when x arrives split); a row-parallel one
  // takes x's blocks, split over the axes its kernel's input dimension names. relu: max(y, 0) after the psum.
  Features dense(const Dense& m, const DenseParams& p, const std::string& name, const Features& x,
                 bool relu = false) const;
  Features conv(const Conv& m, const ConvParams& p, const std::string& name, const Features& x,
                bool relu = false) const;
  Features conv(const Conv& m, const ConvKernel& p, const std::string& name, const Features& x,
                bool relu = false) const;

  // Refuses a layout that splits parameter `name` (ValueError naming `what`, the layer that needs it whole).
  void require_whole(const std::string& name, const std::string& what) const;
  // x's features whole on every device: all_gather_invariant of the blocks over their axes when split (a view of
  // x's value when whole: it lives as long as x does). `what` names what needs them whole, for the error when an
  // output layout keeps them split.
  Array whole(const Features& x, const std::string& what) const;
  // The same for features this call may take: whole ones are moved out (a view of an lvalue's would outlive a
  // temporary's storage), so `tp.whole(tp.dense(...), "the logits")` owns its result.
  Array whole(Features&& x, const std::string& what) const;
  // f (an op that mixes the features or draws a value per feature, Dropout's masks) on the whole features, its
  // result split again as x was (pvary, then this device's block): the unsplit model's values. An output layout
  // that keeps x split allows it (the features are whole for f only).
  Features on_whole(const Features& x, const std::function<Array(const Array&)>& f) const;

 private:
  template <class Run>
  Features layer(const std::string& name, const Array& kernel, const Array* bias, const Features& x, bool relu,
                 const Run& run) const;
  P param_spec(const std::string& name) const;
  const Sharding* sharding_;
};

}  // namespace pmap::nn
