// What the CPU backends share (kernels/cpu_backend.h): the choice of the active ISA variant, and the
// ensemble step's reductions, the memory ops and the workspace sizes, which are plain loops compiled once
// outside the variants (kernels/cpu), without FMA contraction, so every variant gives the same bits.
#include <pmapcc/kernels/cpu_backend.h>

#include <pmap/error.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include <pmapcc/kernels/calibration.h>

// Each built variant defines its entry point (kernels/cpu/backend.cpp compiled as that variant).
extern "C" const pmap::kernels::CpuBackend* pmapcc_cpu_backend_generic();
extern "C" const pmap::kernels::CpuBackend* pmapcc_cpu_backend_avx2();
extern "C" const pmap::kernels::CpuBackend* pmapcc_cpu_backend_avx512();

namespace pmap::kernels {
namespace cpu {
namespace {

std::atomic<const CpuBackend*> g_active{nullptr};

// The variants beyond generic, worst to best. `runs` asks the CPU (and, through libgcc's checks of XCR0,
// the operating system: AVX-512 needs the kernel to save the ZMM and mask registers).
struct Variant {
  const char* name;
  bool built;
  const CpuBackend* (*entry)();
  bool (*runs)();
  const char* needs;   // for the error when the CPU lacks it
  const char* option;  // the CMake option that builds it
};

#if defined(__x86_64__) || defined(__i386__)
bool runs_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool runs_avx512() {
  __builtin_cpu_init();
  return runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
#else
bool runs_avx2() { return false; }
bool runs_avx512() { return false; }
#endif

#if PMAPCC_HAVE_CPU_AVX2
constexpr auto kAvx2Entry = &pmapcc_cpu_backend_avx2;
#else
constexpr const CpuBackend* (*kAvx2Entry)() = nullptr;
#endif
#if PMAPCC_HAVE_CPU_AVX512
constexpr auto kAvx512Entry = &pmapcc_cpu_backend_avx512;
#else
constexpr const CpuBackend* (*kAvx512Entry)() = nullptr;
#endif

constexpr Variant kVariants[] = {
    {"avx2", PMAPCC_HAVE_CPU_AVX2 != 0, kAvx2Entry, runs_avx2, "AVX2 and FMA", "PMAPCC_CPU_AVX2"},
    {"avx512", PMAPCC_HAVE_CPU_AVX512 != 0, kAvx512Entry, runs_avx512, "AVX-512 F, BW, DQ and VL", "PMAPCC_CPU_AVX512"},
};

// The variant's backend when it is built and this CPU runs it, else nullptr.
const CpuBackend* usable(const Variant& v) { return v.built && v.runs() ? v.entry() : nullptr; }

// The backend of a variant name, or throws naming what is wrong; `source` says where the name came from.
const CpuBackend* backend_for_isa(std::string_view name, const char* source) {
  if (name.empty() || name == "auto") {
    const CpuBackend* best = pmapcc_cpu_backend_generic();
    for (const Variant& v : kVariants)
      if (const CpuBackend* b = usable(v)) best = b;
    return best;
  }
  if (name == "generic") return pmapcc_cpu_backend_generic();
  std::string names = "generic";
  for (const Variant& v : kVariants) {
    names += std::string(", ") + v.name;
    if (name != v.name) continue;
    if (const CpuBackend* b = usable(v)) return b;
    if (!v.built)
      throw NotAvailable(std::string(source) + ": this build has no " + v.name + " CPU kernels (" + v.option +
                         " was off or not possible)");
    throw NotAvailable(std::string(source) + ": the " + v.name + " CPU kernels need a CPU with " + v.needs +
                       "; this one lacks them");
  }
  throw ValueError(std::string(source) + ": unknown CPU kernel variant '" + std::string(name) + "' (expected " + names +
                   " or auto)");
}

const CpuBackend& active_backend() {
  if (const CpuBackend* t = g_active.load(std::memory_order_acquire)) return *t;
  const char* env = std::getenv("PMAPCC_CPU_ISA");
  const CpuBackend* chosen = backend_for_isa(env == nullptr ? "" : env, "PMAPCC_CPU_ISA");
  const CpuBackend* expected = nullptr;
  g_active.compare_exchange_strong(expected, chosen, std::memory_order_acq_rel);
  return *g_active.load(std::memory_order_acquire);
}

}  // namespace

std::vector<std::string> available_isas() {
  std::vector<std::string> out{"generic"};
  for (const Variant& v : kVariants)
    if (usable(v) != nullptr) out.emplace_back(v.name);
  return out;
}

std::string isa() { return cpu_backend().isa(); }

void set_isa(std::string_view name) { g_active.store(backend_for_isa(name, "set_isa"), std::memory_order_release); }

}  // namespace cpu

const CpuBackend& cpu_backend() { return cpu::active_backend(); }

void CpuBackend::sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) const {
  require(x, "sum_members", "x");
  require(out, "sum_members", "out");
  if (count < 1) throw ValueError("sum_members: count must be >= 1, got " + std::to_string(count));
  for (std::size_t i = 0; i < n; ++i) out[i] = accumulate ? out[i] + x[i] : x[i];
  for (int j = 1; j < count; ++j) {
    const float* xj = x + static_cast<std::size_t>(j) * n;
    for (std::size_t i = 0; i < n; ++i) out[i] = out[i] + xj[i];
  }
}

void CpuBackend::divide(std::size_t n, float* x, float divisor) const {
  require(x, "divide", "x");
  for (std::size_t i = 0; i < n; ++i) x[i] /= divisor;
}

void CpuBackend::argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels,
                             std::int32_t* hits) const {
  require(scores, "argmax_hits", "scores");
  require(labels, "argmax_hits", "labels");
  require(hits, "argmax_hits", "hits");
  validate_argmax_hits(rows, classes);
  for (int r = 0; r < rows; ++r) {
    const float* s = scores + static_cast<std::size_t>(r) * classes;
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (s[c] > s[best]) best = c;
    *hits += best == labels[r] ? 1 : 0;
  }
}

void CpuBackend::accumulate_metrics(int count, const float* loss, const std::int32_t* correct, double rows,
                                    double* loss_sum, std::int32_t* hits) const {
  require(loss, "accumulate_metrics", "loss");
  require(correct, "accumulate_metrics", "correct");
  require(loss_sum, "accumulate_metrics", "loss_sum");
  require(hits, "accumulate_metrics", "hits");
  for (int m = 0; m < count; ++m) {
    loss_sum[m] += static_cast<double>(loss[m]) * rows;
    hits[m] += correct[m];
  }
}

void CpuBackend::mean_from_sums(int count, const double* sums, double divisor, float* out) const {
  require(sums, "mean_from_sums", "sums");
  require(out, "mean_from_sums", "out");
  for (int m = 0; m < count; ++m) out[m] = static_cast<float>(sums[m] / divisor);
}

void CpuBackend::calibration_sums(CalibrationParams p, const float* probs, const std::int32_t* labels, double* sums,
                                  void*) const {
  require(probs, "calibration_sums", "probs");
  require(labels, "calibration_sums", "labels");
  require(sums, "calibration_sums", "sums");
  validate(p);
  for (int r = 0; r < p.rows; ++r)
    if (labels[r] < 0 || labels[r] >= p.classes)
      throw ValueError("calibration_sums: label " + std::to_string(labels[r]) + " at row " + std::to_string(r) +
                       " is outside [0, " + std::to_string(p.classes) + ")");
  for (int q = 0; q < p.predictors; ++q) {
    double partial[kCalibrationSlots] = {};
    for (int r = 0; r < p.rows; ++r) {
      const float* row = probs + (static_cast<std::size_t>(q) * p.rows + r) * p.classes;
      const RowCalibration c = row_calibration(row, p.classes, labels[r]);
      for (int s = 0; s < 4; ++s) partial[s] += row_slot(c, s);
      double* bin = partial + 4 + 3 * c.bin;
      bin[0] += 1.0;
      bin[1] += c.confidence;
      bin[2] += c.hit;
    }
    double* out = sums + static_cast<std::size_t>(q) * kCalibrationSlots;
    for (int s = 0; s < kCalibrationSlots; ++s) out[s] += partial[s];
  }
}

void CpuBackend::predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                             float* entropy) const {
  require(probs, "predictions", "probs");
  validate_argmax_hits(rows, classes);
  for (int r = 0; r < rows; ++r) {
    const float* row = probs + static_cast<std::size_t>(r) * classes;
    const int pred = predicted_class(row, classes);
    if (predicted != nullptr) predicted[r] = pred;
    if (probability != nullptr) probability[r] = row[pred];
    if (entropy != nullptr) entropy[r] = static_cast<float>(row_entropy(row, classes));
  }
}

std::size_t CpuBackend::softmax_cross_entropy_workspace_bytes(SoftmaxXentParams p) const {
  validate(p);
  return 0;
}

std::size_t CpuBackend::calibration_workspace_bytes(CalibrationParams p) const {
  validate(p);
  return 0;
}

void CpuBackend::copy(void* dst, const void* src, std::size_t bytes) const {
  if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
}

void CpuBackend::fill_zero(void* dst, std::size_t bytes) const {
  if (bytes != 0) std::memset(dst, 0, bytes);
}

}  // namespace pmap::kernels
