// The ONNX exporter: each layer of a Sequential as ONNX nodes (opset 17), by its LayerConfig, with the
// members' tensors as initializers; a ModelProto serialized and written atomically.
#include <pmapcc/ensemble/onnx/export.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include <pmap/error.h>

#include <pmapcc/io/safetensors.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::ensemble::onnx {
namespace {

namespace proto = ::onnx;

constexpr int kOpset = 17;

// Where the running tensor's values are: flat features (N, F), or an image channels last (N, H, W, C, the
// model's own layout) or channels first (N, C, H, W, what ONNX's Conv and pools take).
enum class Layout { flat, nhwc, nchw };

std::int64_t as_int(double v) { return static_cast<std::int64_t>(v); }

// One member's variables: the slots of a TensorLayout in a stacked buffer of `members` members.
struct MemberTensors {
  const TensorLayout& layout;
  std::span<const float> stacked;
  int members;
  int member;

  // Layer `layer`'s tensor `name`, or nullptr when it has none.
  const TensorSlot* slot(int layer, const std::string& name) const {
    for (const TensorSlot& t : layout.tensors)
      if (t.layer == layer && t.name.substr(t.name.rfind('/') + 1) == name) return &t;
    return nullptr;
  }
  std::span<const float> values(const TensorSlot& t) const {
    return stacked.subspan(static_cast<std::size_t>(t.offset * members + std::int64_t{member} * t.size),
                           static_cast<std::size_t>(t.size));
  }
};

class GraphBuilder {
 public:
  explicit GraphBuilder(proto::GraphProto& g) : g_(g) {}

  proto::NodeProto& node(const std::string& op, std::vector<std::string> inputs, const std::string& output) {
    proto::NodeProto& n = *g_.add_node();
    n.set_op_type(op);
    n.set_name(output);
    for (const std::string& in : inputs) n.add_input(in);
    n.add_output(output);
    return n;
  }
  static void ints(proto::NodeProto& n, const std::string& name, const std::vector<std::int64_t>& values) {
    proto::AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(proto::AttributeProto::INTS);
    for (std::int64_t v : values) a.add_ints(v);
  }
  static void integer(proto::NodeProto& n, const std::string& name, std::int64_t value) {
    proto::AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(proto::AttributeProto::INT);
    a.set_i(value);
  }
  static void real(proto::NodeProto& n, const std::string& name, float value) {
    proto::AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(proto::AttributeProto::FLOAT);
    a.set_f(value);
  }
  // An f32 initializer of `dims` holding `values` (row-major).
  const std::string& initializer(const std::string& name, const std::vector<std::int64_t>& dims,
                                 std::span<const float> values) {
    proto::TensorProto& t = *g_.add_initializer();
    t.set_name(name);
    t.set_data_type(proto::TensorProto::FLOAT);
    for (std::int64_t d : dims) t.add_dims(d);
    t.set_raw_data(values.data(), values.size_bytes());  // little-endian f32, as ONNX's raw_data
    return t.name();
  }
  std::string scalar(const std::string& name, float value) { return initializer(name, {}, {&value, 1}); }

 private:
  proto::GraphProto& g_;
};

std::string where(const Sequential& model, std::size_t i) {
  return "layer " + std::to_string(i) + " (" + model.layers()[i]->name() + ", " + model.layers()[i]->describe() + ")";
}

// Member m's network from `input` (N, *model input) to its logits (N, K): the name of the logits tensor.
std::string add_member(GraphBuilder& b, const TrainedMembers& t, int m, const std::string& input,
                       const std::string& prefix) {
  const Sequential& model = t.model;
  const MemberTensors params{model.params_layout(), t.params, t.members, m};
  const MemberTensors state{model.state_layout(), t.state, t.members, m};
  std::string x = input;
  Layout layout = model.input_shape().size() == 3 ? Layout::nhwc : Layout::flat;
  int step = 0;
  auto name = [&](const std::string& layer, const std::string& what) {
    return prefix + layer + "/" + what + "_" + std::to_string(step++);
  };
  // A node reading the running tensor x (and `more`), whose output becomes x.
  auto emit = [&](const std::string& op, const std::vector<std::string>& more, const std::string& layer,
                  const std::string& what) -> proto::NodeProto& {
    std::vector<std::string> inputs{x};
    inputs.insert(inputs.end(), more.begin(), more.end());
    const std::string out = name(layer, what);
    proto::NodeProto& n = b.node(op, inputs, out);
    x = out;
    return n;
  };
  auto to_nchw = [&](const std::string& layer) {
    if (layout != Layout::nhwc) return;
    GraphBuilder::ints(emit("Transpose", {}, layer, "to_nchw"), "perm", {0, 3, 1, 2});
    layout = Layout::nchw;
  };
  auto to_nhwc = [&](const std::string& layer) {
    if (layout != Layout::nchw) return;
    GraphBuilder::ints(emit("Transpose", {}, layer, "to_nhwc"), "perm", {0, 2, 3, 1});
    layout = Layout::nhwc;
  };
  for (std::size_t i = 0; i < model.layers().size(); ++i) {
    const Layer& layer = *model.layers()[i];
    const LayerConfig c = layer.config();
    const std::string ln = layer.name();
    const Dims& in = model.shapes()[i];
    const std::string tensor = prefix + ln + "/";
    if (c.kind == "Conv2D") {
      to_nchw(ln);
      const TensorSlot* k = params.slot(static_cast<int>(i), "kernel");
      const std::int64_t kh = as_int(c.number("kernel")), cin = in[2], cout = as_int(c.number("filters"));
      // (KH, KW, Cin, Cout) -> ONNX's (Cout, Cin, KH, KW).
      const std::span<const float> kv = params.values(*k);
      std::vector<float> w(kv.size());
      for (std::int64_t y = 0; y < kh; ++y)
        for (std::int64_t xk = 0; xk < kh; ++xk)
          for (std::int64_t ci = 0; ci < cin; ++ci)
            for (std::int64_t co = 0; co < cout; ++co)
              w[static_cast<std::size_t>(((co * cin + ci) * kh + y) * kh + xk)] =
                  kv[static_cast<std::size_t>(((y * kh + xk) * cin + ci) * cout + co)];
      std::vector<std::string> weights{b.initializer(tensor + "kernel", {cout, cin, kh, kh}, w)};
      if (const TensorSlot* bias = params.slot(static_cast<int>(i), "bias"))
        weights.push_back(b.initializer(tensor + "bias", {cout}, params.values(*bias)));
      kernels::Conv2dParams p;
      p.height = static_cast<int>(in[0]), p.width = static_cast<int>(in[1]);
      p.in_channels = static_cast<int>(cin), p.out_channels = static_cast<int>(cout);
      p.kernel_h = p.kernel_w = static_cast<int>(kh);
      p.stride_h = p.stride_w = static_cast<int>(c.number("stride"));
      p.padding = c.text.at("padding") == "valid" ? kernels::Padding::valid : kernels::Padding::same;
      const kernels::ConvGeometry g = kernels::conv2d_geometry(p);
      // The padding after: what the last window reaches past the input (the odd pixel of `same`).
      auto after = [&](int out, int size, int before) {
        return std::max<std::int64_t>(0, std::int64_t{out - 1} * p.stride_h + kh - size - before);
      };
      proto::NodeProto& n = emit("Conv", weights, ln, "conv");
      GraphBuilder::ints(n, "kernel_shape", {kh, kh});
      GraphBuilder::ints(n, "strides", {p.stride_h, p.stride_w});
      GraphBuilder::ints(n, "pads", {g.pad_top, g.pad_left, after(g.out_height, p.height, g.pad_top),
                                     after(g.out_width, p.width, g.pad_left)});
    } else if (c.kind == "Dense") {
      if (layout != Layout::flat) throw ValueError("onnx export: " + where(model, i) + " takes flat inputs");
      const TensorSlot* k = params.slot(static_cast<int>(i), "kernel");
      const TensorSlot* bias = params.slot(static_cast<int>(i), "bias");
      std::vector<std::string> weights{b.initializer(tensor + "kernel", {in[0], k->shape[1]}, params.values(*k))};
      if (bias != nullptr) weights.push_back(b.initializer(tensor + "bias", {k->shape[1]}, params.values(*bias)));
      emit("Gemm", weights, ln, "dense");
    } else if (c.kind == "ReLU") {
      emit("Relu", {}, ln, "relu");
    } else if (c.kind == "AveragePooling2D") {
      to_nchw(ln);
      const auto w = as_int(c.number("pool_size"));
      proto::NodeProto& n = emit("AveragePool", {}, ln, "pool");
      GraphBuilder::ints(n, "kernel_shape", {w, w});
      GraphBuilder::ints(n, "strides", {w, w});
    } else if (c.kind == "GlobalAveragePooling2D") {
      to_nchw(ln);
      emit("GlobalAveragePool", {}, ln, "pool");
      GraphBuilder::integer(emit("Flatten", {}, ln, "flatten"), "axis", 1);
      layout = Layout::flat;
    } else if (c.kind == "Flatten") {
      to_nhwc(ln);  // the model flattens (H, W, C) in that order
      GraphBuilder::integer(emit("Flatten", {}, ln, "flatten"), "axis", 1);
      layout = Layout::flat;
    } else if (c.kind == "BatchNormalization") {
      to_nchw(ln);  // channels on axis 1, as ONNX's BatchNormalization wants; (N, C) when flat
      const std::int64_t channels = in.back();
      const std::vector<float> ones(static_cast<std::size_t>(channels), 1.0f), zeros(ones.size(), 0.0f);
      const TensorSlot* gamma = params.slot(static_cast<int>(i), "gamma");
      const TensorSlot* beta = params.slot(static_cast<int>(i), "beta");
      const TensorSlot* mean = state.slot(static_cast<int>(i), "moving_mean");
      const TensorSlot* var = state.slot(static_cast<int>(i), "moving_variance");
      const std::span<const float> scale = gamma ? params.values(*gamma) : std::span<const float>(ones);
      const std::span<const float> shift = beta ? params.values(*beta) : std::span<const float>(zeros);
      proto::NodeProto& n = emit("BatchNormalization",
                                 {b.initializer(tensor + "gamma", {channels}, scale),
                                  b.initializer(tensor + "beta", {channels}, shift),
                                  b.initializer(tensor + "moving_mean", {channels}, state.values(*mean)),
                                  b.initializer(tensor + "moving_variance", {channels}, state.values(*var))},
                                 ln, "batch_norm");
      GraphBuilder::real(n, "epsilon", static_cast<float>(c.number("epsilon")));
    } else if (c.kind == "Dropout") {
      // The identity in inference: no node.
    } else if (c.kind == "Rescaling") {
      // Named by the step: a model may rescale twice, and the layer's name is the kind's.
      emit("Mul", {b.scalar(name(ln, "scale_value"), static_cast<float>(c.number("scale")))}, ln, "scale");
      emit("Add", {b.scalar(name(ln, "offset_value"), static_cast<float>(c.number("offset")))}, ln, "offset");
    } else {
      throw ValueError("onnx export: " + where(model, i) + " has no ONNX form here");
    }
  }
  return x;
}

proto::ValueInfoProto& value_info(proto::ValueInfoProto& v, const std::string& name, int dtype,
                                  const std::vector<std::int64_t>& dims) {
  v.set_name(name);
  proto::TypeProto_Tensor& t = *v.mutable_type()->mutable_tensor_type();
  t.set_elem_type(dtype);
  proto::TensorShapeProto& s = *t.mutable_shape();
  s.add_dim()->set_dim_param("N");  // any batch size
  for (std::int64_t d : dims) s.add_dim()->set_dim_value(d);
  return v;
}

void check_members(const TrainedMembers& t) {
  if (t.members < 1) throw ValueError("onnx export: needs at least one member, got " + std::to_string(t.members));
  const auto want_p = static_cast<std::size_t>(t.members * t.model.params_per_member());
  const auto want_s = static_cast<std::size_t>(t.members * t.model.state_per_member());
  if (t.params.size() != want_p || t.state.size() != want_s)
    throw ValueError("onnx export: " + std::to_string(t.members) + " members of " + t.model.name() + " need " +
                     std::to_string(want_p) + " parameters and " + std::to_string(want_s) + " state values, got " +
                     std::to_string(t.params.size()) + " and " + std::to_string(t.state.size()));
  check_exportable(t.model);
}

// A model with its graph's input; the outputs and nodes are the caller's.
proto::ModelProto new_model(const TrainedMembers& t, const ExportInfo& info, const std::string& graph_name) {
  proto::ModelProto model;
  model.set_ir_version(proto::IR_VERSION);
  model.set_producer_name("pmapcc");
  model.set_producer_version(PMAPCC_VERSION);
  model.set_model_version(1);
  proto::OperatorSetIdProto& opset = *model.add_opset_import();
  opset.set_domain("");
  opset.set_version(kOpset);
  for (const auto& [key, value] : info.metadata) {
    proto::StringStringEntryProto& e = *model.add_metadata_props();
    e.set_key(key);
    e.set_value(value);
  }
  proto::GraphProto& g = *model.mutable_graph();
  g.set_name(graph_name);
  if (!info.doc.empty()) g.set_doc_string(info.doc);
  value_info(*g.add_input(), "images", proto::TensorProto::FLOAT,
             std::vector<std::int64_t>(t.model.input_shape().begin(), t.model.input_shape().end()));
  return model;
}

void write(const proto::ModelProto& model, const std::filesystem::path& path) {
  std::string bytes;
  if (!model.SerializeToString(&bytes)) throw Error("onnx export: " + path.string() + ": the model did not serialize");
  io::write_file_atomically(path, bytes);
}

std::int64_t classes(const Sequential& model) { return model.output_shape().front(); }

}  // namespace

void check_exportable(const Sequential& model) {
  static const char* const known[] = {"Conv2D", "Dense", "ReLU", "AveragePooling2D", "GlobalAveragePooling2D",
                                      "Flatten", "BatchNormalization", "Dropout", "Rescaling"};
  for (std::size_t i = 0; i < model.layers().size(); ++i) {
    const std::string kind = model.layers()[i]->kind();
    if (std::find(std::begin(known), std::end(known), kind) == std::end(known))
      throw ValueError("onnx export: " + where(model, i) + " has no ONNX form here" +
                       (kind == "GatherFeatures" ? " (a model-parallel device's part: export the whole model)" : ""));
  }
  if (model.output_shape().size() != 1)
    throw ValueError("onnx export: model " + model.name() + " gives " + shape_str(model.output_shape()) +
                     " outputs per example, not flat class scores");
}

void export_ensemble(const TrainedMembers& t, const std::filesystem::path& path, const ExportInfo& info) {
  check_members(t);
  proto::ModelProto model = new_model(t, info, t.model.name() + "-ensemble-of-" + std::to_string(t.members));
  proto::GraphProto& g = *model.mutable_graph();
  GraphBuilder b(g);
  std::vector<std::string> probs;
  for (int m = 0; m < t.members; ++m) {
    const std::string prefix = "member_" + std::to_string(m) + "/";
    const std::string logits = add_member(b, t, m, "images", prefix);
    GraphBuilder::integer(b.node("Softmax", {logits}, prefix + "probabilities"), "axis", -1);
    probs.push_back(prefix + "probabilities");
  }
  b.node("Mean", probs, "probabilities");
  proto::NodeProto& argmax = b.node("ArgMax", {"probabilities"}, "class");
  GraphBuilder::integer(argmax, "axis", 1);
  GraphBuilder::integer(argmax, "keepdims", 0);
  value_info(*g.add_output(), "probabilities", proto::TensorProto::FLOAT, {classes(t.model)});
  value_info(*g.add_output(), "class", proto::TensorProto::INT64, {});
  write(model, path);
}

void export_member(const TrainedMembers& t, int member, const std::filesystem::path& path, const ExportInfo& info) {
  check_members(t);
  if (member < 0 || member >= t.members)
    throw ValueError("onnx export: member " + std::to_string(member) + " is not one of the " +
                     std::to_string(t.members) + " members");
  proto::ModelProto model = new_model(t, info, t.model.name() + "-member-" + std::to_string(member));
  proto::GraphProto& g = *model.mutable_graph();
  GraphBuilder b(g);
  const std::string logits = add_member(b, t, member, "images", "");
  b.node("Identity", {logits}, "logits");
  GraphBuilder::integer(b.node("Softmax", {"logits"}, "probabilities"), "axis", -1);
  value_info(*g.add_output(), "logits", proto::TensorProto::FLOAT, {classes(t.model)});
  value_info(*g.add_output(), "probabilities", proto::TensorProto::FLOAT, {classes(t.model)});
  write(model, path);
}

}  // namespace pmap::ensemble::onnx
