// The samplers of pmap/random.h into Arrays: host arrays through the span samplers, CUDA arrays through
// the device kernel (src/cuda/random.cu), after the same argument checks.
#include <pmap/array.h>
#include <pmap/detail/capture.h>
#include <pmap/error.h>
#include <pmap/random.h>

#include <span>
#include <string>

#include "cuda_seam.h"

namespace pmap {
namespace {

// Every Array sampler's first check: the dtype, and no graph capture (a draw into an array is not recorded:
// a replay would reuse the captured draw on the host run, and on a GPU the sampler synchronizes).
void require_dtype(const char* function, const Array& out, DType want) {
  if (detail::capturing() != nullptr)
    detail::check_not_capturing(std::string(function) + " into " + out.str(), "draws random numbers");
  if (out.dtype() != want) {
    throw ShapeError(std::string(function) + ": needs a " + std::string(name(want)) + " array, got " + out.str());
  }
}

template <class T> std::span<T> host_span(Array& out) {
  return std::span<T>(out.data<T>(), static_cast<std::size_t>(out.size()));
}

// Fills a CUDA array. The caller has already checked the arguments (the host sampler on an empty span
// raises exactly the host's errors and writes nothing).
void draw_on_device(detail::SampleKind kind, Key key, Array& out, float a, float b) {
  detail::SampleRequest request;
  request.kind = kind;
  request.key = key;
  request.a = a;
  request.b = b;
  request.out = out.raw_data();
  request.count = static_cast<std::size_t>(out.size());
  request.ordinal = out.device().ordinal;
  detail::cuda_sample(request);
}

}  // namespace

void random_bits(Key key, Array& out) {
  require_dtype("random_bits", out, DType::u32);
  if (out.device().is_cpu()) return random_bits(key, host_span<std::uint32_t>(out));
  draw_on_device(detail::SampleKind::bits, key, out, 0.0f, 0.0f);
}

void uniform(Key key, Array& out, float lo, float hi) {
  require_dtype("uniform", out, DType::f32);
  if (out.device().is_cpu()) return uniform(key, host_span<float>(out), lo, hi);
  uniform(key, std::span<float>(), lo, hi);
  draw_on_device(detail::SampleKind::uniform, key, out, lo, hi);
}

void normal(Key key, Array& out, float mean, float stddev) {
  require_dtype("normal", out, DType::f32);
  if (out.device().is_cpu()) return normal(key, host_span<float>(out), mean, stddev);
  normal(key, std::span<float>(), mean, stddev);
  draw_on_device(detail::SampleKind::normal, key, out, mean, stddev);
}

void truncated_normal(Key key, Array& out, float lower, float upper) {
  require_dtype("truncated_normal", out, DType::f32);
  if (out.device().is_cpu()) return truncated_normal(key, host_span<float>(out), lower, upper);
  truncated_normal(key, std::span<float>(), lower, upper);
  draw_on_device(detail::SampleKind::truncated_normal, key, out, lower, upper);
}

void bernoulli(Key key, Array& out, float p) {
  require_dtype("bernoulli", out, DType::u8);
  if (out.device().is_cpu()) return bernoulli(key, host_span<std::uint8_t>(out), p);
  bernoulli(key, std::span<std::uint8_t>(), p);
  draw_on_device(detail::SampleKind::bernoulli, key, out, p, 0.0f);
}

}  // namespace pmap
