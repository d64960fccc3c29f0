// Initializers (flax.linen.initializers): new f32 arrays on a device drawn from a key, the same numbers on
// CPU and GPU (pmap/random.h). Called inside pmap for a device's own parameters, or on the host.
#pragma once

#include <cstdint>

#include <pmap/array.h>
#include <pmap/random.h>

namespace pmap::nn {

// Flax's default kernel initializer: a unit normal truncated to [-2, 2], scaled to variance 1 / fan_in.
Array lecun_normal(Key key, const Shape& shape, std::int64_t fan_in, const Device& device = {});
// Keras's default: uniform on +-sqrt(6 / (fan_in + fan_out)).
Array glorot_uniform(Key key, const Shape& shape, std::int64_t fan_in, std::int64_t fan_out,
                     const Device& device = {});
Array zeros(const Shape& shape, const Device& device = {});
Array ones(const Shape& shape, const Device& device = {});

}  // namespace pmap::nn
