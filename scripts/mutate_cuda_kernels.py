#!/usr/bin/env python3
"""Checks that the host runs of the CUDA kernels catch a broken index: breaks one index in each CUDA kernel
(and in the GEMM's column-major mapping), one at a time, in a scratch git worktree built with the `cpu`
preset (the CUDA kernels as host code), and runs the CUDA host-run tests after each. Every mutation must
make a test fail; the script exits 1 when one does not, and prints one line per mutation.

  python3 scripts/mutate_cuda_kernels.py [--worktree DIR] [--only SUBSTRING]

Takes about a minute per mutation on 2 cores (an incremental build and the tests). Not part of CI.
"""
import argparse, os, subprocess, sys

# (file, text, broken text): each text occurs exactly once in its file.
MUTATIONS = [
    ("kernels/cuda/conv.cu", "ix = ox * p.stride_w - plan.g.pad_left + kx", "ix = ox * p.stride_w - plan.g.pad_left + ky"),
    ("kernels/cuda/conv.cu", "acc += dcol[row * plan.patch + (ky * p.kernel_w + kx) * p.in_channels + c];",
     "acc += dcol[row * plan.patch + (kx * p.kernel_w + ky) * p.in_channels + c];"),
    ("kernels/cuda/conv.cu", "g.stride_a = plan.col_members == 1 ? 0 : static_cast<long long>(plan.pixels) * plan.patch;",
     "g.stride_a = 0;"),
    ("kernels/cuda/linear.cu", "+ i % static_cast<std::size_t>(cols)];", "+ (i + 1) % static_cast<std::size_t>(cols)];"),
    ("kernels/cuda/linear.cu", "for (std::size_t r = first; r < last; ++r) sum += am[r * static_cast<std::size_t>(cols)];",
     "for (std::size_t r = first + 1; r < last; ++r) sum += am[r * static_cast<std::size_t>(cols)];"),
    ("kernels/cuda/linear.cu", "for (std::size_t k = 0; k < chunks; ++k) sum += pm[k * static_cast<std::size_t>(cols)];",
     "for (std::size_t k = 0; k < chunks; ++k) sum += pm[k];"),
    ("kernels/cuda/pool.cu", "for (int kx = 0; kx < p.window_w; ++kx) acc += row[kx * p.channels + c];",
     "for (int kx = 0; kx < p.window_w; ++kx) acc += row[kx + c];"),
    ("kernels/cuda/pool.cu", "const float g = dyi[(static_cast<std::size_t>(oy) * plan.g.out_width + ox) * p.channels + c] * plan.scale;",
     "const float g = dyi[(static_cast<std::size_t>(ox) * plan.g.out_width + oy) * p.channels + c] * plan.scale;"),
    ("kernels/cuda/pool.cu", "if (r != nullptr && !(r[i] > 0.0f)) acc = 0.0f;",
     "if (r != nullptr && !(r[i == 0 ? 0 : i - 1] > 0.0f)) acc = 0.0f;"),
    ("kernels/cuda/loss.cu", "if (probs != nullptr) probs[row * k + j] = static_cast<float>(prob);",
     "if (probs != nullptr) probs[row * k + (k - 1 - j)] = static_cast<float>(prob);"),
    ("kernels/cuda/loss.cu", "const int label = labels == nullptr ? -1 : labels[(p.shared_labels ? 0 : m * p.batch) + n];",
     "const int label = labels == nullptr ? -1 : labels[(p.shared_labels ? 0 : m * p.batch) + n / 2];"),
    ("kernels/cuda/loss.cu", "for (std::size_t r = m * p.batch; r < (m + 1) * p.batch; ++r) {",
     "for (std::size_t r = m * p.batch; r + 1 < (m + 1) * p.batch; ++r) {"),
    ("kernels/cuda/elementwise.cu", "y[i] = unary_value<Op>(x[i]); }",
     "y[i] = unary_value<Op>(x[i == 0 ? 0 : i - 1]); }"),
    ("kernels/cuda/elementwise.cu",
     "case UnaryOp::relu: ex_.launch(ActivationBackward<UnaryOp::relu>{y, dy, dx}, n); return;",
     "case UnaryOp::relu: ex_.launch(ActivationBackward<UnaryOp::relu>{dy, y, dx}, n); return;"),
    ("kernels/cuda/optimizer.cu", "sgd_trace_element(p, lr[i / n], grads[i], trace[i], next[i], updates[i]);",
     "sgd_trace_element(p, lr[i / n], grads[i == 0 ? 0 : i - 1], trace[i], next[i], updates[i]);"),
    ("kernels/cuda/optimizer.cu", "alpha[m] = adam_alpha(p, lr[m], *step); }",
     "alpha[m] = adam_alpha(p, lr[0], *step); }"),
    ("kernels/cuda/optimizer.cu", "for (std::size_t i = m * n; i < (m + 1) * n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);",
     "for (std::size_t i = m * n + 1; i < (m + 1) * n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);"),
    ("kernels/cuda/elementwise.cu", "for (std::size_t i = m * n; i < (m + 1) * n; ++i) acc += x[i];",
     "for (std::size_t i = m * n + 1; i < (m + 1) * n; ++i) acc += x[i];"),
    ("kernels/cuda/metrics.cu", "for (int j = 1; j < count; ++j) acc = acc + x[static_cast<std::size_t>(j) * n + i];",
     "for (int j = 1; j < count; ++j) acc = acc + x[static_cast<std::size_t>(j) * n + (i == 0 ? 0 : i - 1)];"),
    ("kernels/cuda/metrics.cu", "PMAPCC_HD void operator()(std::size_t i) const { x[i] = x[i] / divisor; }",
     "PMAPCC_HD void operator()(std::size_t i) const { x[i] = x[i == 0 ? 0 : i - 1] / divisor; }"),
    ("kernels/cuda/metrics.cu", "const float* s = scores + row * classes;", "const float* s = scores + row * (classes - 1);"),
    ("src/device_kernels.h", "for (int k = 1; k < p.n; ++k) acc = combine_ranks(acc, static_cast<const T*>(p.in[k])[src_off + i], op);",
     "for (int k = 1; k < p.n; ++k) acc = combine_ranks(acc, static_cast<const T*>(p.in[k])[src_off + i + 1], op);"),
    ("src/device_kernels.h", "PMAPCC_HD void operator()(std::size_t i) const { x[i] = x[i] / divisor; }",
     "PMAPCC_HD void operator()(std::size_t i) const { x[i] = x[0] / divisor; }"),
    ("src/device_kernels.h", "const std::size_t first = block * 4;", "const std::size_t first = block * 3;"),
    ("kernels/cuda/exec.cpp", "cm.a = b, cm.lda = g.trans_b ? g.k : g.n, cm.stride_a = g.stride_b;",
     "cm.a = b, cm.lda = g.trans_b ? g.n : g.k, cm.stride_a = g.stride_b;"),
    ("kernels/cuda/dense.cu", "g.stride_a = s.y, g.stride_b = s.w, g.stride_c = static_cast<long long>(p.batch) * p.in_features;",
     "g.stride_a = s.y, g.stride_b = s.w, g.stride_c = static_cast<long long>(p.batch) * p.out_features;"),
]

TESTS = "cuda*,the CUDA backend run on the host*"


def run(cmd, cwd, **kw):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worktree", default="/tmp/pmapcc-mutations")
    ap.add_argument("--only", default="", help="run the mutations whose file or text contains this")
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    wt = a.worktree
    if not os.path.isdir(wt):
        subprocess.run(["git", "worktree", "add", "--detach", wt, "HEAD"], cwd=repo, check=True, capture_output=True)
    for cmd in (["cmake", "--preset", "cpu"], ["cmake", "--build", "build/cpu", "--target", "pmapcc_tests"]):
        if run(cmd, wt).returncode != 0:
            sys.exit(f"mutate_cuda_kernels: {' '.join(cmd)} failed in {wt}")
    missed = 0
    for path, text, broken in MUTATIONS:
        if a.only and a.only not in path and a.only not in text:
            continue
        f = os.path.join(wt, path)
        original = open(f).read()
        if original.count(text) != 1:
            sys.exit(f"mutate_cuda_kernels: {path}: the text to break occurs {original.count(text)} times: {text}")
        open(f, "w").write(original.replace(text, broken))
        try:
            if run(["cmake", "--build", "build/cpu", "--target", "pmapcc_tests"], wt).returncode != 0:
                print(f"BUILD FAILED  {path}: {broken}")
                continue
            r = run(["build/cpu/tests/pmapcc_tests", f"-tc={TESTS}"], wt, timeout=900)
            summary = next((l for l in r.stdout.splitlines() if "test cases:" in l), "no summary (crashed)")
            caught = r.returncode != 0
            missed += 0 if caught else 1
            print(f"{'caught' if caught else 'MISSED'}  {path}: {broken[:80]}  [{' '.join(summary.split())}]", flush=True)
        finally:
            open(f, "w").write(original)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
