// Exec: dispatch of the CUDA backend's work to a GPU (kernels/cuda/gpu) or to the host; the row-major to
// column-major GEMM mapping and the host GEMM with cuBLAS's semantics; host scratch memory; and host
// captures, which record a step's launches and replay them as a CUDA graph would.
#include <pmapcc/kernels/cuda/exec.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <pmap/detail/capture.h>
#include <pmap/error.h>

#include <pmapcc/kernels/cuda/gpu/native.h>
#include <pmapcc/kernels/graph.h>

namespace pmap::kernels::gpu {
namespace {

// The launches recorded by a host capture, replayed by launch().
class HostGraph final : public Graph {
 public:
  std::vector<std::function<void()>> work;
  void launch() override {
    for (const auto& f : work) f();
  }
};

thread_local HostGraph* tls_recording = nullptr;

// Scratch memory of the calling thread for host runs. Buffers only grow and are never freed before the
// thread exits: a recorded graph may still point at an earlier one.
class HostScratch {
 public:
  void* get(std::size_t bytes) {
    if (bytes <= size_ && !buffers_.empty()) return buffers_.back().get();
    detail::check_not_capturing("scratch memory of " + std::to_string(bytes) + " bytes", "allocates memory");
    buffers_.push_back(std::make_unique<std::max_align_t[]>(bytes / sizeof(std::max_align_t) + 1));
    size_ = bytes;
    return buffers_.back().get();
  }

 private:
  std::vector<std::unique_ptr<std::max_align_t[]>> buffers_;
  std::size_t size_ = 0;
};

}  // namespace

ColumnMajorGemm column_major(const Gemm& g, const float* a, const float* b, float* c) {
  ColumnMajorGemm cm;
  cm.trans_a = g.trans_b;  // column-major A is the row-major B (and B is A)
  cm.trans_b = g.trans_a;
  cm.m = g.n, cm.n = g.m, cm.k = g.k;
  cm.alpha = 1.0f, cm.beta = g.beta;
  cm.a = b, cm.lda = g.trans_b ? g.k : g.n, cm.stride_a = g.stride_b;
  cm.b = a, cm.ldb = g.trans_a ? g.m : g.k, cm.stride_b = g.stride_a;
  cm.c = c, cm.ldc = g.n, cm.stride_c = g.stride_c;
  cm.batch = g.batch;
  return cm;
}

namespace {

inline double widen(float x) { return x; }
inline double widen(std::uint16_t bits) { return bf16_widen(bits); }

// The reference GEMM's arithmetic for cols (1 or 4) columns of C: sums[j * m + row] = sum over l, in order
// from zero, of op_a[l * m + row] * b[l * 4 + j]. It touches only the scratch buffers host_gemm sizes for
// it; host_gemm reads the caller's operands into them and writes C (with ASan's and UBSan's checks on).
// Not instrumented by any sanitizer: checks on these buffers find nothing, and ASan's and UBSan's kept the
// loop scalar, which made the reference GEMM most of the sanitizer builds' GPU training tests.
#if defined(__GNUC__)
__attribute__((no_sanitize("thread", "address", "undefined")))
#endif
void column_sums(const double* __restrict op_a, const double* __restrict b, int k, int cols,
                 double* __restrict sums, std::size_t m) {
  std::fill(sums, sums + static_cast<std::size_t>(cols) * m, 0.0);
  double* s0 = sums;
  double* s1 = s0 + m;
  double* s2 = s1 + m;
  double* s3 = s2 + m;
  for (int l = 0; l < k; ++l) {
    const double* al = op_a + static_cast<std::size_t>(l) * m;
    const double* bl = b + 4 * static_cast<std::size_t>(l);
    const double b0 = bl[0], b1 = bl[1], b2 = bl[2], b3 = bl[3];
    if (cols == 4) {
      for (std::size_t row = 0; row < m; ++row) {
        s0[row] += al[row] * b0;
        s1[row] += al[row] * b1;
        s2[row] += al[row] * b2;
        s3[row] += al[row] * b3;
      }
    } else {
      for (std::size_t row = 0; row < m; ++row) s0[row] += al[row] * b0;
    }
  }
}

// host_sgemm over operands of type T (float, or bf16 bits).
// Not instrumented by ThreadSanitizer: one thread's arithmetic on buffers the caller owns (under TSan the
// reference GEMM would dominate the suite's time and check nothing about threads).
template <class T>
#if defined(__GNUC__)
__attribute__((no_sanitize("thread")))
#endif
void host_gemm(const ColumnMajorGemm& g, const T* a_all, const T* b_all) {
  // op(A) is first copied out column-major (m x k, as doubles), so that a column of C accumulates over
  // contiguous rows (vectorized); each entry is still summed over l in order, from zero.
  // The scratch (op(A); op(B)'s columns of one group of four, by l; their sums) is kept by the thread from
  // call to call: a fresh allocation per call, new pages from AddressSanitizer's allocator, cost more than
  // the sums.
  const auto m = static_cast<std::size_t>(g.m);
  const auto k = static_cast<std::size_t>(g.k);
  thread_local std::vector<double> op_a_scratch, op_b_scratch, acc_scratch;
  if (op_a_scratch.size() < m * k) op_a_scratch.resize(m * k);
  if (op_b_scratch.size() < 4 * k) op_b_scratch.resize(4 * k);
  if (acc_scratch.size() < 4 * m) acc_scratch.resize(4 * m);
  double* const op_a = op_a_scratch.data();
  double* const op_b = op_b_scratch.data();
  double* const acc = acc_scratch.data();
  for (int i = 0; i < g.batch; ++i) {
    const T* a = a_all + i * g.stride_a;
    const T* b = b_all + i * g.stride_b;
    float* c = g.c + i * g.stride_c;
    for (int l = 0; l < g.k; ++l) {
      double* al = op_a + static_cast<std::size_t>(l) * m;
      if (g.trans_a) {
        for (int row = 0; row < g.m; ++row) al[row] = widen(a[l + static_cast<long long>(row) * g.lda]);
      } else {
        for (int row = 0; row < g.m; ++row) al[row] = widen(a[row + static_cast<long long>(l) * g.lda]);
      }
    }
    // Four columns of C at a time (each op(A) load feeds four sums), then the rest one by one.
    auto b_at = [&](int l, int col) {  // op(B)(l, col): B is k x n (ldb), or n x k when transposed
      return widen(g.trans_b ? b[col + static_cast<long long>(l) * g.ldb] : b[l + static_cast<long long>(col) * g.ldb]);
    };
    for (int col = 0; col < g.n;) {
      const int cols = g.n - col >= 4 ? 4 : 1;
      for (int l = 0; l < g.k; ++l) {
        for (int j = 0; j < cols; ++j) op_b[4 * static_cast<std::size_t>(l) + j] = b_at(l, col + j);
      }
      column_sums(op_a, op_b, g.k, cols, acc, m);
      for (int j = 0; j < cols; ++j) {
        float* cc = c + static_cast<long long>(col + j) * g.ldc;
        const double* sj = acc + static_cast<std::size_t>(j) * m;
        for (int row = 0; row < g.m; ++row) {
          const double sum = static_cast<double>(g.alpha) * sj[row];
          cc[row] = static_cast<float>(g.beta == 0.0f ? sum : sum + static_cast<double>(g.beta) * cc[row]);
        }
      }
      col += cols;
    }
  }
}

}  // namespace

void host_sgemm(const ColumnMajorGemm& g) {
  if (g.a16 != nullptr && g.b16 != nullptr) return host_gemm(g, g.a16, g.b16);
  host_gemm(g, g.a, g.b);
}

void Exec::run_on_host(std::function<void()> f) {
  if (tls_recording != nullptr) {
    tls_recording->work.push_back(std::move(f));
  } else {
    f();
  }
}

void Exec::no_gpu(const char* what) {
  throw NotAvailable(std::string(what) + " on a GPU: this code was compiled without CUDA; only Exec::host() runs here");
}

void Exec::gemm(const Gemm& g, const float* a, const float* b, float* c) const {
  if (g.bf16) throw ValueError("Exec::gemm: a bf16 GEMM takes bf16 operands (see product() in linear.h)");
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return;
  const ColumnMajorGemm cm = column_major(g, a, b, c);
  if (host_) return run_on_host([cm] { host_sgemm(cm); });
  native::sgemm(cm);
}

void Exec::gemm(const Gemm& g, const std::uint16_t* a, const std::uint16_t* b, float* c) const {
  if (!g.bf16) throw ValueError("Exec::gemm: bf16 operands need a Gemm with bf16 set");
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return;
  ColumnMajorGemm cm = column_major(g, nullptr, nullptr, c);
  cm.a16 = b;  // column-major A is the row-major B (see column_major)
  cm.b16 = a;
  if (host_) return run_on_host([cm] { host_sgemm(cm); });
  native::gemm_bf16(cm);
}

void Exec::fill_zero(void* dst, std::size_t bytes) const {
  if (bytes == 0) return;
  if (host_) return run_on_host([dst, bytes] { std::memset(dst, 0, bytes); });
  native::fill_zero(dst, bytes);
}

void Exec::copy(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0 || dst == src) return;
  if (host_) return run_on_host([dst, src, bytes] { std::memmove(dst, src, bytes); });
  native::copy(dst, src, bytes);
}

void* Exec::scratch(std::size_t bytes) const {
  if (!host_) return native::scratch(bytes);
  thread_local HostScratch host_scratch;
  return host_scratch.get(bytes);
}

void Exec::prepare() const {
  if (!host_) native::prepare();
}

std::unique_ptr<Graph> Exec::capture(const std::function<void()>& body) const {
  if (!host_) return native::capture(body);
  if (tls_recording != nullptr) throw CaptureError("a host capture cannot start inside another capture");
  auto graph = std::make_unique<HostGraph>();
  detail::CaptureScope scope("the capture of a step (host run of the CUDA kernels)");
  tls_recording = graph.get();
  try {
    body();
    scope.check();  // what the body could not raise where it happened (an Array freed)
  } catch (...) {
    tls_recording = nullptr;
    throw;
  }
  tls_recording = nullptr;
  return graph;
}

}  // namespace pmap::kernels::gpu
