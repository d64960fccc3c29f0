// The CPU ops of kernels/ops.h: each forwards to the active ISA variant's table (kernels/cpu/ops_table.h),
// chosen once per process from the CPU's features and PMAPCC_CPU_ISA (kernels/cpu_isa.h).
#include <pmap/error.h>

#include <atomic>
#include <cstdlib>

#include "kernels/cpu/ops_table.h"
#include "kernels/cpu_isa.h"

namespace pmap::kernels::cpu {
namespace {

std::atomic<const OpsTable*> g_active{nullptr};

#if PMAPCC_HAVE_CPU_AVX2
bool cpu_runs_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}
#endif

const OpsTable* avx2_table() {
#if PMAPCC_HAVE_CPU_AVX2
  return cpu_runs_avx2() ? pmapcc_cpu_ops_avx2() : nullptr;
#else
  return nullptr;
#endif
}

// The table for a variant name, or throws naming what is wrong; `source` says where the name came from.
const OpsTable* table_for(std::string_view name, const char* source) {
  if (name.empty() || name == "auto") {
    const OpsTable* best = avx2_table();
    return best != nullptr ? best : pmapcc_cpu_ops_generic();
  }
  if (name == "generic") return pmapcc_cpu_ops_generic();
  if (name == "avx2") {
    if (const OpsTable* t = avx2_table()) return t;
#if PMAPCC_HAVE_CPU_AVX2
    throw NotAvailable(std::string(source) + ": the avx2 CPU kernels need a CPU with AVX2 and FMA; this one lacks them");
#else
    throw NotAvailable(std::string(source) + ": this build has no avx2 CPU kernels (PMAPCC_CPU_AVX2 was off)");
#endif
  }
  throw ValueError(std::string(source) + ": unknown CPU kernel variant '" + std::string(name) +
                   "' (expected generic, avx2 or auto)");
}

const OpsTable& active() {
  if (const OpsTable* t = g_active.load(std::memory_order_acquire)) return *t;
  const char* env = std::getenv("PMAPCC_CPU_ISA");
  const OpsTable* chosen = table_for(env == nullptr ? "" : env, "PMAPCC_CPU_ISA");
  const OpsTable* expected = nullptr;
  g_active.compare_exchange_strong(expected, chosen, std::memory_order_acq_rel);
  return *g_active.load(std::memory_order_acquire);
}

}  // namespace

std::vector<std::string> available_isas() {
  std::vector<std::string> out{"generic"};
  if (avx2_table() != nullptr) out.emplace_back("avx2");
  return out;
}

std::string isa() { return active().isa; }

void set_isa(std::string_view name) { g_active.store(table_for(name, "set_isa"), std::memory_order_release); }

std::size_t conv2d_workspace_bytes(const Conv2dParams& p) { return active().conv2d_workspace_bytes(p); }
void conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y, void* ws) {
  active().conv2d_forward(p, x, w, b, y, ws);
}
void conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, void* ws) {
  active().conv2d_backward(p, x, w, dy, dx, dw, db, ws);
}
void avg_pool_forward(AvgPoolParams p, const float* x, float* y) { active().avg_pool_forward(p, x, y); }
void avg_pool_backward(AvgPoolParams p, const float* dy, float* dx) { active().avg_pool_backward(p, dy, dx); }
void avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx) {
  active().avg_pool_relu_backward(p, r, dy, dx);
}
std::size_t dense_workspace_bytes(const DenseParams& p) { return active().dense_workspace_bytes(p); }
void dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y, void* ws) {
  active().dense_forward(p, x, w, b, y, ws);
}
void dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                    void* ws) {
  active().dense_backward(p, x, w, dy, dx, dw, db, ws);
}
void relu_forward(std::size_t n, const float* x, float* y) { active().relu_forward(n, x, y); }
void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) { active().relu_backward(n, y, dy, dx); }
void softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels, float* loss,
                           float* dlogits, float* probs, std::int32_t* correct) {
  active().softmax_cross_entropy(p, logits, labels, loss, dlogits, probs, correct);
}
void sgd_momentum_update(SgdParams p, std::size_t n, float* params, float* momentum, const float* grads) {
  active().sgd_momentum_update(p, n, params, momentum, grads);
}
void reduce_sum(int members, std::size_t n, const float* x, float* out) { active().reduce_sum(members, n, x, out); }
void reduce_mean(int members, std::size_t n, const float* x, float* out) { active().reduce_mean(members, n, x, out); }
std::size_t matmul_workspace_bytes(const MatmulParams& p) { return active().matmul_workspace_bytes(p); }
void matmul(MatmulParams p, const float* a, const float* b, float* c, void* ws) { active().matmul(p, a, b, c, ws); }

}  // namespace pmap::kernels::cpu
