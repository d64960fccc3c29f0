// The rules the CUDA stand-in (tests/standin) keeps, one test case each, written against CUDA's API so that
// they also build against the real toolkit and run on a GPU, where they check the model (a conformance
// run: scripts/gpu_checks.sh). What needs the stand-in's own hooks (a stream held back by a gate, fault
// injection, reading quarantined memory) is compiled for the stand-in only. Cases that need two GPUs say
// so and skip with one (CTest runs them with PMAPCC_STANDIN_GPUS=2).
#include "cuda_testing.h"

#if PMAPCC_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include <pmap/detail/cuda_stream.h>
#include <pmap/feed.h>

#include <pmapcc/core/ops.h>

#include "src/cuda_seam.h"

#if PMAPCC_HAVE_NCCL
#include <nccl.h>

#include <cmath>
#include <limits>
#endif

#if defined(PMAPCC_CUDA_STANDIN)
#include <pmapcc_standin.h>
#endif

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

// Device memory freed at scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  template <class T> T* as() const { return static_cast<T*>(p); }
};

struct Stream {
  cudaStream_t s = nullptr;
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    REQUIRE(cudaStreamCreateWithFlags(&s, flags) == cudaSuccess);
  }
  ~Stream() { cudaStreamDestroy(s); }
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess); }
  ~Event() { cudaEventDestroy(e); }
};

std::vector<unsigned char> read_back(const void* device, std::size_t bytes) {
  std::vector<unsigned char> host(bytes);
  REQUIRE(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

bool all_equal(const std::vector<unsigned char>& v, unsigned char x) {
  for (unsigned char c : v)
    if (c != x) return false;
  return true;
}

bool two_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) cudaGetLastError();
  if (n >= 2) return true;
  MESSAGE("one GPU: the two-GPU part of this rule is skipped (PMAPCC_STANDIN_GPUS=2 runs it on the stand-in)");
  return false;
}

#if defined(PMAPCC_CUDA_STANDIN)
// Holds a stream back: work queued after block() waits until open() (the stand-in's launch of a body that
// blocks; a real GPU would need a spinning kernel).
class Gate {
 public:
  void block(cudaStream_t stream) {
    std::shared_future<void> f = future_;
    REQUIRE(pmapcc_standin::launch(stream, [f] { f.wait(); }) == cudaSuccess);
  }
  void open() {
    if (!opened_) promise_.set_value();
    opened_ = true;
  }
  ~Gate() { open(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
  bool opened_ = false;
};

// True when [p, p + 1) cannot be read by this process (a write from it into a pipe fails with EFAULT):
// how a test sees quarantined memory without faulting.
bool unreadable(const void* p) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const ssize_t n = write(fds[1], p, 1);
  const int err = errno;
  close(fds[0]);
  close(fds[1]);
  return n < 0 && err == EFAULT;
}
#endif

}  // namespace

TEST_CASE("cuda stand-in rules: a stream runs its work in order, and copies and fills check their pointers") {
  PMAPCC_REQUIRE_GPU();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Stream s;
  const std::size_t n = 4096;
  DeviceBuffer a(n), b(n);
  REQUIRE(cudaMemsetAsync(a.p, 1, n, s.s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, s.s) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(a.p, 2, n, s.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  CHECK(all_equal(read_back(b.p, n), 1));
  CHECK(all_equal(read_back(a.p, n), 2));

  std::vector<unsigned char> host(n, 9);
  // Copy kinds against the pointers, and sizes against allocations: cudaErrorInvalidValue, as CUDA's.
  CHECK(cudaMemcpyAsync(host.data(), a.p, n, cudaMemcpyHostToDevice, s.s) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
  CHECK(cudaMemcpyAsync(a.p, host.data(), n, cudaMemcpyDeviceToHost, s.s) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(b.p, a.p, n + 1, cudaMemcpyDeviceToDevice, s.s) == cudaErrorInvalidValue);
  CHECK(cudaMemsetAsync(host.data(), 0, n, s.s) == cudaErrorInvalidValue);
  cudaGetLastError();
  // Pageable host memory: the source is taken at the call, so it may change right after.
  REQUIRE(cudaMemcpyAsync(a.p, host.data(), n, cudaMemcpyHostToDevice, s.s) == cudaSuccess);
  std::fill(host.begin(), host.end(), 0);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  CHECK(all_equal(read_back(a.p, n), 9));
  // A strided copy (the all_gather-along-an-axis block copy).
  REQUIRE(cudaMemcpy2DAsync(b.p, 8, a.p, 4, 4, 16, cudaMemcpyDeviceToDevice, s.s) == cudaSuccess);
  CHECK(cudaMemcpy2DAsync(b.p, 2, a.p, 4, 4, 16, cudaMemcpyDeviceToDevice, s.s) == cudaErrorInvalidPitchValue);
  cudaGetLastError();
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  int x = 0;
  CHECK(cudaFree(&x) == cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_CASE("cuda stand-in rules: devices, streams and events name their GPU, a launch needs its GPU's stream") {
  PMAPCC_REQUIRE_GPU();
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(cudaSetDevice(count) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Stream s0;
  int device = -1;
  REQUIRE(cudaStreamGetDevice(s0.s, &device) == cudaSuccess);
  CHECK(device == 0);
  if (!two_gpus()) return;
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  Stream s1;
  REQUIRE(cudaStreamGetDevice(s1.s, &device) == cudaSuccess);
  CHECK(device == 1);
  DeviceBuffer x(64 * sizeof(float));
  REQUIRE(cudaMemsetAsync(x.p, 0, 64 * sizeof(float), s1.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s1.s) == cudaSuccess);
  // A kernel of GPU 1 launched into GPU 0's stream while GPU 1 is current: an invalid resource handle.
  {
    pmap::detail::StreamScope scope(s0.s);
    CHECK_THROWS_AS(pmap::detail::cuda_to_order_keys(x.p, x.p, 64, pmap::DType::f32, true, s0.s), pmap::CudaError);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  // An event records only on a stream of its own GPU.
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Event e0;
  CHECK(cudaEventRecord(e0.e, s1.s) == cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  // Peer copies name each pointer's GPU.
  DeviceBuffer y(64 * sizeof(float));
  CHECK(cudaMemcpyPeerAsync(y.p, 0, x.p, 1, 64 * sizeof(float), s0.s) == cudaSuccess);
  CHECK(cudaMemcpyPeerAsync(y.p, 1, x.p, 0, 64 * sizeof(float), s0.s) == cudaErrorInvalidValue);
  cudaGetLastError();
  REQUIRE(cudaStreamSynchronize(s0.s) == cudaSuccess);
}

TEST_CASE("cuda stand-in rules: graph capture records, refuses what CUDA refuses, and replays") {
  PMAPCC_REQUIRE_GPU();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Stream s;
  const std::size_t n = 1024;
  DeviceBuffer a(n), b(n);
  REQUIRE(cudaMemsetAsync(a.p, 0, n, s.s) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(b.p, 0, n, s.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);

  SUBCASE("captured work runs only when the graph is launched, each time it is") {
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    REQUIRE(cudaStreamIsCapturing(s.s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusActive);
    REQUIRE(cudaMemsetAsync(a.p, 5, n, s.s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, s.s) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);
    CHECK(all_equal(read_back(b.p, n), 0));  // not run by the capture
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(all_equal(read_back(b.p, n), 5));
    REQUIRE(cudaMemsetAsync(b.p, 0, n, s.s) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(all_equal(read_back(b.p, n), 5));
    REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  }
  SUBCASE("allocation, synchronization and queries invalidate the capture") {
    for (int which = 0; which < 3; ++which) {
      CAPTURE(which);
      REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      void* p = nullptr;
      cudaError_t e = cudaSuccess;
      switch (which) {
        case 0: e = cudaMalloc(&p, 256); break;
        case 1: e = cudaStreamSynchronize(s.s); break;
        case 2: e = cudaStreamQuery(s.s); break;
      }
      CHECK(e != cudaSuccess);
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      REQUIRE(cudaStreamIsCapturing(s.s, &status) == cudaSuccess);
      CHECK(status == cudaStreamCaptureStatusInvalidated);
      cudaGraph_t graph = nullptr;
      CHECK(cudaStreamEndCapture(s.s, &graph) == cudaErrorStreamCaptureInvalidated);
      CHECK(graph == nullptr);
      cudaGetLastError();
      if (p != nullptr) cudaFree(p);
    }
  }
  // CUDA 13.0 on an H200 (2026-11-27) recorded a copy from pageable memory and left a non-blocking stream's
  // capture valid when the legacy stream was used: the stand-in follows what the GPU did.
  SUBCASE("pageable copies are recorded and replayed; the legacy stream leaves a non-blocking capture valid") {
    DeviceBuffer c(n);
    std::vector<unsigned char> in(n, 9), out(n, 0xEE);
    REQUIRE(cudaMemsetAsync(b.p, 3, n, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK(cudaMemcpyAsync(a.p, in.data(), n, cudaMemcpyHostToDevice, s.s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(out.data(), b.p, n, cudaMemcpyDeviceToHost, s.s) == cudaSuccess);
    CHECK(cudaMemsetAsync(c.p, 4, n, nullptr) == cudaSuccess);  // the legacy stream: runs now, not recorded
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    REQUIRE(cudaStreamIsCapturing(s.s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusActive);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(all_equal(read_back(c.p, n), 4));
    CHECK(all_equal(read_back(a.p, n), 0));  // recorded, not run
    CHECK(all_equal(out, 0xEE));
    std::fill(in.begin(), in.end(), 11);  // the graph reads the host memory when it runs
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(all_equal(read_back(a.p, n), 11));
    CHECK(all_equal(out, 3));
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  }
  SUBCASE("the legacy stream invalidates a blocking stream's capture") {
    Stream blocking(cudaStreamDefault);
    REQUIRE(cudaStreamBeginCapture(blocking.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK(cudaMemsetAsync(a.p, 0, n, nullptr) == cudaErrorStreamCaptureImplicit);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    REQUIRE(cudaStreamIsCapturing(blocking.s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(blocking.s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    cudaGetLastError();
  }
  SUBCASE("relaxed mode allows an allocation; thread-local mode leaves other threads alone") {
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 256) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);

    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    cudaError_t other = cudaErrorUnknown;
    std::thread([&] {
      void* q = nullptr;
      if (cudaSetDevice(0) == cudaSuccess) other = cudaMalloc(&q, 256);
      if (q != nullptr) cudaFree(q);
    }).join();
    CHECK(other == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  }
  // As CUDA 13.0 on an H200 did (2026-11-27): another thread's cudaStreamEndCapture fails and ends the
  // capture all the same, with no graph.
  SUBCASE("global mode: another thread may not end a valid capture, and its attempt discards it") {
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(a.p, 6, n, s.s) == cudaSuccess);
    cudaError_t end = cudaSuccess;
    cudaGraph_t other_graph = nullptr;
    std::thread([&] {
      if (cudaSetDevice(0) == cudaSuccess) end = cudaStreamEndCapture(s.s, &other_graph);
    }).join();
    CHECK(end == cudaErrorStreamCaptureWrongThread);
    CHECK(other_graph == nullptr);
    cudaGetLastError();
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    REQUIRE(cudaStreamIsCapturing(s.s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusNone);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s.s, &graph) == cudaErrorIllegalState);  // nothing left to end
    cudaGetLastError();
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);  // the stream works again, and ran nothing recorded
    CHECK(all_equal(read_back(a.p, n), 0));
  }
  // As CUDA 13.0 on an H200 did (2026-11-27): an invalidated capture ends from any thread.
  SUBCASE("global mode: another thread's allocation invalidates it, and an invalidated capture ends anywhere") {
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    cudaError_t other = cudaSuccess, end = cudaSuccess;
    std::thread([&] {
      void* q = nullptr;
      cudaGraph_t g = nullptr;
      if (cudaSetDevice(0) == cudaSuccess) other = cudaMalloc(&q, 256);
      end = cudaStreamEndCapture(s.s, &g);
      if (q != nullptr) cudaFree(q);
    }).join();
    CHECK(other == cudaErrorStreamCaptureUnsupported);
    CHECK(end == cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s.s, &graph) == cudaErrorIllegalState);  // no capture left to end
    cudaGetLastError();
  }
  SUBCASE("a stream forked into a capture must join back") {
    Stream side;
    Event fork, join;
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    REQUIRE(cudaEventRecord(fork.e, s.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side.s, fork.e, 0) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(b.p, 7, n, side.s) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s.s, &graph) == cudaErrorStreamCaptureUnjoined);
    cudaGetLastError();

    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    REQUIRE(cudaEventRecord(fork.e, s.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side.s, fork.e, 0) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(b.p, 7, n, side.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(join.e, side.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(s.s, join.e, 0) == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(all_equal(read_back(b.p, n), 7));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeThreadLocal) != cudaSuccess);  // legacy: never
  cudaGetLastError();
}

TEST_CASE("cuda stand-in rules: cuBLAS checks its arguments and runs on its handle's stream") {
  PMAPCC_REQUIRE_GPU();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Stream s;
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasSetStream(h, s.s) == CUBLAS_STATUS_SUCCESS);
  const int m = 3, n = 2, k = 4;
  std::vector<float> ha(m * k), hb(k * n), hc(m * n, -1.0f);
  for (std::size_t i = 0; i < ha.size(); ++i) ha[i] = 0.5f * static_cast<float>(i) - 1.0f;
  for (std::size_t i = 0; i < hb.size(); ++i) hb[i] = 0.25f * static_cast<float>(i) + 0.5f;
  DeviceBuffer a(ha.size() * 4), b(hb.size() * 4), c(hc.size() * 4);
  REQUIRE(cudaMemcpy(a.p, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(b.p, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  const float one = 1.0f, zero = 0.0f;
  // Column-major: lda >= m for A (m x k), ldb >= k, ldc >= m.
  CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a.as<float>(), m - 1, 0, b.as<float>(),
                                  k, 0, &zero, c.as<float>(), m, 0, 1) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a.as<float>(), m, 0, b.as<float>(),
                                  k - 1, 0, &zero, c.as<float>(), m, 0, 1) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, n, k, &one, a.as<float>(), m, 0, b.as<float>(),
                                  k, 0, &zero, c.as<float>(), m, 0, 1) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a.as<float>(), m, 0, b.as<float>(), k,
                                    0, &zero, c.as<float>(), m, 0, 1) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  REQUIRE(cudaMemcpy(hc.data(), c.p, hc.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int col = 0; col < n; ++col)
    for (int row = 0; row < m; ++row) {
      double sum = 0;
      for (int l = 0; l < k; ++l) sum += static_cast<double>(ha[row + l * m]) * hb[l + col * k];
      CHECK(hc[row + col * m] == doctest::Approx(sum).epsilon(1e-6));
    }
  cublasDestroy(h);
}


TEST_CASE("cuda: pmap returns when its devices' work is done, so the host reads complete results") {
  // Found by scripts/mutate_cuda_orchestration.py: without pmap's final stream synchronization every
  // other test still passed (they read results inside the pmapped function, or after a collective).
  PMAPCC_REQUIRE_GPU();
  int gpus = 0;
  REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
  std::vector<pmap::Device> devices;
  for (int d = 0; d < gpus && d < 2; ++d) devices.push_back(pmap::Device{pmap::DeviceKind::cuda, d, 0});
  pmap::Mesh mesh(devices, "i");
  const std::int64_t n = 1 << 20;
  std::vector<pmap::Array> inputs;  // made outside: the function frees nothing (a free would synchronize)
  for (const pmap::Device& d : devices)
    inputs.push_back(pmap::Array::from_host(std::vector<float>(static_cast<std::size_t>(n), 0.5f), {n}, d));
  const float expected = std::exp(0.5f);
  for (int round = 0; round < 3; ++round) {
    auto out = pmap::pmap([&]() {
      return pmap::ops::exp(inputs[static_cast<std::size_t>(pmap::axis_index("i"))]);  // still queued at return
    }, mesh, "i")();
    for (std::size_t d = 0; d < devices.size(); ++d) {
      const std::vector<float> v = out[d].to_vector<float>();
      // (within an ulp or two: a GPU's expf is not the host's)
      auto close = [&](float x) { return std::fabs(x - expected) <= 1e-6f * expected; };
      CHECK(std::count_if(v.begin(), v.end(), close) == n);
    }
  }
}

#if PMAPCC_HAVE_NCCL

namespace {

// Two ranks, one per GPU, driven from this thread (NCCL: then every call on both goes in a group).
struct TwoRanks {
  ncclComm_t comm[2] = {nullptr, nullptr};
  cudaStream_t stream[2] = {nullptr, nullptr};
  TwoRanks() {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      REQUIRE(cudaSetDevice(r) == cudaSuccess);
      REQUIRE(cudaStreamCreateWithFlags(&stream[r], cudaStreamNonBlocking) == cudaSuccess);
      const ncclResult_t init = ncclCommInitRankConfig(&comm[r], 2, id, r, &config);
      REQUIRE((init == ncclSuccess || init == ncclInProgress));
    }
    const ncclResult_t end = ncclGroupEnd();
    REQUIRE((end == ncclSuccess || end == ncclInProgress));
    for (int r = 0; r < 2; ++r) wait_ready(comm[r]);
  }
  ~TwoRanks() {
    for (int r = 0; r < 2; ++r) {
      cudaSetDevice(r);
      if (comm[r] != nullptr) ncclCommDestroy(comm[r]);
      cudaStreamDestroy(stream[r]);
    }
    cudaSetDevice(0);
  }
  static void wait_ready(ncclComm_t c) {
    ncclResult_t state = ncclInProgress;
    for (int i = 0; i < 200000 && state == ncclInProgress; ++i) {
      REQUIRE(ncclCommGetAsyncError(c, &state) == ncclSuccess);
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    REQUIRE(state == ncclSuccess);
  }
  void sync() {
    for (int r = 0; r < 2; ++r) {
      REQUIRE(cudaSetDevice(r) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(stream[r]) == cudaSuccess);
    }
  }
};

std::vector<float> floats_of(const void* device, std::size_t n) {
  const std::vector<unsigned char> bytes = read_back(device, n * sizeof(float));
  std::vector<float> out(n);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace

TEST_CASE("cuda stand-in rules: NCCL ranks join by unique id, meet on their streams and reduce as NCCL does") {
  PMAPCC_REQUIRE_GPU();
  if (!two_gpus()) return;
  TwoRanks t;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> host[2] = {{1.0f, nan, 2.0f, -3.0f}, {10.0f, 5.0f, nan, 4.0f}};
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  for (int r = 0; r < 2; ++r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    in.push_back(std::make_unique<DeviceBuffer>(16 * sizeof(float)));
    out.push_back(std::make_unique<DeviceBuffer>(16 * sizeof(float)));
    REQUIRE(cudaMemcpy(in[r]->p, host[r].data(), 4 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  // A group on both ranks, then NCCL's rule for nonblocking communicators: nothing more on their streams
  // until they read ncclSuccess (NCCL 2.28 puts a group of a nonblocking communicator of several ranks on
  // the streams later, from its own thread: the group end returns ncclInProgress; review N1).
  auto both = [&](auto call) {
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      REQUIRE(cudaSetDevice(r) == cudaSuccess);
      const ncclResult_t got = call(r);
      REQUIRE((got == ncclSuccess || got == ncclInProgress));
    }
    CHECK(ncclGroupEnd() == ncclInProgress);
    for (int r = 0; r < 2; ++r) TwoRanks::wait_ready(t.comm[r]);
    t.sync();
  };
  both([&](int r) { return ncclAllReduce(in[r]->p, out[r]->p, 4, ncclFloat32, ncclSum, t.comm[r], t.stream[r]); });
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> v = floats_of(out[r]->p, 4);
    CHECK(v[0] == 11.0f);
    CHECK(std::isnan(v[1]));
    CHECK(v[3] == 1.0f);
  }
  // NCCL's max and min on floats are fmaxf / fminf: a NaN loses (pmapcc's pmax/pmin send order keys).
  both([&](int r) { return ncclAllReduce(in[r]->p, out[r]->p, 4, ncclFloat32, ncclMax, t.comm[r], t.stream[r]); });
  CHECK(floats_of(out[1]->p, 4) == std::vector<float>{10.0f, 5.0f, 2.0f, 4.0f});
  both([&](int r) { return ncclAllGather(in[r]->p, out[r]->p, 1, ncclFloat32, t.comm[r], t.stream[r]); });
  CHECK(floats_of(out[0]->p, 2) == std::vector<float>{1.0f, 10.0f});
  both([&](int r) { return ncclBroadcast(in[r]->p, out[r]->p, 1, ncclFloat32, 1, t.comm[r], t.stream[r]); });
  CHECK(floats_of(out[0]->p, 1) == std::vector<float>{10.0f});
  both([&](int r) { return ncclReduceScatter(in[r]->p, out[r]->p, 1, ncclFloat32, ncclSum, t.comm[r], t.stream[r]); });
  CHECK(floats_of(out[0]->p, 1) == std::vector<float>{11.0f});  // rank r: the sum of every rank's element r
  CHECK(std::isnan(floats_of(out[1]->p, 1)[0]));
  // Sends and receives in a group: a swap.
  both([&](int r) {
    ncclSend(in[r]->p, 1, ncclFloat32, 1 - r, t.comm[r], t.stream[r]);
    return ncclRecv(out[r]->p, 1, ncclFloat32, 1 - r, t.comm[r], t.stream[r]);
  });
  CHECK(floats_of(out[0]->p, 1) == std::vector<float>{10.0f});
  CHECK(floats_of(out[1]->p, 1) == std::vector<float>{1.0f});
  // A split: rank 0 alone in colour 7, rank 1 in none.
  ncclComm_t child[2] = {nullptr, nullptr};
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    const ncclResult_t got = ncclCommSplit(t.comm[r], r == 0 ? 7 : NCCL_SPLIT_NOCOLOR, 0, &child[r], &config);
    REQUIRE((got == ncclSuccess || got == ncclInProgress));
  }
  const ncclResult_t end = ncclGroupEnd();
  REQUIRE((end == ncclSuccess || end == ncclInProgress));
  TwoRanks::wait_ready(t.comm[0]);
  TwoRanks::wait_ready(t.comm[1]);
  for (int i = 0; i < 200000 && std::atomic_ref<ncclComm_t>(child[0]).load() == nullptr; ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  REQUIRE(child[0] != nullptr);
  CHECK(child[1] == nullptr);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(ncclAllReduce(in[0]->p, out[0]->p, 4, ncclFloat32, ncclSum, child[0], t.stream[0]) == ncclSuccess);
  REQUIRE(cudaStreamSynchronize(t.stream[0]) == cudaSuccess);
  CHECK(floats_of(out[0]->p, 1) == std::vector<float>{1.0f});
  CHECK(ncclCommDestroy(child[0]) == ncclSuccess);
  CHECK(ncclAllReduce(in[0]->p, out[0]->p, 4, ncclNumTypes, ncclSum, t.comm[0], t.stream[0]) == ncclInvalidArgument);
}

TEST_CASE("cuda NCCL: a collective inside a stream capture of the user's own is refused, not captured") {
  // pmapcc's own captures refuse collectives before they reach NCCL; this is a capture begun with CUDA's
  // API on pmap::cuda_stream(), which only the NCCL communicator sees.
  PMAPCC_REQUIRE_GPU();
  if (!two_gpus()) return;
  std::vector<pmap::Device> gpus = pmap::local_devices(pmap::DeviceKind::cuda);
  gpus.resize(2);
  pmap::Mesh mesh(gpus, "i");
  pmap::pmap([&]() {
    pmap::Array x = pmap::Array::from_host(std::vector<float>(4, 1.0f), {4}, pmap::current_device());
    const auto stream = static_cast<cudaStream_t>(pmap::cuda_stream());
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK_THROWS_WITH_AS(pmap::psum_inplace(x, "i"), doctest::Contains("cannot be captured"), pmap::ValueError);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }, mesh, "i")();
}

#if defined(PMAPCC_CUDA_STANDIN)
TEST_CASE("cuda stand-in rules (stand-in only): a collective waits for its peers, an abort releases the waiter") {
  if (!two_gpus()) return;
  TwoRanks t;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  DeviceBuffer x(4 * sizeof(float));
  REQUIRE(cudaMemsetAsync(x.p, 0, 4 * sizeof(float), t.stream[0]) == cudaSuccess);
  // Nonblocking, two ranks: NCCL's thread puts it on the stream later (NCCL 2.28).
  REQUIRE(ncclAllReduce(x.p, x.p, 4, ncclFloat32, ncclSum, t.comm[0], t.stream[0]) == ncclInProgress);
  TwoRanks::wait_ready(t.comm[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(cudaStreamQuery(t.stream[0]) == cudaErrorNotReady);  // rank 1 never came: a hang on a GPU too
  REQUIRE(ncclCommAbort(t.comm[0]) == ncclSuccess);
  t.comm[0] = nullptr;
  CHECK(cudaStreamSynchronize(t.stream[0]) == cudaSuccess);
}

TEST_CASE("cuda stand-in rules (stand-in only): NCCL's thread launches later, in issue order, abort drops it") {
  if (!two_gpus()) return;
  std::vector<std::unique_ptr<DeviceBuffer>> x;
  {
    TwoRanks t;
    for (int r = 0; r < 2; ++r) {
      REQUIRE(cudaSetDevice(r) == cudaSuccess);
      x.push_back(std::make_unique<DeviceBuffer>(sizeof(float)));
      const float v = static_cast<float>(r + 1);
      REQUIRE(cudaMemcpy(x[r]->p, &v, sizeof v, cudaMemcpyHostToDevice) == cudaSuccess);
    }
    // Three groups issued back to back, none waited for: sum, product, sum, in place. Launched in issue
    // order they give ((1 + 2)^2) * 2 = 18; any other order gives another number (or a hang).
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclSum}) {
      REQUIRE(ncclGroupStart() == ncclSuccess);
      for (int r = 0; r < 2; ++r) {
        REQUIRE(cudaSetDevice(r) == cudaSuccess);
        REQUIRE(ncclAllReduce(x[r]->p, x[r]->p, 1, ncclFloat32, op, t.comm[r], t.stream[r]) == ncclSuccess);
      }
      CHECK(ncclGroupEnd() == ncclInProgress);
    }
    for (int r = 0; r < 2; ++r) TwoRanks::wait_ready(t.comm[r]);
    t.sync();
    for (int r = 0; r < 2; ++r) CHECK(floats_of(x[r]->p, 1) == std::vector<float>{18.0f});
    // Teardown with launches pending: destroy waits for them (~TwoRanks), so none reaches a stream after.
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      REQUIRE(cudaSetDevice(r) == cudaSuccess);
      REQUIRE(ncclAllReduce(x[r]->p, x[r]->p, 1, ncclFloat32, ncclSum, t.comm[r], t.stream[r]) == ncclSuccess);
    }
    CHECK(ncclGroupEnd() == ncclInProgress);
  }
  // Abort with a launch pending on one rank only: it is dropped or, if already launched, gives up.
  TwoRanks t;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(ncclAllReduce(x[0]->p, x[0]->p, 1, ncclFloat32, ncclSum, t.comm[0], t.stream[0]) == ncclInProgress);
  REQUIRE(ncclCommAbort(t.comm[0]) == ncclSuccess);
  t.comm[0] = nullptr;
  CHECK(cudaStreamSynchronize(t.stream[0]) == cudaSuccess);
}

TEST_CASE("cuda NCCL (stand-in only): a mesh whose communicators cannot talk fails when it is built") {
  // The split's barrier: a communicator that cannot run a collective fails the Mesh, not its first pmap.
  if (!two_gpus()) return;
  std::vector<pmap::Device> gpus = pmap::local_devices(pmap::DeviceKind::cuda);
  gpus.resize(2);
  pmapcc_standin::inject_fault("ncclAllReduce", ncclInternalError);
  CHECK_THROWS_WITH_AS(pmap::Mesh(gpus, "i"), doctest::Contains("ncclAllReduce"), pmap::NcclError);
  pmapcc_standin::clear_faults();
}

TEST_CASE("cuda NCCL teardown (stand-in only): roots go after the splits, a failed group aborts at once (L5)") {
  if (!two_gpus()) return;
  pmapcc_standin::clear_faults();
  const std::size_t before = pmapcc_standin::live_nccl_communicators();
  pmap::MeshOptions options;
  options.collective_timeout = std::chrono::seconds(60);  // the finalize bound would be its 10 s cap
  std::vector<pmap::Device> gpus = pmap::local_devices(pmap::DeviceKind::cuda);
  gpus.resize(2);
  auto mesh = std::make_unique<pmap::Mesh>(gpus, "i", options);
  // One communicator per device for 'i': the roots they were split from are destroyed already.
  CHECK(pmapcc_standin::live_nccl_communicators() == before + 2);
  // One device's all-reduce fails to enqueue; the other's, enqueued, waits for it until the grace after
  // the failure and aborts its communicator. The failed device's communicator was never aborted, and its
  // peer will never finalize: its teardown must abort at once, not wait out the 10 s bound.
  pmapcc_standin::inject_fault("ncclAllReduce", ncclInternalError);
  auto f = pmap::pmap(
      []() {
        pmap::Array x = pmap::Array::from_host(std::vector<float>(4, 1.0f), {4}, pmap::current_device());
        pmap::psum_inplace(x, "i");
      },
      *mesh, "i");
  CHECK_THROWS_AS(f(), pmap::Error);
  pmapcc_standin::clear_faults();
  const auto t0 = std::chrono::steady_clock::now();
  mesh.reset();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("teardown after the failure: " << seconds << " s");
  CHECK(seconds < 5.0);
  CHECK(pmapcc_standin::live_nccl_communicators() == before);
}
#endif

#endif  // PMAPCC_HAVE_NCCL

#if defined(PMAPCC_CUDA_STANDIN)

TEST_CASE("cuda stand-in rules (stand-in only): streams run asynchronously, events and the legacy stream order them") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  const std::size_t n = 512;
  DeviceBuffer x(n);
  SUBCASE("a call returns before its work runs; a query says so") {
    Stream s;
    Gate gate;
    gate.block(s.s);
    REQUIRE(cudaMemsetAsync(x.p, 3, n, s.s) == cudaSuccess);
    CHECK(cudaStreamQuery(s.s) == cudaErrorNotReady);
    CHECK(cudaGetLastError() == cudaSuccess);  // not ready is no error
    gate.open();
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(cudaStreamQuery(s.s) == cudaSuccess);
    CHECK(all_equal(read_back(x.p, n), 3));
  }
  SUBCASE("a stream that waits for an event waits for the work recorded before it") {
    Stream producer, consumer;
    Event e;
    Gate gate;
    gate.block(producer.s);
    REQUIRE(cudaEventRecord(e.e, producer.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(consumer.s, e.e, 0) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(x.p, 4, n, consumer.s) == cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(cudaStreamQuery(consumer.s) == cudaErrorNotReady);
    CHECK(cudaEventQuery(e.e) == cudaErrorNotReady);
    gate.open();
    REQUIRE(cudaEventSynchronize(e.e) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(consumer.s) == cudaSuccess);
    CHECK(all_equal(read_back(x.p, n), 4));
  }
  SUBCASE("the legacy stream waits for blocking streams, not for non-blocking ones") {
    Stream blocking(cudaStreamDefault), nonblocking(cudaStreamNonBlocking);
    Gate held_nb;
    held_nb.block(nonblocking.s);
    REQUIRE(cudaMemsetAsync(x.p, 5, n, nullptr) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);  // returns although `nonblocking` is held
    held_nb.open();
    Gate held_b;
    held_b.block(blocking.s);
    REQUIRE(cudaMemsetAsync(x.p, 6, n, nullptr) == cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);
    held_b.open();
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    CHECK(all_equal(read_back(x.p, n), 6));
  }
}

TEST_CASE("cuda stand-in rules (stand-in only): freed device memory is quarantined, cudaFree waits for its GPU") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Stream s;
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 8192) == cudaSuccess);
  CHECK_FALSE(unreadable(p));
  const std::size_t before = pmapcc_standin::quarantined_bytes();
  Gate gate;
  gate.block(s.s);
  REQUIRE(cudaMemsetAsync(p, 1, 8192, s.s) == cudaSuccess);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.open();
  });
  REQUIRE(cudaFree(p) == cudaSuccess);  // waits for the memset, then unmaps nothing: no access at all
  CHECK(cudaStreamQuery(s.s) == cudaSuccess);
  opener.join();
  CHECK(unreadable(p));
  CHECK(pmapcc_standin::quarantined_bytes() >= before + 8192);
  CHECK(cudaFree(p) == cudaErrorInvalidValue);  // a second free
  cudaGetLastError();
}

TEST_CASE("cuda stand-in rules (stand-in only): injected faults reach pmapcc's error paths (review L2, L3)") {
  pmapcc_standin::clear_faults();
  SUBCASE("a failed cudaSetDevice when a worker binds to its GPU raises from the pmapped call (L2)") {
    pmapcc_standin::inject_fault("cudaSetDevice", cudaErrorInvalidDevice, 1000);
    pmap::Mesh mesh({cuda_testing::kGpu}, "i");
    CHECK_THROWS_WITH_AS(pmap::pmap([&]() { (void)pmap::axis_index("i"); }, mesh, "i")(),
                         doctest::Contains("cudaSetDevice"), pmap::Error);
    pmapcc_standin::clear_faults();
  }
  SUBCASE("a stream whose GPU cannot be queried is refused, not silently the legacy stream (L3)") {
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    Stream s;
    pmapcc_standin::inject_fault("cudaStreamGetDevice", cudaErrorInvalidResourceHandle);
    CHECK_THROWS_AS(pmap::detail::cuda_set_thread_stream(s.s), pmap::CudaError);
    CHECK(pmap::detail::cuda_thread_stream() == nullptr);
    pmapcc_standin::clear_faults();
  }
  SUBCASE("a failed launch raises CudaError naming it") {
    pmapcc_standin::inject_fault("cudaLaunchKernel", cudaErrorLaunchFailure);
    pmap::Array x = pmap::Array::from_host(std::vector<float>(16, 2.0f), {16}, cuda_testing::kGpu);
    CHECK_THROWS_WITH_AS(pmap::detail::cuda_divide(0, x.raw_data(), 16, pmap::DType::f32, 2),
                         doctest::Contains("cudaErrorLaunchFailure"), pmap::CudaError);
    pmapcc_standin::clear_faults();
  }
}

namespace {

// Holds a stream back for `delay` from block() on: work queued on the stream after block() runs only
// then. A host call that must return with its GPU work done therefore returns after the delay, and one
// that does not wait returns at once, before the work. One block() per gate.
class TimedGate {
 public:
  explicit TimedGate(std::chrono::milliseconds delay) : delay_(delay) {}
  ~TimedGate() {
    if (opener_.joinable()) opener_.join();
  }
  TimedGate(const TimedGate&) = delete;
  TimedGate& operator=(const TimedGate&) = delete;
  void block(cudaStream_t stream) {
    std::shared_future<void> f = future_;
    REQUIRE(pmapcc_standin::launch(stream, [f] { f.wait(); }) == cudaSuccess);
    opener_ = std::thread([this] {
      std::this_thread::sleep_for(delay_);
      promise_.set_value();
    });
  }

 private:
  std::chrono::milliseconds delay_;
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
  std::thread opener_;
};

constexpr std::chrono::milliseconds kHold{150};

// Device memory read directly, without a copy that would synchronize (the stand-in's memory is the host's).
std::vector<float> raw_floats(const void* device, std::size_t n) {
  std::vector<float> out(n);
  std::memcpy(out.data(), device, n * sizeof(float));
  return out;
}

}  // namespace

// Found by scripts/mutate_cuda_orchestration.py: without these synchronizations every other test passed,
// since the stand-in's streams usually finish before the host looks. Held-back streams make the order certain.
TEST_CASE("cuda stand-in (stand-in only): fills and copies the host asks for are done when they return") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  const pmap::Device gpu0{pmap::DeviceKind::cuda, 0, 0};
  const std::size_t n = 1024;
  DeviceBuffer a(n * sizeof(float));  // 0xA5 bytes: not a float pattern any check below accepts
  SUBCASE("a zero fill") {
    TimedGate gate(kHold);
    gate.block(nullptr);  // this thread has no stream of its own: the fill goes to the legacy stream
    pmap::detail::cuda_memset_zero(0, a.p, n * sizeof(float));
    CHECK(raw_floats(a.p, n) == std::vector<float>(n, 0.0f));
  }
  SUBCASE("a copy from the host") {
    const std::vector<float> values(n, 3.0f);
    TimedGate gate(kHold);
    gate.block(nullptr);
    pmap::detail::cuda_copy(a.p, gpu0, values.data(), pmap::Device{}, n * sizeof(float));
    CHECK(raw_floats(a.p, n) == values);
  }
  if (two_gpus()) {
    const pmap::Device gpu1{pmap::DeviceKind::cuda, 1, 1};
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    DeviceBuffer b(n * sizeof(float));
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    SUBCASE("a copy between GPUs waits for the caller's stream, which is still writing the source") {
      Stream s;  // on GPU 0, this thread's stream (as a worker's)
      pmap::detail::cuda_set_thread_stream(s.s);
      const std::vector<float> values(n, 5.0f);
      {
        TimedGate gate(kHold);
        gate.block(s.s);
        REQUIRE(cudaMemcpyAsync(a.p, values.data(), n * sizeof(float), cudaMemcpyHostToDevice, s.s) == cudaSuccess);
        pmap::detail::cuda_copy(b.p, gpu1, a.p, gpu0, n * sizeof(float));
      }
      pmap::detail::cuda_set_thread_stream(nullptr);
      CHECK(raw_floats(b.p, n) == values);
    }
    SUBCASE("a copy between GPUs is done when it returns") {
      const std::vector<float> values(n, 7.0f);
      REQUIRE(cudaMemcpy(a.p, values.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
      REQUIRE(cudaSetDevice(1) == cudaSuccess);
      TimedGate gate(kHold);
      gate.block(nullptr);  // the copy runs on the destination GPU's stream
      REQUIRE(cudaSetDevice(0) == cudaSuccess);
      pmap::detail::cuda_copy(b.p, gpu1, a.p, gpu0, n * sizeof(float));
      CHECK(raw_floats(b.p, n) == values);
    }
  }
}

TEST_CASE("cuda virtual devices (stand-in only): a collective waits for the values its device is still writing") {
  // Virtual devices on one GPU meet in the hub and read each other's buffers from their own streams.
  const std::vector<pmap::Device> devices{{pmap::DeviceKind::cuda, 0, 0}, {pmap::DeviceKind::cuda, 1, 0}};
  pmap::Mesh mesh(devices, "i");
  std::vector<pmap::Array> xs;  // made before the gate (a copy from pageable memory may wait for every stream)
  for (const pmap::Device& d : devices) xs.push_back(pmap::Array::from_host(std::vector<float>(64, 4.0f), {64}, d));
  TimedGate gate(kHold);
  auto f = pmap::pmap([&]() {
    pmap::Array& x = xs[static_cast<std::size_t>(pmap::axis_index("i"))];
    if (pmap::axis_index("i") == 0) {
      gate.block(static_cast<cudaStream_t>(pmap::detail::cuda_thread_stream()));
      pmap::detail::cuda_divide(0, x.raw_data(), 64, pmap::DType::f32, 2);  // 2.0, once the gate opens
    }
    // In place: psum's new output array would be zeroed and its stream synchronized before the meeting.
    pmap::psum_inplace(x, "i");
  }, mesh, "i");
  f();
  for (const pmap::Array& x : xs) CHECK(x.to_vector<float>() == std::vector<float>(64, 6.0f));
}

TEST_CASE("cuda: an exception in the pmapped function still waits for its device's queued work (review L6)") {
  // Stand-in only: the caller reads, right after the failed call, memory a kernel of the call wrote.
  pmap::Mesh mesh({cuda_testing::kGpu}, "i");
  pmap::Array x = pmap::Array::from_host(std::vector<float>(64, 4.0f), {64}, cuda_testing::kGpu);
  TimedGate gate(kHold);  // (outside the function: its end waits for the delay)
  auto f = pmap::pmap([&]() {
    gate.block(static_cast<cudaStream_t>(pmap::detail::cuda_thread_stream()));
    pmap::detail::cuda_divide(0, x.raw_data(), 64, pmap::DType::f32, 2);
    throw std::runtime_error("failed after queueing work");
  }, mesh, "i");
  CHECK_THROWS_WITH(f(), doctest::Contains("failed after queueing work"));
  CHECK(raw_floats(x.raw_data(), 64) == std::vector<float>(64, 2.0f));
}

TEST_CASE("cuda random (stand-in only): a draw outside pmap is done when it returns") {
  const std::int64_t n = 1000;
  pmap::Array out({n}, pmap::DType::f32, cuda_testing::kGpu);  // made (and zeroed) before the gate
  std::vector<float> expected(static_cast<std::size_t>(n));
  pmap::uniform(pmap::key(7), std::span<float>(expected));  // the CPU's draw: the GPU's bit for bit
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  TimedGate gate(kHold);
  gate.block(nullptr);  // this thread has no stream: the draw goes to the legacy stream
  pmap::uniform(pmap::key(7), out);
  CHECK(raw_floats(out.raw_data(), static_cast<std::size_t>(n)) == expected);
}

TEST_CASE("cuda Feed (stand-in only): a copy into a slot waits for the device's earlier readers, next() for the copy") {
  // The device's stream is held back from outside pmap (its handle kept from a pmapped call), so the
  // copies the Feed orders after it are still queued when the host goes on.
  pmap::Mesh mesh({cuda_testing::kGpu}, "i");
  const std::int64_t n = 256;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  pmap::Feed<pmap::Array> feed(mesh, pmap::Array({n}, pmap::DType::f32));
  void* compute = nullptr;
  pmap::pmap([&]() { compute = pmap::cuda_stream(); }, mesh, "i")();
  auto put = [&](float v) {
    pmap::Array& host = feed.next();
    std::fill_n(host.data<float>(), n, v);
    feed.push();
  };
  put(1.0f);
  const void* slot0 = feed.pop()[0].raw_data();  // batch 0's buffer on the device
  put(2.0f);
  (void)feed.pop();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  DeviceBuffer seen(bytes);
  {
    TimedGate gate(kHold);
    const auto stream = static_cast<cudaStream_t>(compute);
    gate.block(stream);
    // A step still queued on the device, reading batch 0 out of slot 0.
    REQUIRE(cudaMemcpyAsync(seen.p, slot0, bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess);
    put(3.0f);  // into slot 0 again: the copy must wait for that reader
    put(4.0f);
    (void)feed.pop();                  // batch 2, from slot 0, whose copy is still held back
    pmap::Array& host = feed.next();   // slot 0's host buffer: only once batch 2's copy out of it is done
    std::fill_n(host.data<float>(), n, 9.0f);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  CHECK(raw_floats(seen.p, static_cast<std::size_t>(n)) == std::vector<float>(static_cast<std::size_t>(n), 1.0f));
  CHECK(raw_floats(slot0, static_cast<std::size_t>(n)) == std::vector<float>(static_cast<std::size_t>(n), 3.0f));
}

#endif  // PMAPCC_CUDA_STANDIN

}  // namespace PMAPCC_TEST_FILE

#endif  // PMAPCC_HAVE_CUDA
