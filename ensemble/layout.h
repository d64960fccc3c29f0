// Model parallelism's vocabulary, as in the Keras distribution API (TensorLayout, LayoutMap) and JAX
// (PartitionSpec): which mesh axis, if any, each dimension of a weight is split over; a map from weight
// names to such layouts; and the plan that places every weight of a model on the devices of a mesh.
//
//   LayoutMap layouts;
//   layouts.add("Dense_0/kernel", PartitionSpec::parse("None,model"));  // Keras: (None, "model")
//   layouts.add("Dense_0/bias", PartitionSpec::parse("model"));
//   ShardingPlan plan(*model, layouts, {{"data", 2}, {"model", 4}});    // checks every weight
//
// Weights are named as in checkpoints (Flax's names: "Conv_0/kernel", "Dense_1/bias").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pmap/mesh.h>

#include <pmapcc/ensemble/model.h>

namespace pmap::ensemble {

// One tensor's layout: for each leading dimension, the mesh axis it is split over, or none. Dimensions
// past the end are not split; an empty spec is the replicated layout.
struct PartitionSpec {
  std::vector<std::optional<std::string>> dims;

  bool replicated() const;  // no dimension split
  // "(None, 'model')", as Keras and JAX print layouts; "()" for the replicated one.
  std::string str() const;
  // "None,model", "(None, 'model')", "model", "()" (spaces and quotes optional; "none" or "None" for none).
  // Throws ValueError naming the text and what is wrong (an empty entry, a malformed axis name).
  static PartitionSpec parse(std::string_view text);

  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;
};

// Weight-name patterns to layouts. A pattern is an ECMAScript regular expression that must match the
// whole name; patterns are tried in the order they were added and the first match wins; a weight that
// no pattern matches is replicated (Keras's LayoutMap, with full matches). A layer's output is named
// "<layer>/output" ("Dense_0/output", as Keras's "d2/output"): its layout says where split features are
// gathered (local_model). Lookups compile the patterns again (plans are made once, for a handful of
// weights), which keeps <regex> out of this header.
class LayoutMap {
 public:
  struct Entry {
    std::string pattern;
    PartitionSpec spec;
    bool must_match = false;  // a user's rule: one that matches no weight or layer output is refused (ShardingPlan)
  };

  // Throws ValueError naming the pattern when it is not a valid regular expression. must_match: the rule is
  // the user's (a default rule may match nothing in a model it does not fit).
  void add(std::string pattern, PartitionSpec spec, bool must_match = false);
  // The layout of weight `name`, and which entry gave it (nullopt: none matched, replicated).
  PartitionSpec layout_of(std::string_view name, std::optional<std::size_t>* entry = nullptr) const;
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

// The reference CNN's default model-parallel layout (Megatron's pattern over the "model" axis): Dense_0,
// 97 % of the weights, column-parallel (kernel (None, 'model'), bias ('model',)), Dense_1 row-parallel
// (kernel ('model', None)), everything else replicated.
LayoutMap reference_cnn_layout();

// One weight as a device holds it: its full shape and layout, the block shape, and where the block sits
// in the device's packed buffer.
struct ShardedTensor {
  std::string name;
  Dims shape;                        // the whole tensor, per member
  PartitionSpec spec;                // normalized: one entry per dimension
  std::vector<int> axis_of_dim;      // per dimension: the index of its mesh axis, or -1
  Dims local_shape;                  // the block: shape[d] / size of axis_of_dim[d]
  std::int64_t local_offset = 0;     // in the device's buffer of local_params() floats
  std::int64_t local_size = 0;       // product(local_shape)
};

// Where every weight of a model lives on each device of a mesh under a LayoutMap. A device holds, per
// weight, its block of it (the whole weight when replicated), packed weight by weight in model order.
// Built once; checks every weight and throws ValueError naming the weight, its shape and its layout when
// the layout has more entries than the weight has dimensions, names an axis the mesh does not have, uses
// an axis twice, or splits a dimension its axis size does not divide.
class ShardingPlan {
 public:
  ShardingPlan(const Sequential& model, const LayoutMap& layouts, std::vector<AxisSpec> mesh_axes);

  const std::vector<ShardedTensor>& tensors() const { return tensors_; }
  const std::vector<AxisSpec>& mesh_axes() const { return axes_; }
  std::int64_t full_params() const { return full_params_; }    // floats of one member's whole model
  std::int64_t local_params() const { return local_params_; }  // floats one device holds per member
  // The tensor called `name`; ValueError listing the model's weights when there is none.
  const ShardedTensor& tensor(std::string_view name) const;
  // The layout the map gives the output of layer `layer` ("Dense_0": the name "Dense_0/output", as Keras),
  // and the pattern that gave it; nullopt when no pattern matches (the layers decide, local_model).
  std::optional<std::pair<PartitionSpec, std::string>> output_layout(const std::string& layer) const;

  // The block of the device at mesh coordinates `coords` (Mesh::coords, one per mesh axis): copies its
  // part of `full` (one member, the model's layout: Sequential::tensors() offsets) into `local`.
  void shard(std::span<const float> full, std::span<const int> coords, std::span<float> local) const;
  // The inverse: writes that device's blocks back into their places in `full`. Doing so for one device of
  // every combination of the split axes' coordinates fills `full` completely.
  void unshard(std::span<const float> local, std::span<const int> coords, std::span<float> full) const;

 private:
  template <bool kToLocal>
  void copy(std::span<const float> from, std::span<const int> coords, std::span<float> to) const;

  std::vector<AxisSpec> axes_;
  LayoutMap layouts_;
  std::vector<ShardedTensor> tensors_;
  std::vector<std::int64_t> full_offsets_;
  std::int64_t full_params_ = 0;
  std::int64_t local_params_ = 0;
};

// How one layer runs under a plan: whole (its weights not split over any axis), column-parallel (its
// output features split over `axis`: each device computes a block of the outputs from the whole input),
// row-parallel (its input features split over `axis`, as the column-parallel layer before it left them:
// each device computes a partial sum of the outputs, which a psum over `axis` completes), or gather (a
// gather_features layer: the whole features from the devices' blocks, an all_gather over `axis`).
// A layer without weights between a column- and a row-parallel layer runs on this device's block of the
// features as they are (blocks: ReLU, Dropout; LayerCall::block tells it which block).
struct LayerSplit {
  enum class Kind { whole, column, row, gather, blocks };
  Kind kind = Kind::whole;
  int axis = -1;  // index into ShardingPlan::mesh_axes(), or -1
};

// The model as each device runs it under `plan`: a Sequential whose parameters are exactly a device's
// blocks (its tensors() have the plan's local shapes, in the same order), and how each layer is split.
struct LocalModel {
  std::unique_ptr<Sequential> model;
  std::vector<LayerSplit> splits;  // per layer of the model
};

// Checks that the layers can run the plan's layouts (Megatron's pattern) and builds the local model. A
// Conv2D or Dense may split its output features (the last kernel dimension, with the bias split alike) or,
// when its input arrives split, its input features (the kernel's next-to-last dimension, over the same axis,
// bias whole). Split features pass through layers that keep feature blocks (ReLU, AvgPool) as they are; they
// are gathered whole (a gather_features layer, one all_gather) where a layer needs them whole (a whole or
// column-parallel layer, Flatten of an image) and for the logits, or right after their layer when its output
// layout ("Dense_0/output" in the map) has the features whole: (None, None), ('data', None). An output
// layout with the features split, (None, 'model'), keeps them split and makes a layer that would gather
// them an error. Throws ValueError naming the weight or output, its shape, its layout and what the layer
// cannot do.
LocalModel local_model(const Sequential& model, const ShardingPlan& plan);

}  // namespace pmap::ensemble
