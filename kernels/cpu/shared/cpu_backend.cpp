// What the CPU backends share (kernels/cpu_backend.h): the choice of the active ISA variant, the memory
// ops and the loss's workspace size, compiled once outside the variants (kernels/cpu). The evaluation's
// ops, shared the same way, are kernels/cpu/shared/cpu_metrics.cpp.
#include <pmapcc/kernels/cpu_backend.h>

#include <pmap/error.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

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

const CpuBackend& cpu_backend() {
  cpu::threads();  // a bad PMAPCC_CPU_THREADS is reported here, before any op runs
  return cpu::active_backend();
}

void CpuBackend::copy(void* dst, const void* src, std::size_t bytes) const {
  if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
}

void CpuBackend::fill_zero(void* dst, std::size_t bytes) const {
  if (bytes != 0) std::memset(dst, 0, bytes);
}

}  // namespace pmap::kernels
