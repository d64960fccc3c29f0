// Internal to the CPU kernels: the helper threads a CPU kernel call may split its large products over
// (kernels/cpu_backend.h's cpu::set_threads). Compiled once, outside the ISA variants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace pmap::kernels::cpu::detail {

// part(first, count, helper) for consecutive row ranges covering [0, rows): on the calling thread alone
// (part(0, rows, false)) unless threads() > 1 and the product, rows x cols x depth, is large enough to
// repay waking helpers; then in up to threads() ranges of a multiple of `align` rows each (the last takes
// the rest), the first on the calling thread and each other on one of the calling thread's own helper
// threads (helper = true), started on first use and parked between calls. Returns when every range is
// done; rethrows the first range's exception, after all ranges have ended. A product split by rows gives
// the same bits as the whole when each row's sums do not depend on the rows beside it (as in every GEMM
// here: align keeps each row in the same place of the kernels' row tiles).
void split_rows(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::int64_t align,
                const std::function<void(std::int64_t first, std::int64_t count, bool helper)>& part);

// Packing space for a range run on a helper thread: at least `bytes` bytes, 64-byte aligned, the helper's
// own (grown as needed, kept for its next range). Call only from a part with helper = true.
void* helper_scratch(std::size_t bytes);

// Ranges run on helper threads so far, in the whole process (tests check that a product was split).
std::uint64_t helper_ranges() noexcept;

}  // namespace pmap::kernels::cpu::detail
