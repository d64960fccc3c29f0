// The host block cache (host_cache.h).
#include "host_cache.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <new>
#include <utility>
#include <unordered_map>
#include <vector>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PMAPCC_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PMAPCC_ASAN 1
#endif
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PMAPCC_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define PMAPCC_TSAN 1
#endif
#ifdef PMAPCC_ASAN
#include <sanitizer/asan_interface.h>
#define PMAPCC_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define PMAPCC_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define PMAPCC_POISON(p, n) ((void)(p), (void)(n))
#define PMAPCC_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace pmap::detail {
namespace {

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free;  // by size
  std::size_t bytes = 0;
  HostCacheStats stats;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: Arrays may be freed during static destruction
  return *c;
}

// A fresh block of at least kHugeBytes: 2 MiB aligned, and (Linux) offered to transparent huge pages, so
// that its first touch faults once per 2 MiB instead of once per 4 KiB page (where THP is "madvise", the
// common default, only advised memory gets them; where it is "never" the advice does nothing). Not under
// the sanitizers, whose allocators keep their own mappings.
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(PMAPCC_ASAN) && !defined(PMAPCC_TSAN)
#define PMAPCC_HUGE_BLOCKS 1
#endif

#ifdef PMAPCC_HUGE_BLOCKS
// A huge block's mapping: the requested bytes rounded up to whole huge pages.
std::size_t huge_whole(std::size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
bool is_huge(std::size_t bytes) { return bytes >= kHugeBytes && bytes <= SIZE_MAX - 2 * kHugePage; }

// Each huge block's mapped length: what frees it (free_block) goes by this, never by a size it is told.
struct Mappings {
  std::mutex mutex;
  std::unordered_map<void*, std::size_t> whole;
};
Mappings& mappings() {
  static Mappings* m = new Mappings;  // never destroyed, as the cache
  return *m;
}
#endif

// Huge blocks are mappings of their own (mmap, not malloc's): freeing one gives its pages back to the
// kernel at once (munmap). A later mapping still faults and zero-fills each page, but in a VM the pages the
// kernel hands out again are already backed by the host, which is most of a fresh page's cost there.
void* fresh_block(std::size_t bytes) {
#ifdef PMAPCC_HUGE_BLOCKS
  if (is_huge(bytes)) {  // (a larger size fails below as it always did)
    const std::size_t whole = huge_whole(bytes);
    // Map a huge page more than needed and unmap the ends around the 2 MiB aligned middle.
    void* m = mmap(nullptr, whole + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    const auto start = reinterpret_cast<std::uintptr_t>(m);
    const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > start) munmap(m, aligned - start);
    munmap(reinterpret_cast<void*>(aligned + whole), start + kHugePage - aligned);  // (never empty)
    void* p = reinterpret_cast<void*>(aligned);
    try {
      Mappings& mp = mappings();
      std::lock_guard<std::mutex> lock(mp.mutex);
      mp.whole.emplace(p, whole);
    } catch (...) {  // no memory for the bookkeeping: no block
      munmap(p, whole);
      return nullptr;
    }
    madvise(p, whole, MADV_HUGEPAGE);  // advice only
    return p;
  }
#endif
  return std::aligned_alloc(64, bytes);
}

// Frees a block fresh_block gave: a huge block's mapping, else malloc's.
void free_block(void* p) noexcept {
#ifdef PMAPCC_HUGE_BLOCKS
  std::size_t whole = 0;
  {
    Mappings& m = mappings();
    std::lock_guard<std::mutex> lock(m.mutex);
    if (auto it = m.whole.find(p); it != m.whole.end()) {
      whole = it->second;
      m.whole.erase(it);
    }
  }
  if (whole > 0) {
    munmap(p, whole);
    return;
  }
#endif
  std::free(p);
}

}  // namespace

void* host_alloc(std::size_t bytes) {
  if (bytes >= kMinCachedBytes) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free.find(bytes);
    if (it != c.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.bytes -= bytes;
      ++c.stats.reused;
      PMAPCC_UNPOISON(p, bytes);
      return p;
    }
    ++c.stats.allocated;
  }
  void* p = fresh_block(bytes);
  if (p == nullptr) {
    host_cache_clear();  // what the cache holds may be what is missing
    p = fresh_block(bytes);
    if (p == nullptr) throw std::bad_alloc();
  }
  return p;
}

void host_free(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes >= kMinCachedBytes) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.bytes + bytes <= kMaxCachedBytes) {
      try {
        c.free[bytes].push_back(p);
        c.bytes += bytes;
        PMAPCC_POISON(p, bytes);
        return;
      } catch (...) {  // no memory for the bookkeeping: free it instead
      }
    }
  }
  free_block(p);
}

bool huge_blocks() {
#ifdef PMAPCC_HUGE_BLOCKS
  return true;
#else
  return false;
#endif
}

HostCacheStats host_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  HostCacheStats s = c.stats;
  s.cached_bytes = c.bytes;
  return s;
}

void host_cache_clear() noexcept {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [bytes, blocks] : c.free) {
    for (void* p : blocks) {
      PMAPCC_UNPOISON(p, bytes);
      free_block(p);
    }
  }
  c.free.clear();
  c.bytes = 0;
}

void host_free_uncached(void* p) noexcept {
  if (p != nullptr) free_block(p);
}

std::size_t host_cache_release(std::size_t bytes) noexcept {
  Cache& c = cache();
  std::vector<std::pair<void*, std::size_t>> given;  // unmapped after the lock, which others wait for
  std::size_t released = 0;
  try {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (auto hit = c.free.find(bytes); hit != c.free.end() && !hit->second.empty()) return 0;  // one waits
    // The largest sizes first: the fewest blocks for the pages asked for.
    std::vector<std::size_t> sizes;
    for (const auto& [size, blocks] : c.free) {
      if (size >= kHugeBytes && !blocks.empty()) sizes.push_back(size);
    }
    std::sort(sizes.rbegin(), sizes.rend());
    for (const std::size_t size : sizes) {
      std::vector<void*>& blocks = c.free.find(size)->second;
      while (released < bytes && !blocks.empty()) {
        given.emplace_back(blocks.back(), size);
        blocks.pop_back();
        c.bytes -= size;
        released += size;
        ++c.stats.released;
      }
      if (released >= bytes) break;
    }
  } catch (...) {  // no memory for the lists: what was taken is still freed below
  }
  for (const auto& [p, size] : given) {
    PMAPCC_UNPOISON(p, size);
    free_block(p);
  }
  return released;
}

}  // namespace pmap::detail
