// PartitionSpec text, LayoutMap matching, and the ShardingPlan's checks and block copies. See layout.h.
#include <pmapcc/ensemble/layout.h>

#include <algorithm>
#include <cctype>
#include <regex>

#include <pmap/array.h>
#include <pmap/error.h>

namespace pmap::ensemble {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool is_axis_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

}  // namespace

bool PartitionSpec::replicated() const {
  return std::none_of(dims.begin(), dims.end(), [](const auto& a) { return a.has_value(); });
}

std::string PartitionSpec::str() const {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + (dims[i] ? "'" + *dims[i] + "'" : "None");
  return s + (dims.size() == 1 ? ",)" : ")");
}

PartitionSpec PartitionSpec::parse(std::string_view text) {
  const std::string original(text);
  auto bad = [&](const std::string& what) -> ValueError {
    return ValueError("layout '" + original + "': " + what + " (expected e.g. None,model or ('model',))");
  };
  std::string_view s = trim(text);
  if (s.starts_with('(') != s.ends_with(')')) throw bad("unbalanced parentheses");
  if (s.starts_with('(')) s = trim(s.substr(1, s.size() - 2));
  PartitionSpec spec;
  if (s.empty()) return spec;
  if (s.ends_with(',')) s.remove_suffix(1);  // a Python one-tuple: ('model',)
  for (std::size_t start = 0; start <= s.size();) {
    const std::size_t comma = std::min(s.find(',', start), s.size());
    std::string_view entry = trim(s.substr(start, comma - start));
    start = comma + 1;
    if (entry.size() >= 2 && (entry.front() == '\'' || entry.front() == '"') && entry.back() == entry.front())
      entry = entry.substr(1, entry.size() - 2);
    if (entry.empty()) throw bad("an empty entry");
    if (entry == "None" || entry == "none") {
      spec.dims.emplace_back(std::nullopt);
    } else if (is_axis_name(entry)) {
      spec.dims.emplace_back(std::string(entry));
    } else {
      throw bad("'" + std::string(entry) + "' is neither an axis name nor None");
    }
  }
  return spec;
}

void LayoutMap::add(std::string pattern, PartitionSpec spec, bool must_match) {
  try {
    std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ValueError("layout map: '" + pattern + "' is not a regular expression (" + e.what() + ")");
  }
  entries_.push_back({std::move(pattern), std::move(spec), must_match});
}

PartitionSpec LayoutMap::layout_of(std::string_view name, std::optional<std::size_t>* entry) const {
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (std::regex_match(name.begin(), name.end(), std::regex(entries_[i].pattern, std::regex::ECMAScript))) {
      if (entry != nullptr) *entry = i;
      return entries_[i].spec;
    }
  }
  if (entry != nullptr) *entry = std::nullopt;
  return {};
}

LayoutMap reference_cnn_layout() {
  LayoutMap m;
  m.add("Dense_0/kernel", PartitionSpec::parse("None,model"));
  m.add("Dense_0/bias", PartitionSpec::parse("model"));
  m.add("Dense_1/kernel", PartitionSpec::parse("model,None"));
  return m;
}

ShardingPlan::ShardingPlan(const Sequential& model, const LayoutMap& layouts, std::vector<AxisSpec> mesh_axes)
    : axes_(std::move(mesh_axes)), layouts_(layouts) {
  for (const TensorSlot& slot : model.tensors()) {
    std::optional<std::size_t> from;
    ShardedTensor t{slot.name, slot.shape, layouts.layout_of(slot.name, &from), {}, slot.shape, 0, 0};
    const std::string where = "layout of " + slot.name + " (shape " + shape_str(slot.shape) + "): " + t.spec.str() +
                              (from ? " (from pattern '" + layouts.entries()[*from].pattern + "')" : "") + ": ";
    if (t.spec.dims.size() > slot.shape.size())
      throw ValueError(where + "has " + std::to_string(t.spec.dims.size()) + " entries for a " +
                       std::to_string(slot.shape.size()) + "-dimensional weight");
    t.spec.dims.resize(slot.shape.size());
    t.axis_of_dim.assign(slot.shape.size(), -1);
    for (std::size_t d = 0; d < slot.shape.size(); ++d) {
      if (!t.spec.dims[d]) continue;
      const std::string& axis = *t.spec.dims[d];
      const auto it = std::find_if(axes_.begin(), axes_.end(), [&](const AxisSpec& a) { return a.name == axis; });
      if (it == axes_.end()) {
        std::string names;
        for (const AxisSpec& a : axes_) names += (names.empty() ? "" : ", ") + ("'" + a.name + "'");
        throw ValueError(where + "'" + axis + "' is not an axis of the mesh (" + names + ")");
      }
      const int index = static_cast<int>(it - axes_.begin());
      if (std::find(t.axis_of_dim.begin(), t.axis_of_dim.end(), index) != t.axis_of_dim.end())
        throw ValueError(where + "axis '" + axis + "' splits two dimensions");
      if (it->size <= 0 || slot.shape[d] % it->size != 0)
        throw ValueError(where + "dimension " + std::to_string(d) + " (" + std::to_string(slot.shape[d]) +
                         ") is not divisible by the size of '" + axis + "' (" + std::to_string(it->size) + ")");
      t.axis_of_dim[d] = index;
      t.local_shape[d] = slot.shape[d] / it->size;
    }
    t.local_size = product(t.local_shape);
    t.local_offset = local_params_;
    local_params_ += t.local_size;
    full_offsets_.push_back(slot.offset);
    full_params_ += slot.size;
    tensors_.push_back(std::move(t));
  }
  // A user's rule that gives nothing its layout (it matches no name, or an earlier rule takes every name it
  // matches) would be ignored without a word: a typo, another model's name.
  std::vector<std::string> names;
  std::string weights;
  for (const TensorSlot& slot : model.tensors()) {
    names.push_back(slot.name);
    weights += (weights.empty() ? "" : ", ") + slot.name;
  }
  for (const auto& layer : model.layers()) names.push_back(layer->name() + "/output");
  std::vector<bool> used(layouts.entries().size(), false);
  for (const std::string& name : names) {
    std::optional<std::size_t> from;
    layouts.layout_of(name, &from);
    if (from) used[*from] = true;
  }
  for (std::size_t i = 0; i < layouts.entries().size(); ++i) {
    const LayoutMap::Entry& e = layouts.entries()[i];
    if (e.must_match && !used[i])
      throw ValueError("layout rule '" + e.pattern + "=" + e.spec.str() + "' gives no weight of model '" +
                       model.name() + "' its layout: it matches none, or an earlier rule takes them (its weights: " +
                       weights + "; a layer's output is '<layer>/output')");
  }
}

const ShardedTensor& ShardingPlan::tensor(std::string_view name) const {
  for (const ShardedTensor& t : tensors_)
    if (t.name == name) return t;
  std::string names;
  for (const ShardedTensor& t : tensors_) names += (names.empty() ? "" : ", ") + t.name;
  throw ValueError("the model has no weight '" + std::string(name) + "' (its weights: " + names + ")");
}

void ShardingPlan::shard(std::span<const float> full, std::span<const int> coords, std::span<float> local) const {
  copy<true>(full, coords, local);
}

void ShardingPlan::unshard(std::span<const float> local, std::span<const int> coords, std::span<float> full) const {
  copy<false>(local, coords, full);
}

template <bool kToLocal>
void ShardingPlan::copy(std::span<const float> from, std::span<const int> coords, std::span<float> to) const {
  const char* what = kToLocal ? "ShardingPlan::shard" : "ShardingPlan::unshard";
  const auto full_size = static_cast<std::size_t>(full_params_), local_size = static_cast<std::size_t>(local_params_);
  if ((kToLocal ? from.size() : to.size()) != full_size || (kToLocal ? to.size() : from.size()) != local_size)
    throw ShapeError(std::string(what) + ": the whole model is " + std::to_string(full_size) + " floats and a block " +
                     std::to_string(local_size) + ", got buffers of " + std::to_string(from.size()) + " and " +
                     std::to_string(to.size()));
  if (coords.size() != axes_.size())
    throw ValueError(std::string(what) + ": " + std::to_string(coords.size()) + " coordinates for a mesh of " +
                     std::to_string(axes_.size()) + " axes");
  for (std::size_t a = 0; a < axes_.size(); ++a)
    if (coords[a] < 0 || coords[a] >= axes_[a].size)
      throw ValueError(std::string(what) + ": coordinate " + std::to_string(coords[a]) + " is outside axis '" +
                       axes_[a].name + "' of size " + std::to_string(axes_[a].size));
  for (std::size_t k = 0; k < tensors_.size(); ++k) {
    const ShardedTensor& t = tensors_[k];
    if (t.local_size == 0) continue;
    const std::size_t rank = t.shape.size();
    if (rank == 0) {  // a scalar: never split
      const auto f = static_cast<std::size_t>(full_offsets_[k]), l = static_cast<std::size_t>(t.local_offset);
      (kToLocal ? to[l] : to[f]) = kToLocal ? from[f] : from[l];
      continue;
    }
    // The block is a box: dimension d starts at coords[axis] * local_shape[d]. Copy it run by run along the
    // last dimension, walking the other dimensions like an odometer.
    std::vector<std::int64_t> start(rank, 0), stride(rank, 1), index(rank, 0);
    for (std::size_t d = 0; d < rank; ++d)
      if (t.axis_of_dim[d] >= 0) start[d] = coords[static_cast<std::size_t>(t.axis_of_dim[d])] * t.local_shape[d];
    for (std::size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * t.shape[d];
    const std::int64_t run = t.local_shape[rank - 1];
    for (std::int64_t l = t.local_offset; l < t.local_offset + t.local_size; l += run) {
      std::int64_t f = full_offsets_[k];
      for (std::size_t d = 0; d < rank; ++d) f += (start[d] + index[d]) * stride[d];
      const float* src = from.data() + (kToLocal ? f : l);
      std::copy(src, src + run, to.data() + (kToLocal ? l : f));
      for (std::size_t d = rank - 1; d-- > 0;) {  // next run: advance dimensions rank-2 .. 0
        if (++index[d] < t.local_shape[d]) break;
        index[d] = 0;
      }
    }
  }
}

std::optional<std::pair<PartitionSpec, std::string>> ShardingPlan::output_layout(const std::string& layer) const {
  std::optional<std::size_t> from;
  PartitionSpec spec = layouts_.layout_of(layer + "/output", &from);
  if (!from) return std::nullopt;
  return std::pair{std::move(spec), layouts_.entries()[*from].pattern};
}

namespace {

// "layout of Dense_1/kernel (shape (256, 10)): ('model', None): " for the errors about one weight.
std::string about(const ShardedTensor& t) {
  return "layout of " + t.name + " (shape " + shape_str(t.shape) + "): " + t.spec.str() + ": ";
}

std::string axis_name(const ShardingPlan& plan, int axis) {
  return "'" + plan.mesh_axes()[static_cast<std::size_t>(axis)].name + "'";
}

// Where a layer's output features go, from its output layout (plan.output_layout): -1 whole, else the
// index of the axis they stay split over; kNoOutputLayout when the map gives the output no layout.
constexpr int kNoOutputLayout = -2;
int output_features_axis(const ShardingPlan& plan, const std::string& layer, const Dims& out_shape) {
  const auto given = plan.output_layout(layer);
  if (!given) return kNoOutputLayout;
  const PartitionSpec& spec = given->first;
  std::string shape = "(batch";
  for (std::int64_t d : out_shape) shape += ", " + std::to_string(d);
  const std::string about = "layout of " + layer + "/output (shape " + shape + ")): " + spec.str() +
                            " (from pattern '" + given->second + "'): ";
  const std::size_t rank = out_shape.size() + 1;  // with the batch dimension
  if (spec.dims.size() > rank)
    throw ValueError(about + "has " + std::to_string(spec.dims.size()) + " entries for a " + std::to_string(rank) +
                     "-dimensional output");
  if (!spec.dims.empty() && spec.dims[0] && *spec.dims[0] != "data")
    throw ValueError(about + "the batch dimension is split over 'data' or not at all, not over '" + *spec.dims[0] +
                     "'");
  for (std::size_t d = 1; d + 1 < spec.dims.size(); ++d)
    if (spec.dims[d]) throw ValueError(about + "only the last (feature) dimension of an output can be split");
  if (spec.dims.size() < rank || !spec.dims.back()) return -1;
  for (std::size_t a = 0; a < plan.mesh_axes().size(); ++a)
    if (plan.mesh_axes()[a].name == *spec.dims.back()) return static_cast<int>(a);
  throw ValueError(about + "the mesh has no axis '" + *spec.dims.back() + "'");
}

}  // namespace

LocalModel local_model(const Sequential& model, const ShardingPlan& plan) {
  LocalModel out;
  std::vector<std::unique_ptr<Layer>> layers;
  int split_axis = -1;             // the axis the current activation's features are split over, or -1
  std::string split_by;            // the weight that split them
  bool keep_split = false;         // an output layout keeps them split: gathering them is an error
  // The features made whole where `what` needs them (a gather_features layer: one all_gather over the axis).
  auto gather = [&](const std::string& what) {
    if (keep_split)
      throw ValueError("layout of " + split_by.substr(0, split_by.find('/')) + "/output keeps its features split " +
                       "over " + axis_name(plan, split_axis) + ", but " + what + " needs them whole");
    layers.push_back(gather_features(plan.mesh_axes()[static_cast<std::size_t>(split_axis)].size));
    out.splits.push_back({LayerSplit::Kind::gather, split_axis});
    split_axis = -1;
  };
  for (std::size_t i = 0; i < model.layers().size(); ++i) {
    const Layer& layer = *model.layers()[i];
    const Dims& in = model.shapes()[i];
    if (layer.params(in).empty()) {
      if (split_axis >= 0 && !layer.keeps_feature_blocks(in))
        gather("layer " + std::to_string(i) + " (" + layer.name() + ")");
      layers.push_back(layer.clone());
      out.splits.push_back(split_axis >= 0 ? LayerSplit{LayerSplit::Kind::blocks, split_axis} : LayerSplit{});
      continue;
    }
    if (layer.params(in).front().name != "kernel") {  // BatchNormalization: its weights whole, on whole features
      for (const ParamSpec& spec : layer.params(in)) {
        const ShardedTensor& t = plan.tensor(layer.name() + "/" + spec.name);
        if (!t.spec.replicated())
          throw ValueError(about(t) + layer.kind() + "'s weights cannot be split: it must be replicated, ()");
      }
      if (split_axis >= 0) gather("layer " + std::to_string(i) + " (" + layer.name() + ")");
      layers.push_back(layer.clone());
      out.splits.push_back({});
      continue;
    }
    const ShardedTensor& kernel = plan.tensor(layer.name() + "/kernel");
    const bool has_bias = layer.params(in).size() > 1;  // Conv2D(use_bias = false) has its kernel only
    const ShardedTensor* bias = has_bias ? &plan.tensor(layer.name() + "/bias") : nullptr;
    const std::size_t rank = kernel.shape.size(), in_dim = rank - 2, out_dim = rank - 1;
    for (std::size_t d = 0; d < in_dim; ++d)
      if (kernel.axis_of_dim[d] >= 0)
        throw ValueError(about(kernel) + "only the input (" + std::to_string(in_dim) + ") and output (" +
                         std::to_string(out_dim) + ") dimensions of a kernel can be split, not dimension " +
                         std::to_string(d));
    const int in_axis = kernel.axis_of_dim[in_dim], out_axis = kernel.axis_of_dim[out_dim];
    if (in_axis >= 0 && out_axis >= 0)
      throw ValueError(about(kernel) + "splits both its input and its output features; one of them at most");
    if (in_axis < 0 && split_axis >= 0) gather(kernel.name + " (shape " + shape_str(kernel.shape) + "), whole input");
    if (in_axis != split_axis) {
      if (split_axis >= 0)
        throw ValueError(about(kernel) + "its input arrives split over " + axis_name(plan, split_axis) + " by " +
                         split_by + ", so dimension " + std::to_string(in_dim) + " must be split over " +
                         axis_name(plan, split_axis) + " too (row-parallel)");
      throw ValueError(about(kernel) + "splits its input features over " + axis_name(plan, in_axis) +
                       ", but its input arrives whole: a row-parallel layer must follow a column-parallel one");
    }
    const PartitionSpec bias_wanted = out_axis >= 0 ? PartitionSpec{{kernel.spec.dims[out_dim]}} : PartitionSpec{{}};
    if (bias != nullptr && bias->spec != bias_wanted && !(out_axis < 0 && bias->spec.replicated()))
      throw ValueError(about(*bias) + "a bias follows its kernel's output features: it must be " +
                       (out_axis >= 0 ? bias_wanted.str() : std::string("whole, ()")) + " as " + kernel.name +
                       " is " + kernel.spec.str());
    const int output = output_features_axis(plan, layer.name(), model.shapes()[i + 1]);
    if (output >= 0 && output != out_axis)
      throw ValueError("layout of " + layer.name() + "/output: splits the features over " + axis_name(plan, output) +
                       ", but " + kernel.name + " is " + kernel.spec.str() + ": its outputs come out " +
                       (out_axis >= 0 ? "split over " + axis_name(plan, out_axis) : std::string("whole")));
    keep_split = output >= 0;
    if (out_axis >= 0) {
      layers.push_back(layer.with_features(static_cast<int>(kernel.local_shape[out_dim])));
      out.splits.push_back({LayerSplit::Kind::column, out_axis});
      split_axis = out_axis;
      split_by = kernel.name;
      if (output == -1) gather("its output layout");
    } else {
      layers.push_back(layer.clone());
      out.splits.push_back(in_axis >= 0 ? LayerSplit{LayerSplit::Kind::row, in_axis} : LayerSplit{});
      split_axis = -1;
    }
  }
  if (split_axis >= 0) gather("the loss (the logits)");
  out.model = std::make_unique<Sequential>(model.input_shape(), std::move(layers));
  const auto& local = out.model->tensors();  // the checks above guarantee this for the plan's own model
  bool same = local.size() == plan.tensors().size();
  for (std::size_t k = 0; same && k < local.size(); ++k)
    same = local[k].name == plan.tensors()[k].name && local[k].shape == plan.tensors()[k].local_shape;
  if (!same) throw ValueError("local_model: the plan was made for another model");
  return out;
}

}  // namespace pmap::ensemble
