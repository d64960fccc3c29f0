// Device-side data movement of the thread hub's collectives for logical devices sharing one GPU: the hub
// meets the threads on the host, then each rank reduces its slice of every rank's buffer on its own
// stream, combining ranks in order 0..n-1 (bitwise the host hub's results; the kernels are in
// src/device_kernels.h, where the CPU checks them). Also the device division pmean uses.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/detail/launch_gpu.cuh>
#include <pmap/error.h>

#include "cuda_seam.h"
#include "device_kernels.h"
#include "thread_hub.h"

namespace pmap::detail {
namespace {

template <class F> void with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::i32: return f(std::int32_t{});
    case DType::i64: return f(std::int64_t{});
    case DType::u32: return f(std::uint32_t{});
    case DType::u8: return f(std::uint8_t{});
  }
}

// Launches the reduction of [src_off, src_off + len) of every send into outs at dst_off.
void launch_reduce(const CollectiveOp& op, const std::vector<const void*>& sends, const std::vector<void*>& outs,
                   std::size_t src_off, std::size_t dst_off, std::size_t len) {
  if (len == 0) return;
  RankPointers p{};
  p.n = static_cast<int>(sends.size());
  for (std::size_t k = 0; k < sends.size(); ++k) p.in[k] = sends[k];
  for (std::size_t k = 0; k < outs.size(); ++k) p.out[k] = outs[k];
  with_type(op.dtype, [&](auto t) {
    const ReduceRanks<decltype(t)> kernel{p, static_cast<int>(outs.size()), src_off, dst_off, op.reduce};
    gpu_launch(kernel, len, hub_grid(len), current_stream());
  });
}

void copy_async(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  PMAPCC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, current_stream()));
}

}  // namespace

void device_execute(const CollectiveOp& op, const std::vector<const void*>& sends, const std::vector<void*>& recvs,
                    int rank, bool synchronize) {
  const std::size_t n = sends.size();
  if (n > static_cast<std::size_t>(kMaxDeviceRanks)) {
    throw NotAvailable(std::string(op.name) + ": device collectives combine at most " + std::to_string(kMaxDeviceRanks) +
                       " logical devices on one GPU, got " + std::to_string(n));
  }
  const auto r = static_cast<std::size_t>(rank);
  const std::size_t esize = size_of(op.dtype);
  switch (op.kind) {
    case CollectiveKind::all_reduce: {
      const std::size_t begin = op.count * r / n, end = op.count * (r + 1) / n;
      launch_reduce(op, sends, recvs, begin, begin, end - begin);
      break;
    }
    case CollectiveKind::reduce_scatter:
      launch_reduce(op, sends, {op.recv}, r * op.count, 0, op.count);
      break;
    case CollectiveKind::all_gather:
      for (std::size_t k = 0; k < n; ++k) copy_async(static_cast<char*>(recvs[k]) + r * op.count * esize, op.send, op.count * esize);
      break;
    case CollectiveKind::broadcast:
      copy_async(op.recv, sends[static_cast<std::size_t>(op.root)], op.count * esize);
      break;
    case CollectiveKind::permute:
      if (op.recv_from >= 0) {
        copy_async(op.recv, sends[static_cast<std::size_t>(op.recv_from)], op.count * esize);
      } else if (op.count > 0) {
        PMAPCC_CUDA_CHECK(cudaMemsetAsync(op.recv, 0, op.count * esize, current_stream()));
      }
      break;
    case CollectiveKind::barrier:
      break;
  }
  if (synchronize) PMAPCC_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

void cuda_divide(int ordinal, void* x, std::size_t count, DType dtype, double n) {
  if (count == 0) return;
  DeviceScope scope(ordinal);
  const cudaStream_t stream = stream_for_gpu(ordinal);
  if (dtype == DType::f32) {
    gpu_launch(DivideBy<float>{static_cast<float*>(x), static_cast<float>(n)}, count, hub_grid(count), stream);
  } else if (dtype == DType::f64) {
    gpu_launch(DivideBy<double>{static_cast<double*>(x), n}, count, hub_grid(count), stream);
  } else {
    throw ValueError("cuda_divide: needs f32 or f64, got " + std::string(name(dtype)));
  }
}

void cuda_multiply(int ordinal, void* x, std::size_t count, DType dtype, double w) {
  if (count == 0) return;
  DeviceScope scope(ordinal);
  const cudaStream_t stream = stream_for_gpu(ordinal);
  if (dtype == DType::f32) {
    gpu_launch(MultiplyBy<float>{static_cast<float*>(x), static_cast<float>(w)}, count, hub_grid(count), stream);
  } else if (dtype == DType::f64) {
    gpu_launch(MultiplyBy<double>{static_cast<double*>(x), w}, count, hub_grid(count), stream);
  } else {
    throw ValueError("cuda_multiply: needs f32 or f64, got " + std::string(name(dtype)));
  }
}

void cuda_to_order_keys(void* dst, const void* src, std::size_t count, DType dtype, bool nan_wins_max,
                        StreamHandle stream) {
  if (count == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32) {
    gpu_launch(ToOrderKeys<float, std::int32_t>{src, dst, nan_wins_max}, count, hub_grid(count), s);
  } else if (dtype == DType::f64) {
    gpu_launch(ToOrderKeys<double, std::int64_t>{src, dst, nan_wins_max}, count, hub_grid(count), s);
  } else {
    throw ValueError("cuda_to_order_keys: needs f32 or f64, got " + std::string(name(dtype)));
  }
}

void cuda_from_order_keys(void* buffer, std::size_t count, DType dtype, StreamHandle stream) {
  if (count == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32) {
    gpu_launch(FromOrderKeys<float, std::int32_t>{buffer}, count, hub_grid(count), s);
  } else if (dtype == DType::f64) {
    gpu_launch(FromOrderKeys<double, std::int64_t>{buffer}, count, hub_grid(count), s);
  } else {
    throw ValueError("cuda_from_order_keys: needs f32 or f64, got " + std::string(name(dtype)));
  }
}

}  // namespace pmap::detail
