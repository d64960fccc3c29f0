// Host implementation of pmap/random.h: Threefry keys as in JAX, and samplers that reproduce cuRAND's
// Philox4x32-10 host generator. The per-element math lives in pmap/detail/philox.h, shared with CUDA.
#include <pmap/detail/philox.h>
#include <pmap/error.h>
#include <pmap/random.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>

namespace pmap {
namespace {

std::uint32_t rotate_left(std::uint32_t x, int bits) { return (x << bits) | (x >> (32 - bits)); }

// Calls body(block, first, count) for each 4-word Philox block of the key's stream covering [0, n):
// elements first .. first + count - 1 are the block's words 0 .. count - 1.
template <class Body>
void for_each_block(Key key, std::size_t n, Body&& body) {
  const std::uint64_t seed = philox_seed(key);
  for (std::size_t first = 0; first < n; first += 4) {
    body(detail::curand_host_block(seed, first / 4), first, std::min<std::size_t>(4, n - first));
  }
}

// Sequential reader of the key's random_bits stream, for consumers that need a variable count.
class WordStream {
 public:
  explicit WordStream(Key key) : seed_(philox_seed(key)) {}
  std::uint32_t next() {
    if (index_ % 4 == 0) block_ = detail::curand_host_block(seed_, index_ / 4);
    return block_.v[index_++ % 4];
  }

 private:
  std::uint64_t seed_;
  std::uint64_t index_ = 0;
  detail::Philox4 block_{};
};

// A uniform integer in [0, bound), 1 <= bound <= 2^32: words at or above the largest multiple of
// bound that fits in 32 bits are rejected, so every residue is equally likely.
std::uint32_t uniform_below(WordStream& words, std::uint64_t bound) {
  const std::uint64_t limit = ((std::uint64_t{1} << 32) / bound) * bound;
  for (;;) {
    const std::uint64_t word = words.next();
    if (word < limit) return static_cast<std::uint32_t>(word % bound);
  }
}

// "<function>: <requirement> (got <values>)" as a ValueError.
[[noreturn]] void throw_value_error(const char* function, const char* requirement, const std::string& got) {
  throw ValueError(std::string(function) + ": " + requirement + " (got " + got + ")");
}

std::string show(const char* name, float value) {
  std::ostringstream os;
  os << name << "=" << value;
  return os.str();
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Key& key) {
  return os << "Key(" << key.k0 << ", " << key.k1 << ")";
}

Key key(std::uint64_t seed) {
  return Key{static_cast<std::uint32_t>(seed >> 32), static_cast<std::uint32_t>(seed)};
}

std::array<std::uint32_t, 2> threefry2x32(Key key, std::uint32_t x0, std::uint32_t x1) {
  static constexpr int kRotations[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  const std::uint32_t schedule[3] = {key.k0, key.k1, key.k0 ^ key.k1 ^ 0x1BD11BDAu};
  x0 += schedule[0];
  x1 += schedule[1];
  // Five groups of four mix rounds; after each group the next key of the schedule is injected.
  for (int group = 0; group < 5; ++group) {
    for (int bits : kRotations[group % 2]) {
      x0 += x1;
      x1 = rotate_left(x1, bits) ^ x0;
    }
    x0 += schedule[(group + 1) % 3];
    x1 += schedule[(group + 2) % 3] + static_cast<std::uint32_t>(group + 1);
  }
  return {x0, x1};
}

Key fold_in(Key key, std::uint32_t data) {
  const auto [k0, k1] = threefry2x32(key, 0u, data);
  return Key{k0, k1};
}

std::vector<Key> split(Key key, int n) {
  if (n < 1) throw_value_error("split", "n must be >= 1", "n=" + std::to_string(n));
  std::vector<Key> keys;
  keys.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) keys.push_back(fold_in(key, static_cast<std::uint32_t>(i)));
  return keys;
}

std::uint64_t philox_seed(Key key) { return (std::uint64_t{key.k0} << 32) | key.k1; }

void random_bits(Key key, std::span<std::uint32_t> out) {
  for_each_block(key, out.size(), [&](const detail::Philox4& block, std::size_t first, std::size_t count) {
    std::copy_n(block.v, count, out.begin() + static_cast<std::ptrdiff_t>(first));
  });
}

void uniform(Key key, std::span<float> out, float lo, float hi) {
  if (!(std::isfinite(lo) && std::isfinite(hi) && lo < hi)) {
    throw_value_error("uniform", "lo and hi must be finite with lo < hi",
                      show("lo", lo) + ", " + show("hi", hi));
  }
  for_each_block(key, out.size(), [&](const detail::Philox4& block, std::size_t first, std::size_t count) {
    for (std::size_t k = 0; k < count; ++k) {
      out[first + k] = detail::uniform_in_range(detail::uniform_from_bits(block.v[k]), lo, hi);
    }
  });
}

void normal(Key key, std::span<float> out, float mean, float stddev) {
  if (!std::isfinite(mean)) throw_value_error("normal", "mean must be finite", show("mean", mean));
  if (!(std::isfinite(stddev) && stddev > 0.0f)) {
    throw_value_error("normal", "stddev must be finite and > 0", show("stddev", stddev));
  }
  for_each_block(key, out.size(), [&](const detail::Philox4& block, std::size_t first, std::size_t count) {
    const detail::Float2 low = detail::box_muller(block.v[0], block.v[1]);
    const detail::Float2 high = detail::box_muller(block.v[2], block.v[3]);
    const float z[4] = {low.x, low.y, high.x, high.y};
    for (std::size_t k = 0; k < count; ++k) out[first + k] = detail::scale_normal(z[k], mean, stddev);
  });
}

void truncated_normal(Key key, std::span<float> out, float lower, float upper) {
  if (!(lower < upper)) {
    throw_value_error("truncated_normal", "lower must be less than upper",
                      show("lower", lower) + ", " + show("upper", upper));
  }
  const detail::TruncatedNormalParams params = detail::truncated_normal_params(lower, upper);
  for_each_block(key, out.size(), [&](const detail::Philox4& block, std::size_t first, std::size_t count) {
    for (std::size_t k = 0; k < count; ++k) {
      out[first + k] = detail::truncated_normal_from_bits(block.v[k], params);
    }
  });
}

void bernoulli(Key key, std::span<std::uint8_t> out, float p) {
  if (!(p >= 0.0f && p <= 1.0f)) throw_value_error("bernoulli", "p must be in [0, 1]", show("p", p));
  for_each_block(key, out.size(), [&](const detail::Philox4& block, std::size_t first, std::size_t count) {
    for (std::size_t k = 0; k < count; ++k) {
      out[first + k] = detail::uniform_from_bits(block.v[k]) <= p ? 1 : 0;
    }
  });
}

std::vector<std::uint32_t> permutation(Key key, std::uint32_t n) {
  std::vector<std::uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  WordStream words(key);
  for (std::uint32_t i = n; i > 1; --i) {  // place a uniformly chosen one of perm[0 .. i-1] at i - 1
    std::swap(perm[i - 1], perm[uniform_below(words, i)]);
  }
  return perm;
}

}  // namespace pmap
