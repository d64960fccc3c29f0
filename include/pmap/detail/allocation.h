// The seam between Arrays' storage and pmap::jit's buffer plan (pmapcc/core/jit.h). While a hook is installed
// on a thread, every Array that thread allocates asks it first: the hook may provide the memory (a place in
// a planned arena, which the Array then never frees), or decline, and it hears of every Array the thread
// frees. Internal to pmapcc; with no hook installed an Array allocates and frees as it always has.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmap/array.h>
#include <pmap/device.h>

namespace pmap::detail {

class AllocationHook {
 public:
  virtual ~AllocationHook() = default;
  // Memory for an Array of `bytes` (> 0) on `device`, or nullptr: the Array allocates as usual and then
  // calls allocated(). Pinned host Arrays never ask. Never throws.
  virtual void* provide(std::size_t bytes, const Device& device) noexcept = 0;
  virtual void allocated(void* data, std::size_t bytes) noexcept = 0;
  // An Array freed on this thread: memory this hook (or an earlier one) provided, or memory of its own.
  virtual void released(void* data, bool provided) noexcept = 0;
};

// Installs `hook` (or none: nullptr) on the calling thread; returns the one it replaces.
AllocationHook* set_allocation_hook(AllocationHook* hook) noexcept;

// Whether a's storage is an AllocationHook's.
bool is_provided(const Array& a) noexcept;

// Gives up to `bytes` of the host block cache's large free blocks back to the system before a plan's arena
// of that size is allocated, so that the arena reuses their pages (host_cache.h); returns the bytes freed.
std::size_t release_cached_host_memory(std::size_t bytes) noexcept;

// How many Arrays the calling thread has allocated storage for itself (memory no hook provided), ever: a
// difference of two readings counts the allocations between them.
std::uint64_t allocation_count() noexcept;

}  // namespace pmap::detail
