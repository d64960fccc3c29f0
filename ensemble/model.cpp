// Sequential's parameter layout and initialization, and the reference CNN.
#include <pmapcc/ensemble/model.h>

#include <cmath>
#include <sstream>

#include <pmap/error.h>

namespace pmap::ensemble {
namespace {
// Flax's lecun_normal uses a truncated normal on [-2, 2] scaled so the variance is 1/fan_in: the
// standard deviation of a unit normal truncated to [-2, 2] is 0.87962566103423978.
constexpr double kTruncatedStd = 0.87962566103423978;
}  // namespace

Sequential::Sequential(Dims input, std::vector<std::unique_ptr<Layer>> layers)
    : input_(std::move(input)), layers_(std::move(layers)) {
  if (layers_.empty()) throw ValueError("Sequential: no layers");
  shapes_.push_back(input_);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    int k = 0;
    for (const auto& spec : layer.params(shapes_.back())) {
      tensors_.push_back(TensorSlot{layer.name() + "/" + spec.name, spec.shape, params_per_member_, product(spec.shape),
                                    spec.fan_in, spec.is_bias, static_cast<int>(i), k++});
      params_per_member_ += product(spec.shape);
    }
    shapes_.push_back(layer.output_shape(shapes_.back()));
  }
  if (layers_.front()->params(input_).empty())
    throw ValueError("Sequential: the first layer must be a Conv2D or Dense layer (it reads the shared batch)");
}

void Sequential::init(std::span<const Key> keys, std::span<float> params) const {
  const std::int64_t m = static_cast<std::int64_t>(keys.size());
  if (static_cast<std::int64_t>(params.size()) != m * params_per_member_)
    throw ShapeError("Sequential::init: buffer holds " + std::to_string(params.size()) + " floats, " +
                     std::to_string(m) + " members need " + std::to_string(m * params_per_member_));
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    const TensorSlot& s = tensors_[t];
    for (std::int64_t j = 0; j < m; ++j) {
      std::span<float> out = params.subspan(static_cast<std::size_t>(s.offset * m + j * s.size),
                                            static_cast<std::size_t>(s.size));
      if (s.is_bias) {
        std::fill(out.begin(), out.end(), 0.0f);
        continue;
      }
      truncated_normal(fold_in(keys[static_cast<std::size_t>(j)], static_cast<std::uint32_t>(t)), out, -2.0f, 2.0f);
      const float scale = static_cast<float>(std::sqrt(1.0 / static_cast<double>(s.fan_in)) / kTruncatedStd);
      for (float& v : out) v *= scale;
    }
  }
}

std::string Sequential::summary() const {
  std::ostringstream os;
  auto dims = [](const Dims& d) {
    std::string s = "(";
    for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + ")";
  };
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::int64_t n = 0;
    for (const auto& spec : layers_[i]->params(shapes_[i])) n += product(spec.shape);
    os << layers_[i]->name() << " " << dims(shapes_[i]) << " -> " << dims(shapes_[i + 1]) << "  params " << n << "\n";
  }
  os << "total params per member: " << params_per_member_ << "\n";
  return os.str();
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
  return std::make_unique<Sequential>(std::move(input), std::move(l));
}

}  // namespace pmap::ensemble
