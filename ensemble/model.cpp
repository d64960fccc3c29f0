// Sequential's parameter layout and initialization, and the reference CNN.
#include <pmapcc/ensemble/model.h>

#include <algorithm>
#include <cmath>

#include <pmap/array.h>
#include <pmap/error.h>
#include <pmapcc/train/model.h>

namespace pmap::ensemble {
namespace {
// Flax's lecun_normal uses a truncated normal on [-2, 2] scaled so the variance is 1/fan_in: the
// standard deviation of a unit normal truncated to [-2, 2] is 0.87962566103423978.
constexpr double kTruncatedStd = 0.87962566103423978;
}  // namespace

namespace {

void add_tensors(TensorLayout& layout, const Layer& layer, int index, const std::vector<ParamSpec>& specs) {
  int k = 0;
  for (const auto& spec : specs) {
    layout.tensors.push_back(TensorSlot{layer.name() + "/" + spec.name, spec.shape, layout.per_member,
                                        product(spec.shape), spec.fan_in, spec.is_bias, index, k++, spec.fan_out,
                                        spec.init});
    layout.per_member += product(spec.shape);
  }
}

Init resolved(const TensorSlot& s) {
  if (s.init != Init::automatic) return s.init;
  return s.is_bias ? Init::zeros : Init::lecun_normal;
}

}  // namespace

Sequential::Sequential(Dims input, std::vector<std::unique_ptr<Layer>> layers, std::string name)
    : name_(std::move(name)), input_(std::move(input)), layers_(std::move(layers)) {
  if (layers_.empty()) throw ValueError("Sequential: no layers");
  shapes_.push_back(input_);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    add_tensors(params_, layer, static_cast<int>(i), layer.params(shapes_.back()));
    add_tensors(state_, layer, static_cast<int>(i), layer.state(shapes_.back()));
    shapes_.push_back(layer.output_shape(shapes_.back()));
  }
  // Every member reads the one input batch: the layers up to the first with parameters must keep it one.
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]->params(shapes_[i]).empty()) {
      if (layers_[i]->reads_shared()) return;
      throw ValueError("Sequential: " + layers_[i]->name() + " (" + layers_[i]->describe() +
                       ") is the first layer with parameters and cannot read the batch that every member shares: "
                       "put a Conv2D or Dense before it");
    }
    if (!layers_[i]->keeps_shared())
      throw ValueError("Sequential: " + layers_[i]->name() + " (" + layers_[i]->describe() +
                       ") comes before the first layer with parameters: the layers before it must keep the batch "
                       "that every member shares (a Rescaling may; put a Conv2D or Dense first)");
  }
  throw ValueError("Sequential: no layer has parameters");
}

void Sequential::init(std::span<const Key> keys, std::span<float> params) const {
  const std::int64_t m = static_cast<std::int64_t>(keys.size());
  if (static_cast<std::int64_t>(params.size()) != m * params_.per_member)
    throw ShapeError("Sequential::init: buffer holds " + std::to_string(params.size()) + " floats, " +
                     std::to_string(m) + " members need " + std::to_string(m * params_.per_member));
  for (std::size_t t = 0; t < params_.tensors.size(); ++t) {
    const TensorSlot& s = params_.tensors[t];
    for (std::int64_t j = 0; j < m; ++j) {
      std::span<float> out = params.subspan(static_cast<std::size_t>(s.offset * m + j * s.size),
                                            static_cast<std::size_t>(s.size));
      const Key k = fold_in(keys[static_cast<std::size_t>(j)], static_cast<std::uint32_t>(t));
      switch (resolved(s)) {
        case Init::zeros:
        case Init::ones:
          std::fill(out.begin(), out.end(), resolved(s) == Init::ones ? 1.0f : 0.0f);
          break;
        case Init::glorot_uniform: {
          const double limit = std::sqrt(6.0 / static_cast<double>(s.fan_in + s.fan_out));
          uniform(k, out, static_cast<float>(-limit), static_cast<float>(limit));
          break;
        }
        default: {
          truncated_normal(k, out, -2.0f, 2.0f);
          const float scale = static_cast<float>(std::sqrt(1.0 / static_cast<double>(s.fan_in)) / kTruncatedStd);
          for (float& v : out) v *= scale;
        }
      }
    }
  }
}

std::vector<float> Sequential::init_state(std::int64_t members) const {
  std::vector<float> out(static_cast<std::size_t>(members * state_.per_member));
  for (const TensorSlot& s : state_.tensors)
    std::fill_n(out.begin() + s.offset * members, s.size * members, resolved(s) == Init::ones ? 1.0f : 0.0f);
  return out;
}

namespace {

std::string dims_text(const Dims& d) { return shape_str(d); }

}  // namespace

std::string Sequential::summary() const {
  std::vector<train::SummaryRow> rows;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::int64_t n = 0;
    for (const auto& spec : layers_[i]->params(shapes_[i])) n += product(spec.shape);
    for (const auto& spec : layers_[i]->state(shapes_[i])) n += product(spec.shape);
    Dims out{-1};
    out.insert(out.end(), shapes_[i + 1].begin(), shapes_[i + 1].end());
    std::string shape = dims_text(out);
    shape.replace(1, 2, "None");
    rows.push_back({layers_[i]->name() + " (" + layers_[i]->describe() + ")", shape, n});
  }
  return train::summary_table(name_, rows, params_.per_member, state_.per_member);
}

std::vector<std::string> Sequential::architecture() const {
  std::vector<std::string> out{dims_text(input_)};
  for (const auto& l : layers_) out.push_back(l->name() + "=" + l->describe());
  return out;
}

std::unique_ptr<Sequential> flax_mnist_cnn(Dims input, int classes) {
  std::vector<std::unique_ptr<Layer>> l;
  l.push_back(conv2d("Conv_0", 32));
  l.push_back(relu());
  l.push_back(avg_pool(2));
  l.push_back(conv2d("Conv_1", 64));
  l.push_back(relu());
  l.push_back(avg_pool(2));
  l.push_back(flatten());
  l.push_back(dense("Dense_0", 256));
  l.push_back(relu());
  l.push_back(dense("Dense_1", classes));
  return std::make_unique<Sequential>(std::move(input), std::move(l), "flax-cnn");
}

std::unique_ptr<Sequential> keras_convnet(Dims input, int classes) {
  const BatchNormOptions center_only{0.99f, 1e-3f, true, false};
  const Init glorot = Init::glorot_uniform;
  std::vector<std::unique_ptr<Layer>> l;
  l.push_back(conv2d("Conv_0", 12, Conv2dOptions{3, 1, kernels::Padding::same, false, glorot}));
  l.push_back(batch_norm("BatchNorm_0", center_only));
  l.push_back(relu());
  l.push_back(conv2d("Conv_1", 24, Conv2dOptions{6, 2, kernels::Padding::valid, false, glorot}));
  l.push_back(batch_norm("BatchNorm_1", center_only));
  l.push_back(relu());
  l.push_back(conv2d("large_k", 32, Conv2dOptions{6, 2, kernels::Padding::same, true, glorot}));
  l.push_back(batch_norm("BatchNorm_2", center_only));
  l.push_back(relu());
  l.push_back(global_avg_pool());
  l.push_back(dense("Dense_0", 256, glorot));
  l.push_back(relu());
  l.push_back(dropout("dropout", 0.5f));
  l.push_back(dense("Dense_1", classes, glorot));
  return std::make_unique<Sequential>(std::move(input), std::move(l), "keras-convnet");
}

namespace {

struct Registered {
  std::string name;
  std::unique_ptr<Sequential> (*make)(Dims, int);
  ModelRecipe recipe;
};

// The registry: one line per model.
const std::vector<Registered>& models() {
  static const std::vector<Registered> r{{"flax-cnn", flax_mnist_cnn, {"sgd", 128}},
                                         {"keras-convnet", keras_convnet, {"adam", 64}}};
  return r;
}

const Registered& registered(const std::string& name) {
  std::string names;
  for (const Registered& m : models()) {
    if (m.name == name) return m;
    names += (names.empty() ? "" : ", ") + m.name;
  }
  throw ValueError("--model must be one of " + names + ", got '" + name + "'");
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> out;
  for (const Registered& m : models()) out.push_back(m.name);
  return out;
}

ModelRecipe model_recipe(const std::string& name) { return registered(name).recipe; }

std::unique_ptr<Sequential> make_model(const std::string& name, Dims input, int classes) {
  return registered(name).make(std::move(input), classes);
}

}  // namespace pmap::ensemble
