// The cache of large host blocks behind CPU Arrays. A training step written with pmap::ops allocates the
// same sizes step after step; a fresh block from the OS costs a page fault per 4 KiB page on its first
// touch (the zero fill), which took 62 % of flax_ensemble's time (perf, 4 members on 2 CPU devices). A
// freed block of at least kMinCachedBytes is kept, up to kMaxCachedBytes in all, for the next allocation of
// the same size; smaller blocks are malloc's (which reuses them itself). Thread-safe. Under AddressSanitizer
// a cached block is poisoned, so a use after free is still reported.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pmap::detail {

inline constexpr std::size_t kMinCachedBytes = std::size_t{256} << 10;
inline constexpr std::size_t kMaxCachedBytes = std::size_t{1} << 30;
// Fresh blocks of at least kHugeBytes are kHugePage aligned, rounded up to whole huge pages and advised for
// transparent huge pages (Linux): one fault per 2 MiB on the first touch. The price: up to 2 MiB more
// resident memory per block (its last huge page whole; the cache counts the requested bytes), and where THP
// defrag is "madvise" a first touch may wait for the kernel to compact memory into a huge page.
inline constexpr std::size_t kHugePage = std::size_t{2} << 20;
inline constexpr std::size_t kHugeBytes = std::size_t{4} << 20;

// `bytes` (a multiple of 64) of 64-byte aligned host memory, uninitialised; std::bad_alloc when there is none.
void* host_alloc(std::size_t bytes);
// Returns a block host_alloc gave for `bytes`: kept for reuse or freed.
void host_free(void* p, std::size_t bytes) noexcept;
// Frees a block host_alloc gave, never caching it, its size unknown (an Array freed during a capture, freed
// once the capture has ended).
void host_free_uncached(void* p) noexcept;

struct HostCacheStats {
  std::uint64_t reused = 0, allocated = 0;  // large allocations served from the cache / fresh
  std::uint64_t released = 0;               // cached blocks given back by host_cache_release
  std::size_t cached_bytes = 0;             // held now
};
HostCacheStats host_cache_stats();
// Whether fresh blocks of kHugeBytes or more are huge-page aligned and advised (Linux, not under a sanitizer).
bool huge_blocks();
// Frees every cached block (tests; a program that wants its memory back).
void host_cache_clear() noexcept;
// Frees cached blocks of kHugeBytes or more, the largest first, until at least `bytes` are freed or none is
// left, unless a block of exactly `bytes` is cached (the next allocation of that size takes it); returns the
// bytes freed. jit calls it before it allocates an arena: the arena then takes pages the trace's freed blocks
// gave back instead of pages the process never had, whose first touch costs far more on a VM (2.5 ms per MB
// on the 2-core one here, against 16 GB/s for pages given back and mapped again: the first replay of
// flax_ensemble's step took 2-4x a later one).
std::size_t host_cache_release(std::size_t bytes) noexcept;

}  // namespace pmap::detail
