// Array: a dense, contiguous, row-major n-d buffer of one dtype on one device. Move-only; copies are
// explicit (copy(), to(), copy_from()). CPU arrays live in 64-byte aligned host memory, or in pinned
// (page-locked) host memory for Array::pinned, which GPUs copy from and to asynchronously. Allocating
// and the blocking copies raise CaptureError while the calling thread captures a step into a graph.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <pmap/device.h>
#include <pmap/dtype.h>
#include <pmap/error.h>

namespace pmap {

using Shape = std::vector<std::int64_t>;
class Array;

namespace detail {
// The trace tag of an Array (include/pmap/detail/trace.h): 0 for every array no transformation traces.
// A tagged array is a value inside a function being differentiated; its storage belongs to that trace.
// A tag with kBatchedTag set is a value inside vmap: it stands for one member's value of a stacked array
// the transformation holds, has the member's shape and no storage of its own (reading or writing its
// elements raises ValueError; the ops that see every member are the transformation's).
inline constexpr std::uint64_t kBatchedTag = std::uint64_t{1} << 63;
std::uint64_t trace_tag(const Array& a) noexcept;
void set_trace_tag(Array& a, std::uint64_t tag) noexcept;
bool is_provided(const Array& a) noexcept;  // pmap/detail/allocation.h
}  // namespace detail

std::int64_t num_elements(const Shape& shape);  // product of dims; 1 for a scalar shape ()
std::string shape_str(const Shape& shape);      // "(2, 3)", "(1003,)", "()" (Python's tuples)

class Array {
 public:
  Array() = default;  // an empty handle: valid() is false
  // A zero-filled array. Throws ShapeError for negative dims.
  Array(Shape shape, DType dtype, Device device = {});
  // A zero-filled host array in pinned memory (cudaHostAlloc) when a GPU is usable, else in ordinary host
  // memory: the staging buffer of asynchronous host <-> GPU copies. Its device is the host (cpu:0).
  static Array pinned(Shape shape, DType dtype);
  // An array whose elements are not set (torch.empty): for outputs a kernel writes whole. Where the
  // environment sets PMAPCC_POISON_UNINITIALIZED=1 (the test suite does) every byte is 0xff instead (NaN
  // as floats), so an element left unwritten shows.
  static Array uninitialized(Shape shape, DType dtype, Device device = {});
  // An array over memory it does not own: `data` (nbytes() bytes on `device`, or pinned host memory as a
  // cpu array) stays the caller's, and freeing the array frees nothing. The caller keeps the memory alive
  // for the array's lifetime. For handing a buffer planned elsewhere (a layer's activations) to the
  // collectives without a copy. Throws ShapeError for negative dims, ValueError for a null data pointer
  // with elements.
  static Array borrow(void* data, Shape shape, DType dtype, Device device = {});
  Array(Array&&) noexcept;
  Array& operator=(Array&&) noexcept;
  Array(const Array&) = delete;  // copies are explicit: copy(), to()
  Array& operator=(const Array&) = delete;
  ~Array();

  // A new array on `device` holding `values` (host memory) in `shape`; sizes must agree.
  template <Element T>
  static Array from_host(std::span<const T> values, Shape shape, Device device = {}) {
    Array a(std::move(shape), dtype_of<T>, device);
    a.copy_from_host(values.data(), values.size_bytes());
    return a;
  }
  template <Element T>
  static Array from_host(const std::vector<T>& values, Shape shape, Device device = {}) {
    return from_host(std::span<const T>(values), std::move(shape), device);
  }
  template <Element T> static Array scalar(T value, Device device = {}) {
    return from_host(std::span<const T>(&value, 1), Shape{}, device);
  }

  bool valid() const { return data_ != nullptr || (dtype_set_ && size() == 0); }
  bool is_pinned() const { return pinned_; }
  bool owns_data() const { return owned_; }  // false for Array::borrow
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int axis) const;  // negative axes count from the end
  std::int64_t size() const { return size_; }  // elements
  std::size_t nbytes() const { return static_cast<std::size_t>(size_) * size_of(dtype_); }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }

  // Raw storage (a device pointer for CUDA arrays). A value inside vmap has none: ValueError.
  void* raw_data() {
    check_storage();
    return data_;
  }
  const void* raw_data() const {
    check_storage();
    return data_;
  }
  // Typed storage; throws ShapeError when T is not this array's dtype.
  template <Element T> T* data() {
    check_storage();
    check_dtype(dtype_of<T>);
    return static_cast<T*>(data_);
  }
  template <Element T> const T* data() const {
    check_storage();
    check_dtype(dtype_of<T>);
    return static_cast<const T*>(data_);
  }

  // Blocking copies between this array and host memory; `nbytes` must equal this->nbytes().
  void copy_to_host(void* dst, std::size_t nbytes) const;
  void copy_from_host(const void* src, std::size_t nbytes);
  // Blocking copies of only the first `nbytes` bytes (at most nbytes()): a batch smaller than the buffer
  // allocated up front for the largest one. ShapeError when nbytes is too large.
  void copy_prefix_to_host(void* dst, std::size_t nbytes) const;
  void copy_prefix_from_host(const void* src, std::size_t nbytes);
  template <Element T> std::vector<T> to_vector() const {
    check_dtype(dtype_of<T>);
    std::vector<T> out(static_cast<std::size_t>(size_));
    copy_to_host(out.data(), nbytes());
    return out;
  }
  template <Element T> T item() const {  // the single element of a size-1 array
    if (size_ != 1) throw ShapeError("item() needs an array of one element, got shape " + shape_str(shape_));
    return to_vector<T>()[0];
  }

  Array copy() const;  // same device (inside grad or vmap: the same value, which the transformation follows)
  Array to(const Device& device) const;     // a copy on `device`; no transformation follows it there
  void copy_from(const Array& src);         // same shape and dtype, any devices; blocking
  void fill_zero();
  // Same element count; moves the storage. An array inside a function being differentiated raises
  // ValueError: reshape it with pmap::ops::reshape there, which the gradient follows.
  Array reshape(Shape shape) &&;
  // Rows [begin, end) of the leading axis, copied to `device`.
  Array slice_rows(std::int64_t begin, std::int64_t end, const Device& device) const;
  std::string signature() const;  // "f32(2, 3)", "f32(1003,)", "f32()": dtype and shape
  std::string str() const;        // "f32(2, 3) on cpu:0"

 private:
  // An array of this shape, dtype and device with no storage yet (`who` names the caller when a dimension
  // is negative): what the named constructors start from.
  static Array header(Shape shape, DType dtype, Device device, const char* who);
  void check_dtype(DType want) const;
  void check_storage() const {
    if ((trace_ & detail::kBatchedTag) != 0) [[unlikely]] no_storage();
  }
  [[noreturn]] void no_storage() const;
  void allocate();
  void release() noexcept;
  friend std::uint64_t detail::trace_tag(const Array& a) noexcept;
  friend void detail::set_trace_tag(Array& a, std::uint64_t tag) noexcept;
  friend bool detail::is_provided(const Array& a) noexcept;

  Shape shape_;
  std::int64_t size_ = 0;
  DType dtype_ = DType::f32;
  bool dtype_set_ = false;
  Device device_;
  bool pinned_ = false;
  bool owned_ = true;
  bool provided_ = false;  // the storage is an AllocationHook's (pmap/detail/allocation.h): never freed here
  void* data_ = nullptr;
  std::uint64_t trace_ = 0;  // detail::trace_tag
};

// Concatenates arrays (same dtype, same trailing dims) along the leading axis onto `device`.
// stacked=true first adds a new leading axis of size parts.size() (all parts must share one shape).
Array concatenate(const std::vector<const Array*>& parts, const Device& device, bool stacked = false);

}  // namespace pmap
