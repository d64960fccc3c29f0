// Internal to kernels/eager/array_ops*.cpp: the operand checks and helpers the eager ops share (not installed
// for users: the header-only parts of pmapcc::kernels' API are array_ops.h and the op families).
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmap/array.h>

namespace pmap::kernels {
class Backend;
}

namespace pmap::ops::eager::detail {

// ValueError naming ops::fn and the argument when x is an empty handle / not of dtype `want`.
void require_valid(const char* fn, const char* name, const Array& x);
void require_dtype(const char* fn, const char* arg, const Array& x, DType want);
// The backend that computes on arrays of `device`, after checking the calling thread may queue work there.
const kernels::Backend& backend_of(const char* fn, const Device& device);
// Zeros of a shape on a device, filled by the backend (queued with its other work: Array's own zeroing
// constructor waits for a GPU, and a graph capture refuses it).
Array zeros_on(const char* fn, Shape shape, DType dtype, const Device& device);
void require_same_device(const char* fn, const Array& a, const char* an, const Array& b, const char* bn);
// v as an int, or ValueError naming `what` when it exceeds the kernels' int range.
int as_int(const char* fn, const char* what, std::int64_t v);
// Leading axes as rows: the rows of x's last axis (1 for a scalar).
std::int64_t rows_of(const Array& x);
Shape with_last(const Shape& s, std::int64_t last);
// Device scratch of `bytes` bytes (none for 0), and its pointer (null when empty).
Array workspace(std::size_t bytes, const Device& device);
void* ptr(Array& ws);

}  // namespace pmap::ops::eager::detail
