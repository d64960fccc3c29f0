// LayerNorm (nn/layer_norm.h), of pmap::ops.
#include <pmapcc/nn/layer_norm.h>

#include <cmath>
#include <string>
#include <utility>

#include <pmap/error.h>

#include <pmapcc/nn/init.h>
#include <pmapcc/nn/summary.h>

namespace pmap::nn {
namespace {

void check(const LayerNorm& norm, const LayerNormParams& p, const Array& x) {
  if (!(norm.epsilon > 0.0f) || !std::isfinite(norm.epsilon))
    throw ValueError("nn::LayerNorm: epsilon must be positive and finite, got " + std::to_string(norm.epsilon));
  if (x.ndim() < 1) throw ShapeError("nn::LayerNorm: x must have a feature axis, got shape " + shape_str(x.shape()));
  const Shape features{x.dim(-1)};
  for (const auto& [name, a] : {std::pair<const char*, const Array*>{"scale", &p.scale}, {"bias", &p.bias}}) {
    if (a->shape() != features)
      throw ShapeError(std::string("nn::LayerNorm: ") + name + " must be " + shape_str(features) +
                       " (x's last axis), got " + shape_str(a->shape()));
  }
}

}  // namespace

LayerNormParams LayerNorm::init(std::int64_t features, const Device& device) const {
  if (features <= 0) throw ValueError("nn::LayerNorm: features must be positive, got " + std::to_string(features));
  return {ones({features}, device), zeros({features}, device)};
}

Array LayerNorm::operator()(const LayerNormParams& p, const Array& x) const {
  check(*this, p, x);
  const Array mean = ops::broadcast_to(ops::mean(x, {-1}, /*keepdims=*/true), x.shape());
  const Array centred = ops::subtract(x, mean);
  const Array variance = ops::mean(ops::square(centred), {-1}, /*keepdims=*/true);
  const Array deviation = ops::broadcast_to(ops::sqrt(ops::scale(variance, 1.0f, epsilon)), x.shape());
  Array y = ops::add(ops::multiply(ops::divide(centred, deviation), p.scale), p.bias);
  if (recording_modules()) record_module_call("LayerNormalization", "", {&p.scale, &p.bias}, y);
  return y;
}

}  // namespace pmap::nn
