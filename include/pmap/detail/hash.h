// pmapcc's one hash, 64-bit FNV-1a, for the signatures that devices and processes compare (axis names, GPU
// identities, ppermute pairs, the trainer's config-and-data fingerprint). Stable across processes of one
// build; not for security. Internal: not part of the API.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace pmap::detail {

inline constexpr std::uint64_t kFnvOffsetBasis = 14695981039346656037ull;
inline constexpr std::uint64_t kFnvPrime = 1099511628211ull;

// Hashes the bytes of `text`, continuing from h.
inline std::uint64_t fnv1a(std::string_view text, std::uint64_t h = kFnvOffsetBasis) {
  for (unsigned char c : text) h = (h ^ c) * kFnvPrime;
  return h;
}

// Hashes `bytes`, continuing from h (the same hash as of the same bytes as text).
inline std::uint64_t fnv1a(std::span<const std::uint8_t> bytes, std::uint64_t h = kFnvOffsetBasis) {
  for (std::uint8_t b : bytes) h = (h ^ b) * kFnvPrime;
  return h;
}

// One FNV-1a round over a whole value rather than a byte: h ^ value, times the prime.
inline std::uint64_t fnv1a_word(std::uint64_t h, std::uint64_t value) { return (h ^ value) * kFnvPrime; }

}  // namespace pmap::detail
