#include <pmapcc/train/model.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>

#include <pmap/error.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/nn/layers.h>
#include <pmapcc/nn/normalization.h>
#include <pmapcc/nn/parallel.h>
#include <pmapcc/nn/summary.h>

namespace pmap::train {

Model::Model(std::string name, Shape input, int classes, std::vector<std::string> param_names,
             std::vector<std::string> state_names, Init init, Apply apply, int dropout_layers)
    : name_(std::move(name)), input_(std::move(input)), classes_(classes), param_names_(std::move(param_names)),
      state_names_(std::move(state_names)), init_(std::move(init)), apply_(std::move(apply)),
      dropout_layers_(dropout_layers) {
  if (input_.size() != 3 || input_[0] < 1 || input_[1] < 1 || input_[2] < 1)
    throw ValueError("Model '" + name_ + "': the input shape must be (H, W, C) with every size >= 1");
  if (classes_ < 2) throw ValueError("Model '" + name_ + "': classes must be >= 2, got " + std::to_string(classes_));
  if (param_names_.empty()) throw ValueError("Model '" + name_ + "' has no parameters");
  if (!init_ || !apply_) throw ValueError("Model '" + name_ + "': init and apply must be functions");
  if (dropout_layers_ < 0)
    throw ValueError("Model '" + name_ + "': dropout_layers must be >= 0, got " + std::to_string(dropout_layers_));
}

namespace {
void check_names(const std::string& model, const char* role, const Variables& got, std::vector<std::string> want) {
  std::vector<std::string> have;
  for (const auto& [name, a] : got) have.push_back(name);
  std::sort(want.begin(), want.end());
  if (have == want) return;
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& n : v) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? std::string("none") : out;
  };
  throw ValueError("Model '" + model + "': init made the " + role + " " + list(have) + ", not " + list(want));
}
}  // namespace

std::pair<Variables, Variables> Model::init(Key key, const Device& device) const {
  auto out = init_(key, device);
  check_names(name_, "parameters", out.first, param_names_);
  check_names(name_, "model state", out.second, state_names_);
  return out;
}

std::pair<Array, Variables> Model::apply(const Variables& params, const Variables& state, const Array& x,
                                         const Call& call) const {
  return apply_(params, state, x, call);
}

namespace {

namespace ops = pmap::ops;

struct CnnParams {
  nn::ConvParams Conv_0, Conv_1;
  nn::DenseParams Dense_0, Dense_1;
};
PMAPCC_TREE(CnnParams, Conv_0, Conv_1, Dense_0, Dense_1)

struct ConvnetParams {
  nn::ConvKernel Conv_0;
  nn::BatchNormCenter BatchNorm_0;
  nn::ConvKernel Conv_1;
  nn::BatchNormCenter BatchNorm_1;
  nn::ConvParams large_k;
  nn::BatchNormCenter BatchNorm_2;
  nn::DenseParams Dense_0, Dense_1;
};
PMAPCC_TREE(ConvnetParams, Conv_0, BatchNorm_0, Conv_1, BatchNorm_1, large_k, BatchNorm_2, Dense_0, Dense_1)

struct ConvnetState {
  nn::BatchNormState BatchNorm_0, BatchNorm_1, BatchNorm_2;
};
PMAPCC_TREE(ConvnetState, BatchNorm_0, BatchNorm_1, BatchNorm_2)

// 824458 as "824,458".
std::string grouped(std::int64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// "(3.15 MB)": n float32 values.
std::string bytes_text(std::int64_t n) {
  char buf[32];
  const double b = 4.0 * static_cast<double>(n);
  if (b >= 1024.0 * 1024.0) std::snprintf(buf, sizeof buf, "(%.2f MB)", b / (1024.0 * 1024.0));
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "(%.2f KB)", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "(%.2f B)", b);
  return buf;
}

std::string prefix_of(const std::string& name) {
  const std::size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(0, slash);
}

}  // namespace

std::string summary_table(const std::string& model, const std::vector<SummaryRow>& rows, std::int64_t trainable,
                          std::int64_t fixed) {
  std::vector<std::array<std::string, 3>> cells;
  for (const SummaryRow& r : rows) cells.push_back({r.layer, r.output, grouped(r.params)});
  std::array<std::size_t, 3> width{12, 12, 7};  // "Layer (type)", "Output Shape", "Param #"
  for (const auto& r : cells)
    for (std::size_t c = 0; c < 3; ++c) width[c] = std::max(width[c], r[c].size());
  auto line = [&] {
    std::string s = "+";
    for (std::size_t w : width) s += std::string(w + 2, '-') + "+";
    return s + "\n";
  };
  auto row = [&](const std::array<std::string, 3>& r) {
    std::string s = "|";
    for (std::size_t c = 0; c < 3; ++c) {
      const std::string pad(width[c] - r[c].size(), ' ');
      s += " " + (c == 2 ? pad + r[c] : r[c] + pad) + " |";
    }
    return s + "\n";
  };
  std::string out = "Model: \"" + model + "\"\n" + line() + row({"Layer (type)", "Output Shape", "Param #"}) + line();
  for (const auto& r : cells) out += row(r);
  out += line();
  out += " Total params: " + grouped(trainable + fixed) + " " + bytes_text(trainable + fixed) + "\n";
  out += " Trainable params: " + grouped(trainable) + " " + bytes_text(trainable) + "\n";
  out += " Non-trainable params: " + grouped(fixed) + " " + bytes_text(fixed) + "\n";
  return out;
}

// One inference apply on one image of zeros (on the host), each nn/ module call a row (summary()'s).
struct Model::Rows {
  std::vector<SummaryRow> rows;
  std::vector<std::string> records;  // each row's "name=description" (architecture())
  std::int64_t trainable = 0, fixed = 0;
};

Model::Rows Model::summary_rows() const {
  const auto [params, state] = init(key(0));
  struct Tensor {
    std::string name;
    std::int64_t size = 0;
  };
  // By storage: what a module call read (tensors of no element have none, and no row counts them).
  std::map<const void*, std::vector<Tensor>> tensors;
  std::int64_t trainable = 0, fixed = 0;
  for (const auto& [name, a] : params) {
    if (a.size() > 0) tensors[a.raw_data()].push_back({name, a.size()});
    trainable += a.size();
  }
  for (const auto& [name, a] : state) {
    if (a.size() > 0) tensors[a.raw_data()].push_back({name, a.size()});
    fixed += a.size();
  }
  Shape shape{1};
  shape.insert(shape.end(), input_.begin(), input_.end());
  const Array x = Array::from_host(std::vector<float>(static_cast<std::size_t>(input_[0] * input_[1] * input_[2])),
                                   shape);  // one image of zeros
  std::vector<SummaryRow> rows;
  std::vector<std::string> records;
  std::set<std::string> read;
  {
    nn::ModuleRecorder recorder;
    apply(params, state, x, Call{});
    for (const nn::ModuleCall& call : recorder.calls()) {
      SummaryRow r;
      std::set<std::string> prefixes;
      for (const void* t : call.tensors) {
        const auto it = tensors.find(t);
        if (it == tensors.end()) continue;  // not one of the model's tensors (one made inside apply)
        r.params += it->second.front().size;
        for (const Tensor& named : it->second) {  // tensors sharing storage: each name is read
          prefixes.insert(prefix_of(named.name));
          read.insert(named.name);
        }
      }
      std::string name;
      for (const std::string& p : prefixes) name += (name.empty() ? "" : "+") + p;
      if (name.empty())
        for (const char c : call.kind) name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.layer = name + " (" + call.description + ")";
      records.push_back(name + "=" + call.description);
      std::string out = "(None";
      for (std::size_t d = 1; d < call.output.size(); ++d) out += ", " + std::to_string(call.output[d]);
      r.output = out + ")";
      rows.push_back(std::move(r));
    }
  }
  std::map<std::string, std::int64_t> unread;  // by prefix, in name order
  for (const auto& [storage, named] : tensors)
    for (const Tensor& t : named)
      if (!read.contains(t.name)) unread[prefix_of(t.name)] += t.size;
  for (const auto& [prefix, n] : unread) {
    rows.push_back({prefix + " (not read by a module)", "", n});
    records.push_back(prefix + "=not read by a module");
  }
  return {std::move(rows), std::move(records), trainable, fixed};
}

std::string Model::summary() const {
  const Rows r = summary_rows();
  return summary_table(name_, r.rows, r.trainable, r.fixed);
}

std::vector<std::string> Model::architecture() const {
  std::string input = "(";
  for (std::size_t d = 0; d < input_.size(); ++d) input += (d ? ", " : "") + std::to_string(input_[d]);
  std::vector<std::string> out{input + ")"};
  for (std::string& record : summary_rows().records) out.push_back(std::move(record));
  return out;
}

Model flax_cnn(Shape input, int classes) {
  if (input.size() != 3) throw ValueError("flax_cnn: the input shape must be (H, W, C)");
  const nn::Conv conv0{.features = 32}, conv1{.features = 64};
  const nn::Dense dense0{.features = 256}, dense1{.features = classes};
  const std::int64_t flat = (input[0] / 2 / 2) * (input[1] / 2 / 2) * 64, channels = input[2];
  if (flat < 64) throw ValueError("flax_cnn: images of " + std::to_string(input[0]) + "x" + std::to_string(input[1]) +
                                  " are too small for its two 2x2 poolings");
  return make_model<CnnParams>(
      "flax-cnn", input, classes,
      [=](Key key, const Device& d) {  // tensor t from fold_in(key, t); biases (odd t) zero
        return std::pair{CnnParams{conv0.init(fold_in(key, 0), channels, d), conv1.init(fold_in(key, 2), 32, d),
                                   dense0.init(fold_in(key, 4), flat, d), dense1.init(fold_in(key, 6), 256, d)},
                         NoState{}};
      },
      [=](const CnnParams& p, const NoState& s, const Array& x, const Call& call) {
        const nn::TensorParallel tp(call.sharding);  // whole layers without one
        nn::Features h = tp.conv(conv0, p.Conv_0, "Conv_0", nn::features(x), /*relu=*/true);
        h.value = ops::avg_pool(h.value, 2, 2, 2, 2);
        h = tp.conv(conv1, p.Conv_1, "Conv_1", h, /*relu=*/true);
        h.value = ops::avg_pool(h.value, 2, 2, 2, 2);
        const Array image = tp.whole(h, "Flatten");  // Flatten mixes the channels: whole
        h = tp.dense(dense0, p.Dense_0, "Dense_0", {ops::reshape(image, {image.dim(0), image.size() / image.dim(0)})},
                     /*relu=*/true);
        return std::pair{tp.whole(tp.dense(dense1, p.Dense_1, "Dense_1", h), "the logits"), s};
      });
}

Model keras_convnet(Shape input, int classes, float dropout) {
  if (input.size() != 3) throw ValueError("keras_convnet: the input shape must be (H, W, C)");
  if (input[0] < 6 || input[1] < 6)
    throw ValueError("keras_convnet: images of " + std::to_string(input[0]) + "x" + std::to_string(input[1]) +
                     " are smaller than its 6x6 valid convolution");
  constexpr auto glorot = nn::Init::glorot_uniform;
  const nn::Conv conv0{.features = 12, .kernel_init = glorot};
  const nn::Conv conv1{.features = 24, .kernel_h = 6, .kernel_w = 6, .stride_h = 2, .stride_w = 2, .same = false,
                       .kernel_init = glorot};
  const nn::Conv large_k{.features = 32, .kernel_h = 6, .kernel_w = 6, .stride_h = 2, .stride_w = 2,
                         .kernel_init = glorot};
  const nn::BatchNorm bn{};  // center only, Keras's momentum and epsilon (apply adds the batch's axes)
  const nn::Dense dense0{.features = 256, .kernel_init = glorot}, dense1{.features = classes, .kernel_init = glorot};
  const nn::Dropout drop{.rate = dropout};
  const std::int64_t channels = input[2];
  return make_model<ConvnetParams, ConvnetState>(
      "keras-convnet", input, classes,
      [=](Key key, const Device& d) {  // tensor t (BatchNorm offsets counted) from fold_in(key, t)
        auto k = [&](std::uint32_t t) { return fold_in(key, t); };
        return std::pair{ConvnetParams{conv0.init_kernel(k(0), channels, d), bn.init_center(12, d),
                                       conv1.init_kernel(k(2), 12, d), bn.init_center(24, d),
                                       large_k.init(k(4), 24, d), bn.init_center(32, d), dense0.init(k(7), 32, d),
                                       dense1.init(k(9), 256, d)},
                         ConvnetState{bn.init_state(12, d), bn.init_state(24, d), bn.init_state(32, d)}};
      },
      [=](const ConvnetParams& p, const ConvnetState& s, const Array& x, const Call& call) {
        const nn::BatchNormCall bc{.train = call.train, .relu = true, .batch_examples = call.batch_examples};
        const nn::BatchNorm norm{.axis_name = call.batch_axis};
        const nn::TensorParallel tp(call.sharding);  // whole layers without one
        for (const char* n : {"BatchNorm_0/beta", "BatchNorm_1/beta", "BatchNorm_2/beta"})
          tp.require_whole(n, "BatchNormalization");
        auto [h0, s0] = norm(p.BatchNorm_0, s.BatchNorm_0,
                             tp.whole(tp.conv(conv0, p.Conv_0, "Conv_0", nn::features(x)), "BatchNorm_0"), bc);
        auto [h1, s1] = norm(p.BatchNorm_1, s.BatchNorm_1,
                             tp.whole(tp.conv(conv1, p.Conv_1, "Conv_1", nn::features(h0)), "BatchNorm_1"), bc);
        auto [h2, s2] = norm(p.BatchNorm_2, s.BatchNorm_2,
                             tp.whole(tp.conv(large_k, p.large_k, "large_k", nn::features(h1)), "BatchNorm_2"), bc);
        nn::Features h = tp.dense(dense0, p.Dense_0, "Dense_0", {ops::global_avg_pool(h2)}, /*relu=*/true);
        h = tp.on_whole(h, [&](const Array& v) {
          return drop(v, {.train = call.train, .rng = call.rng, .rate = call.dropout_rate});
        });
        return std::pair{tp.whole(tp.dense(dense1, p.Dense_1, "Dense_1", h), "the logits"),
                         ConvnetState{std::move(s0), std::move(s1), std::move(s2)}};
      },
      /*dropout_layers=*/1);
}

std::vector<std::string> model_names() { return {"flax-cnn", "keras-convnet"}; }

Model model_by_name(const std::string& name, Shape input, int classes, const char* what) {
  if (name == "flax-cnn") return flax_cnn(std::move(input), classes);
  if (name == "keras-convnet") return keras_convnet(std::move(input), classes);
  std::string names;
  for (const std::string& n : model_names()) names += (names.empty() ? "" : ", ") + n;
  throw ValueError(std::string(what) + " must be one of " + names + ", got '" + name + "'");
}

}  // namespace pmap::train
