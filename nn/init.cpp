// The initializers of nn/init.h.
#include <pmapcc/nn/init.h>

#include <cmath>
#include <string>

#include <pmap/error.h>

#include <pmapcc/core/ops.h>

namespace pmap::nn {
namespace {
// The standard deviation of a unit normal truncated to [-2, 2].
constexpr double kTruncatedStd = 0.87962566103423978;

void check_fan(const char* fn, std::int64_t fan) {
  if (fan <= 0) throw ValueError(std::string("nn::") + fn + ": fan_in must be positive, got " + std::to_string(fan));
}
}  // namespace

Array lecun_normal(Key key, const Shape& shape, std::int64_t fan_in, const Device& device) {
  check_fan("lecun_normal", fan_in);
  Array a(shape, DType::f32, device);
  truncated_normal(key, a, -2.0f, 2.0f);
  const float scale = static_cast<float>(std::sqrt(1.0 / static_cast<double>(fan_in)) / kTruncatedStd);
  return ops::scale(a, scale);
}

Array glorot_uniform(Key key, const Shape& shape, std::int64_t fan_in, std::int64_t fan_out, const Device& device) {
  check_fan("glorot_uniform", fan_in + fan_out);
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  Array a(shape, DType::f32, device);
  uniform(key, a, static_cast<float>(-limit), static_cast<float>(limit));
  return a;
}

Array zeros(const Shape& shape, const Device& device) { return Array(shape, DType::f32, device); }

Array ones(const Shape& shape, const Device& device) { return ops::scale(zeros(shape, device), 0.0f, 1.0f); }

}  // namespace pmap::nn
