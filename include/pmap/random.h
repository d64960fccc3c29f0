// Random keys and samplers: JAX's Threefry-2x32 keys (key, split, fold_in bit-identical to JAX's
// default PRNG with jax_threefry_partitionable=True) and samples drawn from cuRAND's Philox4x32-10
// stream seeded by a key, with a host implementation that reproduces cuRAND's host generator.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <span>
#include <vector>

namespace pmap {

class Array;

// A PRNG key: JAX's raw key data [k0, k1] for the threefry2x32 implementation.
struct Key {
  std::uint32_t k0 = 0;
  std::uint32_t k1 = 0;
  friend bool operator==(const Key&, const Key&) = default;
};

// Prints "Key(k0, k1)" with decimal words, as JAX prints key_data.
std::ostream& operator<<(std::ostream& os, const Key& key);

// JAX's jax.random.key(seed) / PRNGKey(seed): k0 = seed >> 32, k1 = the low 32 bits.
Key key(std::uint64_t seed);

// The Threefry-2x32 block cipher (20 rounds) of the counter (x0, x1) under `key`, as jax.random's
// threefry_2x32 (Random123's threefry2x32_20).
std::array<std::uint32_t, 2> threefry2x32(Key key, std::uint32_t x0, std::uint32_t x1);

// jax.random.fold_in(key, data): the key threefry2x32(key, 0, data).
Key fold_in(Key key, std::uint32_t data);

// jax.random.split(key, n) with partitionable Threefry: element i is fold_in(key, i), so key i does not
// depend on n. Throws ValueError if n < 1.
std::vector<Key> split(Key key, int n);

// ---- Samplers ------------------------------------------------------------------------------------
// Each sampler fills a caller-owned host buffer from the key's Philox4x32-10 stream: cuRAND's
// CURAND_RNG_PSEUDO_PHILOX4_32_10 generator seeded with philox_seed(key), offset 0, default ordering.
// All are blocking, deterministic and allocation-free; element i depends only on the key and i (not on
// the buffer size), except that permutation consumes a data-dependent number of words.

// The 64-bit seed a key gives cuRAND's Philox generator: (uint64(k0) << 32) | k1.
std::uint64_t philox_seed(Key key);

// Raw 32-bit words: exactly curandGenerate's output.
void random_bits(Key key, std::span<std::uint32_t> out);

// Uniform floats lo + (hi - lo) * u with u in (0, 1] exactly curandGenerateUniform's output (so the
// default [0, 1] gives cuRAND's floats bit for bit); results are clamped into [lo, hi].
// Throws ValueError unless lo and hi are finite and lo < hi.
void uniform(Key key, std::span<float> out, float lo = 0.0f, float hi = 1.0f);

// Normal floats: exactly curandGenerateNormal(mean, stddev) (Box-Muller on word pairs, sin first,
// z * stddev + mean). An odd size draws one more value and drops it, as cuRAND's host generator does.
// Bitwise equal to cuRAND's host generator; a CUDA kernel using the same math may differ in the last
// bits, because CUDA's logf / sinf / cosf are not glibc's.
// Throws ValueError unless mean is finite and stddev is finite and > 0.
void normal(Key key, std::span<float> out, float mean = 0.0f, float stddev = 1.0f);

// Standard normal floats restricted to [lower, upper] (jax.random.truncated_normal): the normal
// quantile of Phi(lower) + u (Phi(upper) - Phi(lower)), u = (w + 1/2) 2^-32 for word w = element i of
// random_bits(key), computed in double with libm-free math (detail/philox.h) so host and device agree
// bitwise. Results always lie in [lower, upper]; infinite bounds are allowed.
// Throws ValueError unless lower < upper.
void truncated_normal(Key key, std::span<float> out, float lower = -2.0f, float upper = 2.0f);

// Bernoulli draws: out[i] = 1 if element i of uniform(key) is <= p, else 0; p = 0 gives all 0, p = 1
// all 1. Throws ValueError unless 0 <= p <= 1.
void bernoulli(Key key, std::span<std::uint8_t> out, float p);

// The same samplers into an Array on any device: a CPU array is filled by the functions above; a CUDA
// array by a kernel on the calling thread's current stream (blocking), drawing bitwise the host's numbers
// for random_bits, uniform, bernoulli and truncated_normal, and normal to a few ulp (see normal).
// dtypes: random_bits u32, bernoulli u8, the others f32 (ShapeError otherwise). Arguments are checked as
// above; element i depends only on the key and i.
void random_bits(Key key, Array& out);
void uniform(Key key, Array& out, float lo = 0.0f, float hi = 1.0f);
void normal(Key key, Array& out, float mean = 0.0f, float stddev = 1.0f);
void truncated_normal(Key key, Array& out, float lower = -2.0f, float upper = 2.0f);
void bernoulli(Key key, Array& out, float p);

// A uniformly random permutation of 0..n-1: Fisher-Yates from the top, each index drawn from the
// key's random_bits stream by rejection sampling (no modulo bias). Deterministic per key.
std::vector<std::uint32_t> permutation(Key key, std::uint32_t n);

}  // namespace pmap
