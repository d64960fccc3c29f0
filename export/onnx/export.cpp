// The ONNX exporter (export/onnx/export.h): a member's inference function recorded at two batch sizes, each
// primitive of the record emitted as ONNX nodes by its emitter below, the member's variables as initializers;
// a ModelProto serialized and written atomically.
#include <pmapcc/export/onnx/export.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <onnx/onnx_pb.h>

#include <pmap/error.h>

#include <pmapcc/core/program.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/io/safetensors.h>

namespace pmap::onnx {
namespace {

namespace proto = ::onnx;
using core::Program;
using Ints = std::vector<std::int64_t>;

constexpr int kOpset = 17;
// The batch sizes a member's function is recorded at: a dimension that differs between the two records is the
// examples' axis (ONNX's dynamic "N"), or a multiple of it.
constexpr std::int64_t kBatchA = 2, kBatchB = 3;

// ---- the graph under construction ---------------------------------------------------------------------------

class Graph {
 public:
  explicit Graph(proto::GraphProto& g) : g_(g) {}

  proto::NodeProto& node(const std::string& op, const std::vector<std::string>& inputs, const std::string& output) {
    proto::NodeProto& n = *g_.add_node();
    n.set_op_type(op);
    n.set_name(output);
    for (const std::string& in : inputs) n.add_input(in);
    n.add_output(output);
    return n;
  }
  static void ints(proto::NodeProto& n, const std::string& name, const Ints& values) {
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
  // An initializer of `dims` holding `bytes` (row-major, little-endian, as ONNX's raw_data).
  const std::string& initializer(const std::string& name, int dtype, const Ints& dims, const void* bytes,
                                 std::size_t size) {
    proto::TensorProto& t = *g_.add_initializer();
    t.set_name(name);
    t.set_data_type(dtype);
    for (std::int64_t d : dims) t.add_dims(d);
    t.set_raw_data(bytes, size);
    return t.name();
  }
  // A host Array (f32 or i32) as an initializer.
  const std::string& initializer(const std::string& name, const Array& a, const std::string& what) {
    Array host = a.device() == Device{} ? Array() : a.to(Device{});
    const Array& h = host.valid() ? host : a;
    int dtype = proto::TensorProto::FLOAT;
    if (h.dtype() == DType::i32) {
      dtype = proto::TensorProto::INT32;
    } else if (h.dtype() != DType::f32) {
      throw ValueError("onnx export: " + what + " is " + h.signature() + "; only f32 and i32 tensors are exported");
    }
    std::string bytes(h.nbytes(), '\0');
    h.copy_to_host(bytes.data(), bytes.size());
    return initializer(name, dtype, Ints(h.shape().begin(), h.shape().end()), bytes.data(), bytes.size());
  }
  std::string int64s(const std::string& name, const Ints& values) {
    return initializer(name, proto::TensorProto::INT64, {static_cast<std::int64_t>(values.size())}, values.data(),
                       values.size() * sizeof(std::int64_t));
  }
  std::string scalar(const std::string& name, float value) {
    return initializer(name, proto::TensorProto::FLOAT, {}, &value, sizeof value);
  }
  std::string floats(const std::string& name, const std::vector<float>& values) {
    return initializer(name, proto::TensorProto::FLOAT, {static_cast<std::int64_t>(values.size())}, values.data(),
                       values.size() * sizeof(float));
  }

 private:
  proto::GraphProto& g_;
};

// ---- one member's program as nodes ----------------------------------------------------------------------------

// Attribute `name` of p as a T: Error naming the primitive and the attribute when it has none of that type (an
// emitter out of step with its primitive).
template <class T> T attribute(const core::Primitive& p, const std::string& name) {
  const core::Attributes all = p.attributes();
  const core::Attribute* a = core::find_attribute(all, name);
  const T* value = a == nullptr ? nullptr : std::get_if<T>(a);
  if (value == nullptr)
    throw Error("onnx export: " + p.name() + " has no attribute '" + name + "' of the type its emitter reads");
  return *value;
}
std::int64_t int_attribute(const core::Primitive& p, const std::string& name) {
  return attribute<std::int64_t>(p, name);
}
Ints ints_attribute(const core::Primitive& p, const std::string& name) { return attribute<Ints>(p, name); }
float float_attribute(const core::Primitive& p, const std::string& name) {
  return static_cast<float>(attribute<double>(p, name));
}

// "conv2d(relu)" -> "conv2d"
std::string base_name(const std::string& name) { return name.substr(0, name.find('(')); }

bool is_identity(const Ints& perm) {
  for (std::size_t k = 0; k < perm.size(); ++k)
    if (perm[k] != static_cast<std::int64_t>(k)) return false;
  return true;
}

// "SAME" padding as Flax and Keras split it (the extra pixel after): {before, after}.
std::pair<std::int64_t, std::int64_t> same_pads(std::int64_t size, std::int64_t window, std::int64_t stride) {
  const std::int64_t out = (size + stride - 1) / stride;
  const std::int64_t total = std::max<std::int64_t>((out - 1) * stride + window - size, 0);
  return {total / 2, total - total / 2};
}

class Member {
 public:
  // `a` and `b`: the member's function recorded at batch sizes kBatchA and kBatchB; `prefix` starts every name
  // this member adds; `where` names it in errors ("member 1").
  Member(Graph& g, const Program& a, const Program& b, std::string prefix, std::string where)
      : g_(g), a_(a), b_(b), prefix_(std::move(prefix)), where_(std::move(where)) {
    check_same();
    names_.resize(a.values().size());
    for (std::size_t v = 0; v < a.values().size(); ++v) {
      const Shape& sa = a.values()[v].shape;
      const Shape& sb = b.values()[v].shape;
      std::vector<bool> d(sa.size());
      for (std::size_t k = 0; k < sa.size(); ++k) d[k] = sa[k] != sb[k];
      dynamic_.push_back(std::move(d));
    }
  }

  // Emits the equations the outputs need; inputs[i]: the tensor holding input i. Returns the tensors of the
  // program's outputs.
  std::vector<std::string> emit(const std::vector<std::string>& inputs) {
    for (std::size_t i = 0; i < inputs.size(); ++i) names_[i] = inputs[i];
    std::vector<bool> live(a_.values().size(), false);
    for (const Program::Operand& o : a_.outputs())
      if (!o.constant) live[o.index] = true;
    const auto& eqs = a_.equations();
    std::vector<bool> needed(eqs.size(), false);
    for (std::size_t k = eqs.size(); k-- > 0;) {
      for (std::size_t v : eqs[k].outputs) needed[k] = needed[k] || live[v];
      if (!needed[k]) continue;
      for (const Program::Operand& o : eqs[k].inputs)
        if (!o.constant) live[o.index] = true;
    }
    for (std::size_t k = 0; k < eqs.size(); ++k)
      if (needed[k]) equation(eqs[k]);
    std::vector<std::string> out;
    for (const Program::Operand& o : a_.outputs()) out.push_back(o.constant ? constant(o.index) : use(o.index));
    return out;
  }

 private:
  struct Pending {  // a value that is `source` transposed by `perm`, not yet a node
    std::string source;
    Ints perm;
  };

  // The two records must be one program that differs only in the sizes that follow the examples: the same
  // primitives reading the same operands, the same attributes but for those that hold such sizes (reshape's
  // and broadcast_to's shape, slice's stop: their emitters check them), and the same constants, bit for bit.
  void check_same() const {
    const Program& b = b_;
    const auto& ea = a_.equations();
    const auto& eb = b.equations();
    bool same = ea.size() == eb.size() && a_.values().size() == b.values().size() &&
                a_.constants().size() == b.constants().size() && a_.outputs().size() == b.outputs().size();
    auto same_operand = [](const Program::Operand& x, const Program::Operand& y) {
      return x.constant == y.constant && x.index == y.index;
    };
    for (std::size_t k = 0; same && k < ea.size(); ++k) {
      same = ea[k].primitive->name() == eb[k].primitive->name() && ea[k].inputs.size() == eb[k].inputs.size() &&
             ea[k].outputs == eb[k].outputs;
      for (std::size_t i = 0; same && i < ea[k].inputs.size(); ++i)
        same = same_operand(ea[k].inputs[i], eb[k].inputs[i]);
    }
    for (std::size_t o = 0; same && o < a_.outputs().size(); ++o) same = same_operand(a_.outputs()[o], b.outputs()[o]);
    for (std::size_t v = 0; same && v < a_.values().size(); ++v)
      same = a_.values()[v].shape.size() == b.values()[v].shape.size() && a_.values()[v].dtype == b.values()[v].dtype;
    if (!same)
      throw NotAvailable("onnx export: " + where_ + ": the function applies other primitives to " +
                         std::to_string(kBatchA) + " examples than to " + std::to_string(kBatchB) +
                         "; the exported graph must be one for any number of examples");
    for (std::size_t k = 0; k < ea.size(); ++k) {
      const core::Attributes x = ea[k].primitive->attributes(), y = eb[k].primitive->attributes();
      const std::string name = base_name(ea[k].primitive->name());
      for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
        if (x[i].second == y[i].second) continue;
        const bool sized = (x[i].first == "shape" && (name == "reshape" || name == "broadcast_to")) ||
                           (x[i].first == "stop" && name == "slice");
        if (!sized)
          throw NotAvailable("onnx export: " + where_ + ": " + ea[k].primitive->name() + "'s " + x[i].first + " is " +
                             core::attribute_text(x[i].second) + " for " + std::to_string(kBatchA) + " examples and " +
                             core::attribute_text(y[i].second) + " for " + std::to_string(kBatchB) +
                             "; the exported graph must be one for any number of examples");
      }
    }
    for (std::size_t c = 0; c < a_.constants().size(); ++c) {
      const Array& x = a_.constants()[c];
      const Array& y = b.constants()[c];
      bool equal = x.shape() == y.shape() && x.dtype() == y.dtype();
      if (equal) {
        std::string bx(x.nbytes(), '\0'), by(y.nbytes(), '\0');
        x.copy_to_host(bx.data(), bx.size());
        y.copy_to_host(by.data(), by.size());
        equal = bx == by;
      }
      if (!equal)
        throw NotAvailable("onnx export: " + where_ + ": a constant of " + x.signature() + " (" + y.signature() +
                           " for " + std::to_string(kBatchB) + " examples) depends on the number of examples (made "
                           "with the batch's size inside the function); the exported graph takes any number");
    }
  }

  // The names this member's nodes make start with '%' after the prefix (variables' names do not: record()):
  // "%12_relu" for value 12, "%t5_relu" for a tensor between nodes, "%c3" for constant 3.
  std::string fresh(const std::string& what) { return prefix_ + "%t" + std::to_string(serial_++) + "_" + what; }
  std::string value_name(std::size_t v, const Program::Equation& e) {
    return prefix_ + "%" + std::to_string(v) + "_" + base_name(e.primitive->name());
  }
  std::size_t equation_index(const Program::Equation& e) const {
    return static_cast<std::size_t>(&e - a_.equations().data());
  }
  [[noreturn]] void refuse(const Program::Equation& e, const std::string& why) const {
    throw NotAvailable("onnx export: " + where_ + ": " + e.primitive->name() + " " + why);
  }

  std::string constant(std::size_t c) {
    auto [it, added] = constants_.emplace(c, std::string());
    if (added) {
      const std::string n = std::to_string(c);
      it->second = g_.initializer(prefix_ + "%c" + n, a_.constants()[c], where_ + "'s constant " + n);
    }
    return it->second;
  }
  // The tensor holding value v, its pending transpose emitted now if it has one.
  std::string use(std::size_t v) {
    const std::string name = names_[v];
    if (name.empty()) throw Error("onnx export: " + where_ + ": value %" + std::to_string(v) + " was not emitted");
    if (name.front() == '!') throw NotAvailable("onnx export: " + where_ + ": " + name.substr(1));
    auto it = pending_.find(name);
    if (it == pending_.end()) return name;
    Graph::ints(g_.node("Transpose", {it->second.source}, name), "perm", it->second.perm);
    pending_.erase(it);
    return name;
  }
  std::string use(const Program::Operand& o) { return o.constant ? constant(o.index) : use(o.index); }
  // The tensor of operand o transposed by perm (y.dim[k] = x.dim[perm[k]]): none where it undoes a pending
  // transpose, one Transpose of the source where it composes with one.
  std::string transposed(const Program::Operand& o, const Ints& perm) {
    std::string source;
    Ints composed = perm;
    if (!o.constant) {
      if (auto it = pending_.find(names_[o.index]); it != pending_.end()) {
        source = it->second.source;
        for (std::size_t k = 0; k < perm.size(); ++k) composed[k] = it->second.perm[static_cast<std::size_t>(perm[k])];
      }
    }
    if (source.empty()) source = use(o);
    if (is_identity(composed)) return source;
    const auto key = std::make_pair(source, composed);
    if (auto it = transposes_.find(key); it != transposes_.end()) return it->second;
    const std::string out = fresh("transpose");
    Graph::ints(g_.node("Transpose", {source}, out), "perm", composed);
    transposes_.emplace(key, out);
    return out;
  }
  void set(std::size_t v, std::string tensor) { names_[v] = std::move(tensor); }
  void set_pending(std::size_t v, const Program::Equation& e, std::string source, Ints perm) {
    const std::string name = value_name(v, e);
    if (is_identity(perm)) {
      names_[v] = std::move(source);
      return;
    }
    names_[v] = name;
    pending_[name] = Pending{std::move(source), std::move(perm)};
  }
  const Shape& shape(const Program::Operand& o) const {
    return o.constant ? a_.constants()[o.index].shape() : a_.values()[o.index].shape;
  }
  bool dynamic(const Program::Operand& o, std::size_t axis) const { return !o.constant && dynamic_[o.index][axis]; }

  // A node of `op` on the operands' tensors whose output is value e.outputs[0].
  proto::NodeProto& simple(const Program::Equation& e, const std::string& op, const std::vector<std::string>& inputs) {
    const std::string out = value_name(e.outputs[0], e);
    set(e.outputs[0], out);
    return g_.node(op, inputs, out);
  }
  proto::NodeProto& simple(const Program::Equation& e, const std::string& op) {
    std::vector<std::string> inputs;
    for (const Program::Operand& o : e.inputs) inputs.push_back(use(o));
    return simple(e, op, inputs);
  }
  // The images operand (N, H, W, C), channels first, with H, W and C fixed.
  std::string image_nchw(const Program::Equation& e) {
    const Program::Operand& x = e.inputs[0];
    if (shape(x).size() != 4) refuse(e, "of " + shape_str(shape(x)) + ": images are (N, H, W, C)");
    for (std::size_t k = 1; k < 4; ++k)
      if (dynamic(x, k)) refuse(e, "of images whose axis " + std::to_string(k) + " depends on the number of examples");
    return transposed(x, {0, 3, 1, 2});
  }
  // Ends an image op: its channels-first result is the value, channels last, pending.
  void image_result(const Program::Equation& e, const std::string& nchw, bool relu) {
    std::string y = nchw;
    if (relu) {
      y = fresh("relu");
      g_.node("Relu", {nchw}, y);
    }
    set_pending(e.outputs[0], e, y, {0, 2, 3, 1});
  }

  void conv2d(const Program::Equation& e) {
    const core::Primitive& p = *e.primitive;
    const std::string x = image_nchw(e);
    const Shape& xs = shape(e.inputs[0]);
    const Shape& ws = shape(e.inputs[1]);
    const Ints strides{int_attribute(p, "stride_h"), int_attribute(p, "stride_w")};
    Ints pads{0, 0, 0, 0};
    if (int_attribute(p, "same") != 0) {
      auto [top, bottom] = same_pads(xs[1], ws[0], strides[0]);
      auto [left, right] = same_pads(xs[2], ws[1], strides[1]);
      pads = {top, left, bottom, right};
    }
    std::vector<std::string> inputs{x, transposed(e.inputs[1], {3, 2, 0, 1})};  // (KH, KW, I, O) -> (O, I, KH, KW)
    if (int_attribute(p, "bias") != 0) inputs.push_back(use(e.inputs[2]));
    const std::string y = fresh("conv");
    proto::NodeProto& n = g_.node("Conv", inputs, y);
    Graph::ints(n, "kernel_shape", {ws[0], ws[1]});
    Graph::ints(n, "strides", strides);
    Graph::ints(n, "pads", pads);
    image_result(e, y, int_attribute(p, "relu") != 0);
  }

  void pool(const Program::Equation& e, bool max) {
    const core::Primitive& p = *e.primitive;
    const std::string x = image_nchw(e);
    const Shape& xs = shape(e.inputs[0]);
    const Ints window{int_attribute(p, "window_h"), int_attribute(p, "window_w")};
    const Ints strides{int_attribute(p, "stride_h"), int_attribute(p, "stride_w")};
    Ints pads{0, 0, 0, 0};
    if (max && int_attribute(p, "same") != 0) {  // padding that never wins the max (ONNX pads MaxPool with -inf)
      auto [top, bottom] = same_pads(xs[1], window[0], strides[0]);
      auto [left, right] = same_pads(xs[2], window[1], strides[1]);
      pads = {top, left, bottom, right};
    }
    const std::string y = fresh(max ? "max_pool" : "avg_pool");
    proto::NodeProto& n = g_.node(max ? "MaxPool" : "AveragePool", {x}, y);
    Graph::ints(n, "kernel_shape", window);
    Graph::ints(n, "strides", strides);
    Graph::ints(n, "pads", pads);
    image_result(e, y, false);
  }

  // sum, mean or max over `axes` of operand 0 (all of them when empty).
  void reduce(const Program::Equation& e, const std::string& kind, Ints axes, bool keepdims) {
    const Program::Operand& x = e.inputs[0];
    const auto rank = static_cast<std::int64_t>(shape(x).size());
    if (rank == 0) {  // of one element: itself
      set(e.outputs[0], use(x));
      return;
    }
    if (axes.empty())
      for (std::int64_t k = 0; k < rank; ++k) axes.push_back(k);
    for (std::int64_t& a : axes) a = a < 0 ? a + rank : a;
    std::string source;
    Ints perm;  // x = source transposed by perm
    if (!x.constant) {
      if (auto it = pending_.find(names_[x.index]); it != pending_.end()) {
        source = it->second.source;
        perm = it->second.perm;
      }
    }
    if (source.empty()) {
      source = use(x);
      perm.resize(static_cast<std::size_t>(rank));
      std::iota(perm.begin(), perm.end(), 0);
    }
    Ints source_axes;
    for (std::int64_t a : axes) source_axes.push_back(perm[static_cast<std::size_t>(a)]);
    std::sort(source_axes.begin(), source_axes.end());
    const std::string y = fresh("reduce_" + kind);
    const std::string op = kind == "sum" ? "ReduceSum" : kind == "mean" ? "ReduceMean" : "ReduceMax";
    proto::NodeProto& n = op == "ReduceSum" ? g_.node(op, {source, g_.int64s(y + "_axes", source_axes)}, y)
                                            : g_.node(op, {source}, y);
    if (op != "ReduceSum") Graph::ints(n, "axes", source_axes);
    Graph::integer(n, "keepdims", keepdims ? 1 : 0);
    if (keepdims) {
      set_pending(e.outputs[0], e, y, perm);
      return;
    }
    // The kept axes of x, in x's order, are source axes `kept`; y holds them in source order.
    Ints kept;
    for (std::int64_t k = 0; k < rank; ++k)
      if (std::find(axes.begin(), axes.end(), k) == axes.end()) kept.push_back(perm[static_cast<std::size_t>(k)]);
    Ints sorted = kept, order;
    std::sort(sorted.begin(), sorted.end());
    for (std::int64_t s : kept) order.push_back(std::find(sorted.begin(), sorted.end(), s) - sorted.begin());
    set_pending(e.outputs[0], e, y, order);
  }

  void reshape(const Program::Equation& e) {
    const Program::Operand& x = e.inputs[0];
    const std::size_t v = e.outputs[0];
    const Shape& to = a_.values()[v].shape;
    if (to == shape(x) && (x.constant || dynamic_[x.index] == dynamic_[v])) {
      set(v, use(x));  // a copy (ops::copy, inference's dropout)
      return;
    }
    Ints target(to.begin(), to.end());
    int free = 0;
    for (std::size_t k = 0; k < to.size(); ++k) {
      if (!dynamic_[v][k]) continue;
      target[k] = -1;
      ++free;
    }
    if (free > 1)
      refuse(e, "to " + shape_str(to) + " splits the examples over several axes; the exported graph takes any "
                "number of examples");
    simple(e, "Reshape", {use(x), g_.int64s(fresh("shape"), target)});
  }

  void broadcast_to(const Program::Equation& e) {
    const Program::Operand& x = e.inputs[0];
    const std::size_t v = e.outputs[0];
    const Shape& to = a_.values()[v].shape;
    const Shape& from = shape(x);
    Ints target(to.begin(), to.end());
    const std::size_t lead = to.size() - from.size();
    for (std::size_t k = 0; k < to.size(); ++k) {
      if (!dynamic_[v][k]) continue;
      if (k < lead || !dynamic(x, k - lead))
        refuse(e, "to " + shape_str(to) + " repeats a value over the examples; the exported graph takes any number "
                  "of examples");
      target[k] = 1;  // Expand keeps the operand's own size there
    }
    simple(e, "Expand", {use(x), g_.int64s(fresh("shape"), target)});
  }

  void slice(const Program::Equation& e) {
    const core::Primitive& p = *e.primitive;
    const Program::Operand& x = e.inputs[0];
    const Ints start = ints_attribute(p, "start"), stop = ints_attribute(p, "stop");
    const Ints stop_b = ints_attribute(*b_.equations()[equation_index(e)].primitive, "stop");
    const Shape& xs = shape(x);
    const Shape& xs_b = x.constant ? xs : b_.values()[x.index].shape;
    Ints starts, ends, axes;
    for (std::size_t k = 0; k < xs.size(); ++k) {
      const bool whole = start[k] == 0 && stop[k] == xs[k] && stop_b[k] == xs_b[k];  // at both records
      if (dynamic(x, k) && !whole) refuse(e, "of part of the examples; the exported graph takes any number of them");
      if (stop[k] != stop_b[k] && !dynamic(x, k)) refuse(e, "'s end depends on the number of examples");
      if (whole) continue;
      starts.push_back(start[k]);
      ends.push_back(stop[k]);
      axes.push_back(static_cast<std::int64_t>(k));
    }
    if (axes.empty()) {
      set(e.outputs[0], use(x));
      return;
    }
    simple(e, "Slice",
           {use(x), g_.int64s(fresh("starts"), starts), g_.int64s(fresh("ends"), ends),
            g_.int64s(fresh("axes"), axes)});
  }

  void batch_norm(const Program::Equation& e) {
    const core::Primitive& p = *e.primitive;
    if (int_attribute(p, "train") != 0)
      refuse(e, "in training mode has no ONNX form: export the inference function (train::Call{.train = false})");
    const bool gamma = int_attribute(p, "gamma") != 0, beta = int_attribute(p, "beta") != 0;
    const Program::Operand& x = e.inputs[0];
    const Program::Operand& mean = e.inputs[e.inputs.size() - 2];
    const Program::Operand& variance = e.inputs[e.inputs.size() - 1];
    const Shape& xs = shape(x);
    const std::int64_t channels = xs.empty() ? 0 : xs.back();
    if (xs.size() < 2 || dynamic(x, xs.size() - 1)) refuse(e, "of " + shape_str(xs) + ": x is (..., C)");
    const auto c = static_cast<std::size_t>(channels);
    const std::string scale = gamma ? use(e.inputs[1]) : g_.floats(fresh("ones"), std::vector<float>(c, 1.0f));
    const std::string bias =
        beta ? use(e.inputs[gamma ? 2 : 1]) : g_.floats(fresh("zeros"), std::vector<float>(c, 0.0f));
    // ONNX normalizes axis 1: the channels move there and back.
    const auto rank = static_cast<std::int64_t>(xs.size());
    Ints to_first{0, rank - 1}, back{0};
    for (std::int64_t k = 1; k < rank - 1; ++k) to_first.push_back(k);
    for (std::int64_t k = 2; k < rank; ++k) back.push_back(k);
    back.push_back(1);
    const std::string in = transposed(x, to_first);
    std::string y = fresh("batch_norm");
    Graph::real(g_.node("BatchNormalization", {in, scale, bias, use(mean), use(variance)}, y), "epsilon",
                float_attribute(p, "epsilon"));
    if (int_attribute(p, "relu") != 0) {
      const std::string r = fresh("relu");
      g_.node("Relu", {y}, r);
      y = r;
    }
    set_pending(e.outputs[0], e, y, back);
    // Inference leaves the moving statistics as they came; the statistics used (the VJP's) have no ONNX form.
    if (e.outputs.size() > 2) {
      set(e.outputs[1], use(mean));
      set(e.outputs[2], use(variance));
    }
    for (std::size_t k = 3; k < e.outputs.size(); ++k)
      set(e.outputs[k], "!batch_norm's statistics output has no ONNX form");
  }

  void equation(const Program::Equation& e) {
    const core::Primitive& p = *e.primitive;
    const std::string name = base_name(p.name());
    static const std::map<std::string, std::string> unary = {
        {"negative", "Neg"}, {"abs", "Abs"},   {"sqrt", "Sqrt"},       {"exp", "Exp"},
        {"log", "Log"},      {"relu", "Relu"}, {"sigmoid", "Sigmoid"}, {"tanh", "Tanh"}};
    static const std::map<std::string, std::string> binary = {{"add", "Add"},      {"subtract", "Sub"},
                                                              {"multiply", "Mul"}, {"divide", "Div"},
                                                              {"maximum", "Max"},  {"minimum", "Min"}};
    if (auto u = unary.find(name); u != unary.end() && e.inputs.size() == 1) {
      simple(e, u->second);
    } else if (auto b = binary.find(name); b != binary.end() && e.inputs.size() == 2) {
      // b is a's shape, its trailing axes, or one element: the result has a's shape, so a one-element b of more
      // axes than a becomes a scalar (ONNX would broadcast a up to b's rank).
      std::string rhs = use(e.inputs[1]);
      if (shape(e.inputs[1]).size() > shape(e.inputs[0]).size()) {
        const std::string scalar = fresh("scalar");
        g_.node("Reshape", {rhs, g_.int64s(fresh("shape"), {})}, scalar);
        rhs = scalar;
      }
      simple(e, b->second, {use(e.inputs[0]), rhs});
    } else if (name == "square") {
      const std::string x = use(e.inputs[0]);
      simple(e, "Mul", {x, x});
    } else if (name == "scale") {
      const float factor = float_attribute(p, "factor"), offset = float_attribute(p, "offset");
      if (offset == 0.0f) {
        simple(e, "Mul", {use(e.inputs[0]), g_.scalar(fresh("factor"), factor)});
      } else {
        const std::string scaled = fresh("scaled");
        g_.node("Mul", {use(e.inputs[0]), g_.scalar(fresh("factor"), factor)}, scaled);
        simple(e, "Add", {scaled, g_.scalar(fresh("offset"), offset)});
      }
    } else if (name == "conv2d") {
      conv2d(e);
    } else if (name == "avg_pool" || name == "max_pool") {
      pool(e, name == "max_pool");
    } else if ((name == "sum" || name == "mean" || name == "max") && e.inputs.size() == 1) {
      const core::Attributes attributes = p.attributes();
      const core::Attribute* axes = core::find_attribute(attributes, "axes");
      if (axes != nullptr && ints_attribute(p, "axes").empty()) {
        set(e.outputs[0], use(e.inputs[0]));  // over no axis: a copy
      } else if (axes != nullptr) {
        reduce(e, name, ints_attribute(p, "axes"), int_attribute(p, "keepdims") != 0);
      } else {
        reduce(e, name, {}, false);
      }
    } else if (name == "sum_rows" || name == "mean_rows") {
      reduce(e, name.substr(0, name.find('_')), {0}, false);
    } else if (name == "transpose") {
      set_pending(e.outputs[0], e, use(e.inputs[0]), ints_attribute(p, "permutation"));
    } else if (name == "reshape") {
      reshape(e);
    } else if (name == "broadcast_to") {
      broadcast_to(e);
    } else if (name == "slice") {
      slice(e);
    } else if (name == "concatenate") {
      auto axis = int_attribute(p, "axis");
      if (axis < 0) axis += static_cast<std::int64_t>(shape(e.inputs[0]).size());
      Graph::integer(simple(e, "Concat"), "axis", axis);
    } else if (name == "softmax" || name == "log_softmax") {
      Graph::integer(simple(e, name == "softmax" ? "Softmax" : "LogSoftmax"), "axis", -1);
    } else if (name == "stop_gradient") {
      set(e.outputs[0], use(e.inputs[0]));
    } else if (name == "argmax") {
      const std::string index = fresh("argmax");
      proto::NodeProto& n = g_.node("ArgMax", {use(e.inputs[0])}, index);
      Graph::integer(n, "axis", -1);
      Graph::integer(n, "keepdims", 0);
      Graph::integer(simple(e, "Cast", {index}), "to", proto::TensorProto::INT32);  // pmapcc's indices are i32
    } else if (name == "matmul") {
      if (int_attribute(p, "transpose_a") != 0)
        refuse(e, "with transpose_a (a gradient's product) has no ONNX emitter");
      const std::string rhs =
          int_attribute(p, "transpose_b") != 0 ? transposed(e.inputs[1], {1, 0}) : use(e.inputs[1]);
      simple(e, "MatMul", {use(e.inputs[0]), rhs});
    } else if (name == "linear") {
      const std::string product = fresh("matmul");
      g_.node("MatMul", {use(e.inputs[0]), use(e.inputs[1])}, product);
      if (int_attribute(p, "relu") != 0) {
        const std::string sum = fresh("add");
        g_.node("Add", {product, use(e.inputs[2])}, sum);
        simple(e, "Relu", {sum});
      } else {
        simple(e, "Add", {product, use(e.inputs[2])});
      }
    } else if (name == "batch_norm") {
      batch_norm(e);
    } else if (name == "dropout") {
      refuse(e, "runs in training only: export the inference function (train::Call{.train = false})");
    } else if (name.starts_with("vmap")) {
      refuse(e, "(a call batched over members by vmap) has no ONNX emitter: export one member's function");
    } else if (name == "psum" || name == "pmean" || name == "pmax" || name == "pmin" || name == "all_gather" ||
               name == "psum_scatter" || name == "ppermute" || name == "all_to_all") {
      refuse(e, "is a collective, which has no ONNX form: export one device's function of whole tensors");
    } else {
      refuse(e, "has no ONNX emitter");
    }
  }

  Graph& g_;
  const Program& a_;
  const Program& b_;
  std::string prefix_, where_;
  std::vector<std::vector<bool>> dynamic_;       // per value, per axis: depends on the number of examples
  std::vector<std::string> names_;               // per value: its tensor ("!why": none can be made)
  std::map<std::string, Pending> pending_;       // values that are a transpose not yet emitted
  std::map<std::pair<std::string, Ints>, std::string> transposes_;  // transposes emitted, by source and perm
  std::map<std::size_t, std::string> constants_;  // the constants' initializers
  int serial_ = 0;
};

// ---- the members ------------------------------------------------------------------------------------------------

// A member's function recorded on `batch` zero images: inputs its variables in name order, then the images.
Program record(const Network& net, const train::Variables& member, std::int64_t batch, const std::string& where) {
  Shape shape{batch};
  shape.insert(shape.end(), net.input.begin(), net.input.end());
  const Device device = member.empty() ? Device{} : member.begin()->second.device();
  Array images(shape, DType::f32, device);
  images.fill_zero();
  std::vector<const Array*> inputs;
  std::vector<std::string> names;
  for (const auto& [name, tensor] : member) {
    if (!tensor.valid())
      throw ValueError("onnx export: " + where + "'s variable '" + name + "' is an empty Array handle");
    if (name.empty() || name.front() == '%')
      throw ValueError("onnx export: " + where + "'s variable '" + name + "': a name must not be empty or start "
                       "with '%' (the exporter's own names do)");
    if (tensor.dtype() != DType::f32)
      throw ValueError("onnx export: " + where + "'s variable '" + name + "' is " + tensor.signature() + ", not f32");
    if (tensor.device() != device)
      throw ValueError("onnx export: " + where + "'s variable '" + name + "' is on " + tensor.device().str() + ", '" +
                       member.begin()->first + "' on " + device.str());
    inputs.push_back(&tensor);
    names.push_back(name);
  }
  inputs.push_back(&images);
  Program p = core::make_program(net.name, inputs, [&](const std::vector<Array>& in) {
    train::Variables vars;
    for (std::size_t i = 0; i < names.size(); ++i) vars.emplace(names[i], vmap_detail::alias(in[i]));
    std::vector<Array> out;
    out.push_back(net.logits(vars, in.back()));
    return out;
  });
  return p;
}

struct Emitted {
  std::string logits;
  std::int64_t classes = 0;
};

// Member `where`'s network added to g under `prefix`, reading the graph input "images": its logits tensor.
Emitted add_member(proto::GraphProto& proto_graph, const Network& net, const train::Variables& member,
                   const std::string& prefix, const std::string& where) {
  if (!net.logits) throw ValueError("onnx export: network '" + net.name + "' has no logits function");
  const Program a = record(net, member, kBatchA, where);
  const Program b = record(net, member, kBatchB, where);
  const Program::Value* logits = a.outputs()[0].constant ? nullptr : &a.values()[a.outputs()[0].index];
  const Program::Value* logits_b = b.outputs()[0].constant ? nullptr : &b.values()[b.outputs()[0].index];
  if (logits == nullptr || logits_b == nullptr || logits->shape.size() != 2 || logits->shape[0] != kBatchA ||
      logits_b->shape[0] != kBatchB || logits->dtype != DType::f32)
    throw ValueError("onnx export: " + where + ": the logits must be (N, classes) f32 of the N images, got " +
                     (logits ? std::string(pmap::name(logits->dtype)) + shape_str(logits->shape)
                             : std::string("a constant")) +
                     " for " + std::to_string(kBatchA) + " images");
  Graph g(proto_graph);
  std::vector<std::string> inputs;
  for (const auto& [name, tensor] : member)
    inputs.push_back(g.initializer(prefix + name, tensor, where + "'s variable '" + name + "'"));
  inputs.push_back("images");
  Member m(g, a, b, prefix, where);
  return {m.emit(inputs).at(0), logits->shape[1]};
}

proto::ValueInfoProto& value_info(proto::ValueInfoProto& v, const std::string& name, int dtype, const Ints& dims) {
  v.set_name(name);
  proto::TypeProto_Tensor& t = *v.mutable_type()->mutable_tensor_type();
  t.set_elem_type(dtype);
  proto::TensorShapeProto& s = *t.mutable_shape();
  s.add_dim()->set_dim_param("N");  // any number of examples
  for (std::int64_t d : dims) s.add_dim()->set_dim_value(d);
  return v;
}

// A model with its graph's input; the outputs and nodes are the caller's.
proto::ModelProto new_model(const Network& net, const ExportInfo& info, const std::string& graph_name) {
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
  value_info(*g.add_input(), "images", proto::TensorProto::FLOAT, Ints(net.input.begin(), net.input.end()));
  return model;
}

void write(const proto::ModelProto& model, const std::filesystem::path& path) {
  std::string bytes;
  if (!model.SerializeToString(&bytes)) throw Error("onnx export: " + path.string() + ": the model did not serialize");
  io::write_file_atomically(path, bytes);
}

}  // namespace

void export_ensemble(const Network& network, const std::vector<train::Variables>& members,
                     const std::filesystem::path& path, const ExportInfo& info) {
  if (members.empty()) throw ValueError("onnx export: needs at least one member, got none");
  proto::ModelProto model = new_model(network, info, network.name + "-ensemble-of-" + std::to_string(members.size()));
  proto::GraphProto& g = *model.mutable_graph();
  Graph b(g);
  std::vector<std::string> probabilities;
  std::int64_t classes = -1;
  for (std::size_t m = 0; m < members.size(); ++m) {
    const std::string prefix = "member_" + std::to_string(m) + "/";
    const Emitted e = add_member(g, network, members[m], prefix, "member " + std::to_string(m));
    if (classes >= 0 && e.classes != classes)
      throw ValueError("onnx export: member " + std::to_string(m) + " gives " + std::to_string(e.classes) +
                       " classes, member 0 " + std::to_string(classes));
    classes = e.classes;
    Graph::integer(b.node("Softmax", {e.logits}, prefix + "probabilities"), "axis", -1);
    probabilities.push_back(prefix + "probabilities");
  }
  b.node("Mean", probabilities, "probabilities");
  proto::NodeProto& argmax = b.node("ArgMax", {"probabilities"}, "class");
  Graph::integer(argmax, "axis", 1);
  Graph::integer(argmax, "keepdims", 0);
  value_info(*g.add_output(), "probabilities", proto::TensorProto::FLOAT, {classes});
  value_info(*g.add_output(), "class", proto::TensorProto::INT64, {});
  write(model, path);
}

void export_member(const Network& network, const train::Variables& member, const std::filesystem::path& path,
                   const ExportInfo& info) {
  proto::ModelProto model = new_model(network, info, network.name + "-member");
  proto::GraphProto& g = *model.mutable_graph();
  Graph b(g);
  const Emitted e = add_member(g, network, member, "", "the member");
  b.node("Identity", {e.logits}, "logits");
  Graph::integer(b.node("Softmax", {"logits"}, "probabilities"), "axis", -1);
  value_info(*g.add_output(), "logits", proto::TensorProto::FLOAT, {e.classes});
  value_info(*g.add_output(), "probabilities", proto::TensorProto::FLOAT, {e.classes});
  write(model, path);
}

void check_exportable(const Network& network, const train::Variables& member) {
  proto::ModelProto model = new_model(network, {}, network.name);
  add_member(*model.mutable_graph(), network, member, "", "the member");
}

Network network_of(const train::Model& model) {
  return {model.name(), model.input_shape(), [model](const train::Variables& v, const Array& images) {
            train::Variables params, state;
            for (const auto& [name, tensor] : v) {
              if (name.starts_with("params/")) {
                params.emplace(name.substr(7), vmap_detail::alias(tensor));
              } else if (name.starts_with("state/")) {
                state.emplace(name.substr(6), vmap_detail::alias(tensor));
              } else {
                throw ValueError("onnx export: variable '" + name + "' is neither params/... nor state/...");
              }
            }
            return model.apply(params, state, images, train::Call{}).first;
          }};
}

std::vector<train::Variables> members_of(const train::Model& model, const train::Variables& params,
                                         const train::Variables& state) {
  std::int64_t members = -1;
  std::string first;
  auto rows = [&](const std::string& role, const train::Variables& v, const std::vector<std::string>& names) {
    if (v.size() != names.size())
      throw ValueError("onnx export: " + std::to_string(v.size()) + " " + role + " tensors given, model " +
                       model.name() + " has " + std::to_string(names.size()));
    for (const std::string& n : names) {
      auto it = v.find(n);
      if (it == v.end()) throw ValueError("onnx export: no " + role + " tensor '" + n + "' of model " + model.name());
      if (it->second.ndim() < 1)
        throw ValueError("onnx export: " + role + " tensor '" + n + "' is " + it->second.signature() +
                         ", not (members, ...)");
      if (members < 0) {
        members = it->second.dim(0);
        first = n;
      } else if (it->second.dim(0) != members) {
        throw ValueError("onnx export: " + role + " tensor '" + n + "' is " + it->second.signature() + ", '" + first +
                         "' holds " + std::to_string(members) + " members");
      }
    }
  };
  rows("params", params, model.param_names());
  rows("state", state, model.state_names());
  if (members < 1) throw ValueError("onnx export: no member to export");
  std::vector<train::Variables> out(static_cast<std::size_t>(members));
  auto split = [&](const std::string& role, const train::Variables& v) {
    for (const auto& [name, stacked] : v) {
      Shape one(stacked.shape().begin() + 1, stacked.shape().end());
      for (std::int64_t m = 0; m < members; ++m)
        out[static_cast<std::size_t>(m)].emplace(role + "/" + name,
                                                 stacked.slice_rows(m, m + 1, Device{}).reshape(one));
    }
  };
  split("params", params);
  split("state", state);
  return out;
}

}  // namespace pmap::onnx
