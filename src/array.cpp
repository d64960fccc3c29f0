// Array storage, copies between devices, slicing and concatenation.
#include <pmap/array.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include <pmap/detail/allocation.h>
#include <pmap/detail/capture.h>

#include "availability.h"
#include "cuda_seam.h"
#include "host_cache.h"

namespace pmap {
namespace {

constexpr std::size_t kAlign = 64;
std::size_t rounded_bytes(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

thread_local detail::AllocationHook* tls_hook = nullptr;
thread_local std::uint64_t tls_allocations = 0;

// Every blocking copy of an Array goes through here (`what` names it for a capture error).
void copy_bytes(void* dst, const Device& dd, const void* src, const Device& sd, std::size_t n,
                const char* what = "a blocking copy") {
  if (detail::capturing() != nullptr) {
    // Within one GPU, the copy is recorded on the capturing stream, which a replay repeats in order; any
    // other copy waits for the host.
    if (!dd.is_cpu() && !sd.is_cpu() && dd.ordinal == sd.ordinal) {
      if (n > 0) detail::cuda_copy_async(dst, src, n, detail::cuda_thread_stream(), dd.ordinal);
      return;
    }
    detail::check_not_capturing(what, "synchronizes with the host");
  }
  if (n == 0) return;
  if (dd.is_cpu() && sd.is_cpu()) {
    std::memcpy(dst, src, n);
  } else {
    detail::cuda_copy(dst, dd, src, sd, n);
  }
}

}  // namespace

std::int64_t num_elements(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

Array::Array(Shape shape, DType dtype, Device device)
    : shape_(std::move(shape)), dtype_(dtype), dtype_set_(true), device_(device) {
  for (auto d : shape_)
    if (d < 0) throw ShapeError("Array: negative dimension in shape " + shape_str(shape_));
  size_ = num_elements(shape_);
  allocate();
  fill_zero();
}

Array Array::header(Shape shape, DType dtype, Device device, const char* who) {
  Array a;
  a.shape_ = std::move(shape);
  a.dtype_ = dtype;
  a.dtype_set_ = true;
  a.device_ = device;
  for (auto d : a.shape_)
    if (d < 0) throw ShapeError(std::string(who) + ": negative dimension in shape " + shape_str(a.shape_));
  a.size_ = num_elements(a.shape_);
  return a;
}

Array Array::borrow(void* data, Shape shape, DType dtype, Device device) {
  Array a = header(std::move(shape), dtype, device, "Array::borrow");
  if (data == nullptr && a.size_ > 0)
    throw ValueError("Array::borrow: null data for " + a.signature() + " on " + device.str());
  a.owned_ = false;
  a.data_ = data;
  return a;
}

Array Array::uninitialized(Shape shape, DType dtype, Device device) {
  Array a = header(std::move(shape), dtype, device, "Array::uninitialized");
  a.allocate();
  static const bool poison = [] {
    const char* v = std::getenv("PMAPCC_POISON_UNINITIALIZED");
    return v != nullptr && std::string(v) == "1";
  }();
  // (not inside a capture: a replay would not repeat the fill, and the kernels recorded write every byte)
  if (poison && a.nbytes() > 0 && detail::capturing() == nullptr) {
    if (a.device_.is_cpu()) {
      std::memset(a.data_, 0xff, a.nbytes());
    } else {
      std::vector<unsigned char> ff(a.nbytes(), 0xff);
      a.copy_from_host(ff.data(), ff.size());
    }
  }
  return a;
}

Array Array::pinned(Shape shape, DType dtype) {
  Array a = header(std::move(shape), dtype, Device{}, "Array::pinned");
  a.pinned_ = detail::cuda_device_count() > 0;
  a.allocate();
  a.fill_zero();
  return a;
}

Array::Array(Array&& o) noexcept
    : shape_(std::move(o.shape_)), size_(o.size_), dtype_(o.dtype_), dtype_set_(o.dtype_set_),
      device_(o.device_), pinned_(o.pinned_), owned_(o.owned_), provided_(o.provided_), data_(o.data_),
      trace_(o.trace_) {
  o.data_ = nullptr;
  o.trace_ = 0;
  o.owned_ = true;
  o.provided_ = false;
  o.size_ = 0;
  o.dtype_set_ = false;
  o.shape_.clear();
}

Array& Array::operator=(Array&& o) noexcept {
  if (this != &o) {
    release();
    shape_ = std::move(o.shape_);
    size_ = o.size_;
    dtype_ = o.dtype_;
    dtype_set_ = o.dtype_set_;
    device_ = o.device_;
    pinned_ = o.pinned_;
    owned_ = o.owned_;
    provided_ = o.provided_;
    data_ = o.data_;
    trace_ = o.trace_;
    o.data_ = nullptr;
    o.trace_ = 0;
    o.owned_ = true;
    o.provided_ = false;
    o.size_ = 0;
    o.dtype_set_ = false;
    o.shape_.clear();
  }
  return *this;
}

Array::~Array() { release(); }

void Array::allocate() {
  std::size_t bytes = nbytes();
  if (bytes == 0) return;
  detail::AllocationHook* hook = tls_hook;
  if (hook != nullptr && !pinned_) {
    if (void* p = hook->provide(bytes, device_)) {
      data_ = p;
      provided_ = true;
      return;
    }
  }
  if (detail::capturing() != nullptr) detail::check_not_capturing("Array " + str(), "allocates memory");
  if (pinned_) {
    data_ = detail::cuda_host_alloc(bytes);
  } else if (device_.is_cpu()) {
    data_ = detail::host_alloc(rounded_bytes(bytes));
  } else {
    data_ = detail::cuda_alloc(device_.ordinal, bytes);
  }
  ++tls_allocations;
  if (hook != nullptr && !pinned_) hook->allocated(data_, bytes);
}

void Array::release() noexcept {
  trace_ = 0;
  if (data_ == nullptr) return;
  if (!owned_) {  // borrowed: the memory is the caller's
    data_ = nullptr;
    return;
  }
  if (tls_hook != nullptr && !pinned_) tls_hook->released(data_, provided_);
  if (provided_) {  // the hook's memory
    provided_ = false;
    data_ = nullptr;
    return;
  }
  // Freed inside a capture: a replay would use freed memory. The capture raises it when its body ends, and
  // releases the memory once it has ended (a CUDA capture refuses cudaFree).
  if (detail::capturing() != nullptr) {
    try {
      detail::note_capture_violation("Array " + str(), "is freed");
    } catch (...) {  // str() out of memory
      detail::note_capture_violation("an Array", "is freed");
    }
    const auto host = [](int, void* p) noexcept { detail::host_free_uncached(p); };  // not cached
    const bool kept =
        pinned_ ? detail::free_after_capture([](int, void* p) noexcept { detail::cuda_host_free(p); }, 0, data_)
        : device_.is_cpu() ? detail::free_after_capture(host, 0, data_)
                           : detail::free_after_capture(detail::cuda_free, device_.ordinal, data_);
    if (kept) {
      data_ = nullptr;
      return;
    }
  }
  if (pinned_) {
    detail::cuda_host_free(data_);
  } else if (device_.is_cpu()) {
    detail::host_free(data_, rounded_bytes(nbytes()));
  } else {
    detail::cuda_free(device_.ordinal, data_);
  }
  data_ = nullptr;
}

std::int64_t Array::dim(int axis) const {
  int n = ndim();
  int a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n)
    throw ShapeError("axis " + std::to_string(axis) + " is out of range for shape " + shape_str(shape_));
  return shape_[static_cast<std::size_t>(a)];
}

void Array::check_dtype(DType want) const {
  if (want != dtype_)
    throw ShapeError("array " + str() + " accessed as " + std::string(name(want)));
}

void Array::copy_to_host(void* dst, std::size_t n) const {
  check_storage();
  if (n != nbytes())
    throw ShapeError("copy_to_host: " + str() + " holds " + std::to_string(nbytes()) + " bytes, destination has " +
                     std::to_string(n));
  copy_bytes(dst, Device{}, data_, device_, n);
}

void Array::copy_from_host(const void* src, std::size_t n) {
  check_storage();
  if (n != nbytes())
    throw ShapeError("copy_from_host: " + str() + " holds " + std::to_string(nbytes()) + " bytes, source has " +
                     std::to_string(n));
  copy_bytes(data_, device_, src, Device{}, n);
}

void Array::copy_prefix_to_host(void* dst, std::size_t n) const {
  check_storage();
  if (n > nbytes())
    throw ShapeError("copy_prefix_to_host: " + str() + " holds " + std::to_string(nbytes()) + " bytes, asked for " +
                     std::to_string(n));
  copy_bytes(dst, Device{}, data_, device_, n);
}

void Array::copy_prefix_from_host(const void* src, std::size_t n) {
  check_storage();
  if (n > nbytes())
    throw ShapeError("copy_prefix_from_host: " + str() + " holds " + std::to_string(nbytes()) + " bytes, given " +
                     std::to_string(n));
  copy_bytes(data_, device_, src, Device{}, n);
}

Array Array::copy() const {
  if ((trace_ & detail::kBatchedTag) != 0) {  // a value inside vmap: the same value, an alias of its storage
    Array out = borrow(data_, shape_, dtype_, device_);
    out.trace_ = trace_;
    return out;
  }
  Array out = to(device_);
  out.trace_ = trace_;  // the same value: a transformation follows it through the copy
  return out;
}

Array Array::to(const Device& device) const {
  check_storage();
  Array out = uninitialized(shape_, dtype_, device);  // every byte is copied over
  out.copy_from(*this);
  return out;
}

void Array::copy_from(const Array& src) {
  check_storage();
  src.check_storage();
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    throw ShapeError("copy_from: destination " + str() + " does not match source " + src.str());
  copy_bytes(data_, device_, src.data_, src.device_, nbytes());
}

void Array::fill_zero() {
  check_storage();
  if (detail::capturing() != nullptr)
    detail::check_not_capturing("Array::fill_zero of " + str(), "synchronizes with the host");
  if (nbytes() == 0) return;
  if (device_.is_cpu()) {
    std::memset(data_, 0, nbytes());
  } else {
    detail::cuda_memset_zero(device_.ordinal, data_, nbytes());
  }
}

void Array::no_storage() const {
  throw ValueError(str() + " is one member's value inside vmap, which has no storage of its own: compute with "
                   "pmap::ops (whose batching rules see every member), or return it from the vmapped function and "
                   "read the stacked result");
}

Array Array::reshape(Shape shape) && {
  if (trace_ != 0)
    throw ValueError("Array::reshape of " + str() + ", a value inside a function being differentiated: use "
                     "pmap::ops::reshape there (the gradient follows it)");
  for (auto d : shape)
    if (d < 0) throw ShapeError("reshape: negative dimension in " + shape_str(shape));
  if (num_elements(shape) != size_)
    throw ShapeError("reshape: cannot reshape " + str() + " to " + shape_str(shape));
  Array out(std::move(*this));
  out.shape_ = std::move(shape);
  return out;
}

Array Array::slice_rows(std::int64_t begin, std::int64_t end, const Device& device) const {
  check_storage();
  if (ndim() == 0) throw ShapeError("slice_rows: " + str() + " has no leading axis");
  if (begin < 0 || end < begin || end > shape_[0])
    throw ShapeError("slice_rows: rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") are out of range for " + str());
  Shape s = shape_;
  s[0] = end - begin;
  Array out(s, dtype_, device);
  std::size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<std::size_t>(shape_[0]);
  copy_bytes(out.data_, device, static_cast<const char*>(data_) + static_cast<std::size_t>(begin) * row_bytes,
             device_, out.nbytes());
  return out;
}

namespace detail {
AllocationHook* set_allocation_hook(AllocationHook* hook) noexcept {
  AllocationHook* previous = tls_hook;
  tls_hook = hook;
  return previous;
}
std::uint64_t allocation_count() noexcept { return tls_allocations; }
std::size_t release_cached_host_memory(std::size_t bytes) noexcept {
  return host_cache_release(rounded_bytes(bytes));  // (the size host_alloc is asked for)
}
bool is_provided(const Array& a) noexcept { return a.provided_; }

std::uint64_t trace_tag(const Array& a) noexcept { return a.trace_; }
void set_trace_tag(Array& a, std::uint64_t tag) noexcept { a.trace_ = tag; }
}  // namespace detail

std::string Array::signature() const { return std::string(name(dtype_)) + shape_str(shape_); }

std::string Array::str() const { return signature() + " on " + device_.str(); }

Array concatenate(const std::vector<const Array*>& parts, const Device& device, bool stacked) {
  if (parts.empty()) throw ShapeError("concatenate: no arrays");
  const Array& first = *parts[0];
  Shape tail = first.shape();
  if (!stacked) {
    if (tail.empty()) throw ShapeError("concatenate: scalars have no leading axis (use stacked)");
    tail.erase(tail.begin());
  }
  std::int64_t rows = 0;
  for (const Array* p : parts) {
    Shape t = p->shape();
    if (!stacked && !t.empty()) t.erase(t.begin());
    if (p->dtype() != first.dtype() || t != tail || (!stacked && p->ndim() == 0))
      throw ShapeError("concatenate: " + p->str() + " does not fit " + first.str());
    rows += stacked ? 1 : p->shape()[0];
  }
  Shape out_shape = tail;
  out_shape.insert(out_shape.begin(), rows);
  Array out = Array::uninitialized(out_shape, first.dtype(), device);  // the parts cover it
  char* dst = static_cast<char*>(out.raw_data());
  for (const Array* p : parts) {
    copy_bytes(dst, device, p->raw_data(), p->device(), p->nbytes());
    dst += p->nbytes();
  }
  return out;
}

}  // namespace pmap
