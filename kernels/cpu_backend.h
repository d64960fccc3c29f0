// The CPU backends: host pointers; blocking; each call runs on its calling thread (a pmap CPU device calls
// from its own worker thread), joined for large products by that thread's own helpers when
// cpu::set_threads asks for more than one; safe to call from several threads at once on distinct outputs
// and workspaces.
//
// The ops are compiled once per ISA variant (kernels/cpu, cmake/pmapccCpuVariants.cmake): for the baseline
// ISA ("generic") and, on x86-64 with GCC/Clang and GNU binutils, again with AVX2+FMA ("avx2") and with
// AVX-512 F/BW/DQ/VL ("avx512"). Each variant is a CpuBackend of its own, so one binary runs on any x86-64
// CPU and uses the widest vectors the CPU (and OS) support. Which variant is active is decided once, at
// the first cpu_backend() call: PMAPCC_CPU_ISA=generic|avx2|avx512|auto if set, else the best available.
// The variants differ in rounding (FMA, vector widths) only; the evaluation's metrics and memory ops are
// shared by all of them (CpuBackend's final members), so they give the same bits everywhere.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <pmapcc/kernels/backend.h>

namespace pmap::kernels {

class CpuBackend : public Backend {
 public:
  std::string name() const final { return "cpu"; }
  DeviceKind kind() const final { return DeviceKind::cpu; }
  // "generic", "avx2" or "avx512".
  virtual std::string isa() const = 0;

  // c (M, rows, cols) = (or += with accumulate) a (M, rows, depth) @ b (M, depth, cols), member by member:
  // the GEMM every CPU op runs on, public for benchmarks (bench_train's sgemm rate) and tests. Not in
  // place. workspace: matmul_workspace_bytes(p) bytes (GEMM packing space), or nullptr (allocated).
  virtual std::size_t matmul_workspace_bytes(MatmulParams p) const = 0;
  virtual void matmul(MatmulParams p, const float* a, const float* b, float* c, void* workspace) const = 0;

  // The same in every variant: the evaluation's ops (kernels/cpu/shared/cpu_metrics.cpp, one instance shared by every
  // variant) and memory (kernels/cpu/shared/cpu_backend.cpp).
  const MetricOps& metrics() const final;
  void copy(void* dst, const void* src, std::size_t bytes) const final;
  void fill_zero(void* dst, std::size_t bytes) const final;
};

// The active variant (backend_for(DeviceKind::cpu) returns it too), choosing it first if none is. Throws
// pmap::ValueError when PMAPCC_CPU_ISA is not one of generic, avx2, avx512, auto (or empty), and
// pmap::NotAvailable when it names a variant that was not built or that this CPU cannot run (e.g. avx2
// without AVX2 or FMA), or as cpu::threads() for a bad PMAPCC_CPU_THREADS; every call throws the same until
// the variable is fixed.
const CpuBackend& cpu_backend();

namespace cpu {

// The variants built into this binary that this CPU can run, worst first: "generic", then "avx2" and "avx512"
// where built and supported.
std::vector<std::string> available_isas();

// cpu_backend().isa(): the active variant's name.
std::string isa();

// Makes `name` ("generic", "avx2", "avx512" or "auto": the best) the active variant for the whole process, for
// tests and benchmarks. Not thread-safe against kernels running on other threads: call it between runs;
// a Backend reference taken before keeps its variant. Throws as cpu_backend() does for a bad or
// unavailable name.
void set_isa(std::string_view name);

// Threads one CPU op call may use for its large products: the calling thread and up to threads() - 1 helper
// threads of that caller's own, started on first use and parked between calls. 1 (the default) runs every
// op on the calling thread alone. A pmap CPU device runs its ops on one worker thread, so where the machine
// has more cores than the mesh has CPU devices, cores / devices puts the spare cores to work (one device on
// two cores: 2). The conv and dense products (forward, input and weight gradients) split by rows of their
// result, and every row is summed as in the whole product, so the thread count never changes a result's
// bits. PMAPCC_CPU_THREADS sets it at start-up; threads() throws pmap::ValueError naming the variable when
// it is not an integer from 1 to 64, every call until it is fixed. set_threads(n) (1 to 64, else
// ValueError) applies from the next op.
int threads();
void set_threads(int n);
// The programs' --cpu-threads rule: `requested` > 0 sets that count; 0 (auto) gives each of this process's
// `local_devices` CPU devices its share of the cores (cores / devices, at least 1); -1 (not given) leaves a
// set PMAPCC_CPU_THREADS standing, else auto. ValueError as set_threads for a count above 64.
void share_cores(int local_devices, int requested);

}  // namespace cpu
}  // namespace pmap::kernels
