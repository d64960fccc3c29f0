// bench_peak: this machine's arithmetic peak per core, measured, beside what pmapcc's GEMM reaches with each
// of its CPU kernel variants. The peak is chains of fused multiply-adds on registers, nothing from memory:
// AVX2 (8 fp32 lanes), AVX-512 (16 lanes) and AVX512_BF16's vdpbf16ps (32 bf16 products summed into 16 fp32
// lanes), each with enough independent accumulators to cover the instruction's latency (12 chains; 24 for
// vdpbf16ps). One thread, pinned to nothing; medians over repetitions. A row this CPU cannot run prints
// "n/a". Last, pmapcc's bf16 GEMM (the products of bf16 mixed precision) on each of its paths (AMX tiles,
// vdpbf16ps vectors, fp32 FMAs on the rounded operands) at the same size. The last line is the
// same figures as one JSON object (null where a row cannot run), which
// bench/run_train_bench.py reads for its roofline. Usage:
//   bench_peak [--reps R] [--size N]      (defaults 7 repetitions; sgemm at N = 1024)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <immintrin.h>

#include <pmap/error.h>
#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu_backend.h>

#include "machine.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr long kIterations = 20'000'000;  // per repetition: 0.03 to 0.2 s at the peak

// 12 independent chains of `acc = x * y + acc` on 8 fp32 lanes; returns a lane sum so nothing is dropped.
__attribute__((target("avx2,fma"))) float fma_avx2(long iterations) {
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_set1_ps(0.0f);
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm256_fmadd_ps(x, a, y);
  }
  __m256 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm256_add_ps(s, acc[k]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

// The first lane of the accumulators' sum (so that no chain is dropped).
template <int N> __attribute__((target("avx512f"))) float lane0(const __m512 (&acc)[N]) {
  float sum = 0.0f, lanes[16];
  for (const __m512& a : acc) {
    _mm512_storeu_ps(lanes, a);
    sum += lanes[0];
  }
  return sum;
}

// The same on 16 lanes.
__attribute__((target("avx512f"))) float fma_avx512(long iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_set1_ps(0.0f);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm512_fmadd_ps(x, a, y);
  }
  return lane0(acc);
}

// 24 chains of vdpbf16ps (its latency is longer than an FMA's): each lane adds two bf16 products to its
// fp32 sum (64 flops per instruction).
__attribute__((target("avx512f,avx512bf16"))) float dot_bf16(long iterations) {
  __m512 acc[24];
  for (auto& a : acc) a = _mm512_set1_ps(0.0f);
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 24
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, y);
  }
  return lane0(acc);
}

struct Row {
  std::string what;
  const char* key;  // its name in the JSON line
  bool runs;
  double flops_per_iteration;
  float (*kernel)(long);
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// GFLOP/s of `row`, the median of `reps` repetitions after one warm-up.
double measure(const Row& row, int reps) {
  volatile float sink = row.kernel(kIterations / 10);
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    sink = sink + row.kernel(kIterations);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(row.flops_per_iteration * static_cast<double>(kIterations) / s / 1e9);
  }
  return median(rates);
}

// pmapcc's one-thread sgemm (matmul, n x n x n) with the active CPU kernel variant: median GFLOP/s.
double sgemm(int n, int reps) {
  pmap::kernels::MatmulParams p;
  p.rows = p.cols = p.depth = n;
  const std::size_t elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(elems, 0.5f), b(elems, 0.25f), c(elems, 0.0f);
  std::vector<unsigned char> ws(pmap::kernels::cpu_backend().matmul_workspace_bytes(p));
  pmap::kernels::cpu_backend().matmul(p, a.data(), b.data(), c.data(), ws.data());
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    pmap::kernels::cpu_backend().matmul(p, a.data(), b.data(), c.data(), ws.data());
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(2.0 * n * n * static_cast<double>(n) / s / 1e9);
  }
  return median(rates);
}

// pmapcc's one-thread bf16 GEMM (bf16 products, fp32 sums; kernels/cpu/shared/bf16_gemm.h), n x n x n: median GFLOP/s.
// m x n x k, a transposed or not (stored k x m).
double gemm_bf16(pmap::kernels::bf16::Path path, long m, long n, long k, bool a_transposed, int reps) {
  std::vector<float> a(static_cast<std::size_t>(m * k), 0.5f), b(static_cast<std::size_t>(k * n), 0.25f),
      c(static_cast<std::size_t>(m * n), 0.0f);
  std::vector<unsigned char> pack(pmap::kernels::bf16::gemm_pack_bytes(m, n, k));
  const auto run = [&] {
    pmap::kernels::bf16::gemm(path, m, n, k, {a.data(), a_transposed}, {b.data()}, c.data(), false, pack.data(),
                              pack.size());
  };
  run();
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    run();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / s / 1e9);
  }
  return median(rates);
}

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", v);
  return text;
}

int positive_flag(const char* name, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || v < 1 || v > 100000) {
    std::fprintf(stderr, "bench_peak: %s: expected a positive integer, got '%s'\n", name, value);
    std::exit(2);
  }
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, size = 1024;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if ((flag == "--reps" || flag == "--size") && i + 1 < argc) {
      (flag == "--reps" ? reps : size) = positive_flag(argv[i], argv[i + 1]);
      ++i;
    } else {
      std::fprintf(stderr, "bench_peak: unknown argument '%s'\nusage: bench_peak [--reps R] [--size N]\n", argv[i]);
      return 2;
    }
  }
  __builtin_cpu_init();
  std::printf("bench_peak: %s\ncpu: %s\nload before: %s\n", bench::command_line(argc, argv).c_str(),
              bench::cpu_model().c_str(), bench::first_line("/proc/loadavg").c_str());
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool has_bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  const Row rows[] = {
      {"fp32 FMA, AVX2 (8 lanes x 2 flops)", "fma_avx2_gflops", avx2, 12 * 8 * 2.0, fma_avx2},
      {"fp32 FMA, AVX-512 (16 lanes x 2 flops)", "fma_avx512_gflops", avx512, 12 * 16 * 2.0, fma_avx512},
      {"bf16 dot product into fp32, vdpbf16ps (16 lanes x 4 flops)", "dot_bf16_gflops", has_bf16, 24 * 16 * 4.0,
       dot_bf16},
  };
  std::printf("\nPeak per core (register-resident chains, one thread, median of %d):\n", reps);
  double best_fp32 = 0, bf16_peak = 0;
  std::string json = "{\"kind\":\"peak\",\"reps\":" + std::to_string(reps) + ",\"sgemm_size\":" + std::to_string(size);
  for (const Row& r : rows) {
    json += ",\"" + std::string(r.key) + "\":";
    if (!r.runs) {
      std::printf("  %-62s n/a (this CPU lacks it)\n", r.what.c_str());
      json += "null";
      continue;
    }
    const double g = measure(r, reps);
    if (r.kernel != dot_bf16) best_fp32 = std::max(best_fp32, g);
    if (r.kernel == dot_bf16) bf16_peak = g;
    std::printf("  %-62s %8.1f GFLOP/s\n", r.what.c_str(), g);
    json += number(g);
  }
  json += ",\"best_fp32_gflops\":" + number(best_fp32) + ",\"sgemm_gflops\":{";
  std::printf("\npmapcc sgemm (matmul %dx%dx%d, one thread, median of %d), per CPU kernel variant:\n", size, size,
              size, reps);
  try {
    for (const std::string& isa : pmap::kernels::cpu::available_isas()) {
      pmap::kernels::cpu::set_isa(isa);
      const double g = sgemm(size, reps);
      std::printf("  %-10s %8.1f GFLOP/s  (%.0f %% of the best fp32 peak)\n", isa.c_str(), g,
                  best_fp32 > 0 ? 100.0 * g / best_fp32 : 0.0);
      json += (json.back() == '{' ? "\"" : ",\"") + isa + "\":" + number(g);
    }
  } catch (const pmap::Error& e) {
    std::fprintf(stderr, "bench_peak: error: %s\n", e.what());
    return 1;
  }
  json += "},\"gemm_bf16_gflops\":{";
  namespace bf16 = pmap::kernels::bf16;
  std::printf("\npmapcc bf16 GEMM (bf16 products, fp32 sums; %dx%dx%d, one thread, median of %d), per path "
              "(auto takes %s here):\n",
              size, size, size, reps, bf16::name(bf16::best_path()));
  for (bf16::Path path : {bf16::Path::amx, bf16::Path::avx512, bf16::Path::fma}) {
    json += (json.back() == '{' ? "\"" : ",\"") + std::string(bf16::name(path)) + "\":";
    if (!bf16::supported(path)) {
      std::printf("  %-10s n/a (this CPU does not run it)\n", bf16::name(path));
      json += "null";
      continue;
    }
    const double g = gemm_bf16(path, size, size, size, false, reps);
    std::printf("  %-10s %8.1f GFLOP/s  (%.2fx the vdpbf16ps peak, %.2fx the best fp32 peak)\n", bf16::name(path), g,
                bf16_peak > 0 ? g / bf16_peak : 0.0, best_fp32 > 0 ? g / best_fp32 : 0.0);
    json += number(g);
  }
  json += "}";
  // The products of the Flax CNN's training step with batch 128 (bench_train's): the dense layer forward,
  // and the 64-channel conv's forward and weight gradient through im2col (a transposed in the latter).
  struct Shape {
    const char* what;
    long m, n, k;
    bool a_transposed;
  };
  const Shape shapes[] = {{"dense forward 128x128x3136", 128, 128, 3136, false},
                          {"conv forward 100352x64x288", 100352, 64, 288, false},
                          {"conv weight grad 288x64x100352, a^T", 288, 64, 100352, true}};
  std::printf("\npmapcc bf16 GEMM at the CNN's shapes (m x n x k; one thread, median of %d), GFLOP/s:\n", reps);
  std::printf("  %-38s %10s %10s %10s\n", "", "amx", "avx512", "fma");
  json += ",\"gemm_bf16_shapes\":{";
  for (const Shape& sh : shapes) {
    std::printf("  %-38s", sh.what);
    json += (json.back() == '{' ? "\"" : ",\"") + std::string(sh.what) + "\":{";
    for (bf16::Path path : {bf16::Path::amx, bf16::Path::avx512, bf16::Path::fma}) {
      json += (json.back() == '{' ? "\"" : ",\"") + std::string(bf16::name(path)) + "\":";
      if (!bf16::supported(path)) {
        std::printf(" %10s", "n/a");
        json += "null";
        continue;
      }
      const double g = gemm_bf16(path, sh.m, sh.n, sh.k, sh.a_transposed, reps);
      std::printf(" %10.1f", g);
      json += number(g);
    }
    json += "}";
    std::printf("\n");
  }
  json += "}";
  std::printf("\nload after: %s\n%s}\n", bench::first_line("/proc/loadavg").c_str(), json.c_str());
  return 0;
}
