// BatchNorm and Dropout (nn/normalization.h) over ops::batch_norm and ops::dropout.
#include <pmapcc/nn/normalization.h>

#include <cstdio>
#include <string>

#include <pmap/error.h>

#include <pmapcc/nn/init.h>
#include <pmapcc/nn/summary.h>

namespace pmap::nn {
namespace {

void check_channels(std::int64_t channels) {
  if (channels <= 0)
    throw ValueError("nn::BatchNorm: the channels must be positive, got " + std::to_string(channels));
}

std::pair<Array, BatchNormState> batch_norm(const BatchNorm& m, const Array& gamma, const Array& beta,
                                            const BatchNormState& s, const Array& x, BatchNormCall call) {
  auto r = ops::batch_norm(x, gamma, beta, s.moving_mean, s.moving_variance,
                           {.train = call.train, .axis_name = m.axis_name, .epsilon = m.epsilon,
                            .momentum = m.momentum, .relu = call.relu, .batch_examples = call.batch_examples});
  return {std::move(r.y), BatchNormState{std::move(r.moving_mean), std::move(r.moving_variance)}};
}

}  // namespace

BatchNormParams BatchNorm::init(std::int64_t channels, const Device& device) const {
  check_channels(channels);
  return {ones({channels}, device), zeros({channels}, device)};
}

BatchNormCenter BatchNorm::init_center(std::int64_t channels, const Device& device) const {
  check_channels(channels);
  return {zeros({channels}, device)};
}

BatchNormState BatchNorm::init_state(std::int64_t channels, const Device& device) const {
  check_channels(channels);
  return {zeros({channels}, device), ones({channels}, device)};
}

std::pair<Array, BatchNormState> BatchNorm::operator()(const BatchNormParams& p, const BatchNormState& s,
                                                       const Array& x, BatchNormCall call) const {
  auto out = batch_norm(*this, p.gamma, p.beta, s, x, call);
  if (recording_modules())
    record_module_call("BatchNormalization", settings(true, call.relu),
                       {&p.gamma, &p.beta, &s.moving_mean, &s.moving_variance}, out.first);
  return out;
}

std::pair<Array, BatchNormState> BatchNorm::operator()(const BatchNormCenter& p, const BatchNormState& s,
                                                       const Array& x, BatchNormCall call) const {
  auto out = batch_norm(*this, Array(), p.beta, s, x, call);
  if (recording_modules())
    record_module_call("BatchNormalization", settings(false, call.relu), {&p.beta, &s.moving_mean, &s.moving_variance},
                       out.first);
  return out;
}

// "momentum 0.99, epsilon 0.001", then ", no scale", ", relu" where they apply.
std::string BatchNorm::settings(bool scale, bool relu) const {
  char text[64];
  std::snprintf(text, sizeof text, "momentum %g, epsilon %g", static_cast<double>(momentum),
                static_cast<double>(epsilon));
  return std::string(text) + (scale ? "" : ", no scale") + (relu ? ", relu" : "");
}

Array Dropout::operator()(const Array& x, const DropoutCall& call) const {
  if (!(rate >= 0 && rate < 1)) throw ValueError("nn::Dropout: rate must be in [0, 1), got " + std::to_string(rate));
  if (recording_modules()) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(rate));
    record_module_call("Dropout", text, {}, x);
  }
  if (!call.train || (rate == 0 && call.rate == nullptr)) return ops::copy(x);  // inside grad: differentiated
  if (call.rng.key == nullptr || call.rng.step == nullptr)
    throw ValueError("nn::Dropout: training needs DropoutCall::rng's key (2) u32 and step (1) i64");
  const ops::DropoutOptions o{.rate = rate, .example_offset = call.rng.example_offset, .stream = stream};
  return call.rate != nullptr ? ops::dropout(x, *call.rng.key, *call.rng.step, *call.rate, o)
                              : ops::dropout(x, *call.rng.key, *call.rng.step, o);
}

}  // namespace pmap::nn
