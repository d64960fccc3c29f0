// The anchor for pmapcc's CPU kernels: oneDNN 2.6 (Debian's libdnnl-dev, what PyTorch 1.13 runs its CPU
// convolutions on) and pmapcc's kernels on the same layers, in one run: each product layer of the Flax CNN
// and of the Keras convnet at batch B, one member, T threads each (a device's share of the cores), fp32 and
// bf16 (bf16 operands, fp32 sums and results, as pmapcc's bf16 path computes).
//
//   build/default/bench/bench_onednn_layers [--batch 128] [--reps 15] [--threads 1] [--precision fp32|bf16|both]
//
// Times are medians of R calls after one warm-up, inputs random. Forward: the product with its bias and a
// fused ReLU where the model has one. Backward: pmapcc's one call (dW, db and, but for a model's first layer,
// dX) against oneDNN's backward-weights (with the bias) plus backward-data. oneDNN runs at its best: it picks
// its own memory layouts ("any") and the inputs are reordered into them before the clock starts; pmapcc
// reads NHWC and HWIO as the models hold them. Every layer here takes a bias (Keras's Conv_0 and Conv_1 have
// none: theirs are timed with one), and a ReLU is fused only where it follows the product directly (the
// Keras convolutions' ReLU comes after a BatchNorm). A precision the CPU (or oneDNN's build) cannot run prints
// n/a with each library's reason; the end lists the implementations oneDNN chose (DNNL_VERBOSE's names).
// Built only where CMake finds oneDNN (find_package(dnnl)); scripts/setup.sh --bench installs it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include <dnnl.hpp>

#include <pmap/error.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cpu_backend.h>

#include "machine.h"

namespace {

namespace kernels = pmap::kernels;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

struct Layer {
  const char* model;
  const char* name;
  bool conv;
  int size, cin, cout, kernel, stride;  // conv: input H = W, channels, kernel, stride; dense: cin -> cout
  bool same, relu, first;               // SAME padding; a fused ReLU; a model's first layer (no dX)
};

// The product layers of the two models at 28x28x1, in order.
const std::vector<Layer> kLayers{
    {"flax-cnn", "Conv_0", true, 28, 1, 32, 3, 1, true, true, true},
    {"flax-cnn", "Conv_1", true, 14, 32, 64, 3, 1, true, true, false},
    {"flax-cnn", "Dense_0", false, 0, 3136, 256, 0, 0, false, true, false},
    {"flax-cnn", "Dense_1", false, 0, 256, 10, 0, 0, false, false, false},
    {"keras-convnet", "Conv_0", true, 28, 1, 12, 3, 1, true, false, true},
    {"keras-convnet", "Conv_1", true, 28, 12, 24, 6, 2, false, false, false},
    {"keras-convnet", "large_k", true, 12, 24, 32, 6, 2, true, false, false},
    {"keras-convnet", "Dense_0", false, 0, 32, 256, 0, 0, false, true, false},
    {"keras-convnet", "Dense_1", false, 0, 256, 10, 0, 0, false, false, false},
};

struct Options {
  int batch = 128, reps = 15, threads = 1;
  std::string precision = "both";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw pmap::ValueError(flag + " needs a value (see the top of bench/bench_onednn_layers.cpp)");
    const std::string value = argv[++i];
    auto number = [&](int lo, int hi) {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || v < lo || v > hi)
        throw pmap::ValueError(flag + " must be a whole number from " + std::to_string(lo) + " to " +
                               std::to_string(hi) + ", got '" + value + "'");
      return static_cast<int>(v);
    };
    if (flag == "--batch") o.batch = number(1, 4096);
    else if (flag == "--reps") o.reps = number(1, 1000);
    else if (flag == "--threads") o.threads = number(1, 64);
    else if (flag == "--precision" && (value == "fp32" || value == "bf16" || value == "both")) o.precision = value;
    else throw pmap::ValueError("unknown flag or value: " + flag + " " + value +
                                " (--batch, --reps, --threads, --precision fp32|bf16|both)");
  }
  return o;
}

int out_size(const Layer& l) {
  return l.same ? (l.size + l.stride - 1) / l.stride : (l.size - l.kernel) / l.stride + 1;
}

// SAME's split (Flax's and Keras's): the extra pixel after.
std::pair<int, int> same_pads(const Layer& l) {
  const int total = std::max(0, (out_size(l) - 1) * l.stride + l.kernel - l.size);
  return {total / 2, total - total / 2};
}

struct Times {
  double forward = 0, backward = 0;
};

// pmapcc's kernels on the layer (fp32 or bf16 products).
Times time_pmapcc(const Layer& l, const Options& o, kernels::Precision precision, bench::Normals& randoms) {
  const kernels::Backend& be = kernels::cpu_backend();
  Times t;
  if (l.conv) {
    kernels::Conv2dParams p;
    p.batch = o.batch, p.height = p.width = l.size, p.in_channels = l.cin, p.out_channels = l.cout;
    p.kernel_h = p.kernel_w = l.kernel, p.stride_h = p.stride_w = l.stride;
    p.padding = l.same ? kernels::Padding::same : kernels::Padding::valid;
    p.relu = l.relu, p.precision = precision;
    const int os = out_size(l);
    const auto x = randoms(std::size_t(o.batch) * l.size * l.size * l.cin);
    const auto w = randoms(std::size_t(l.kernel) * l.kernel * l.cin * l.cout);
    const auto b = randoms(std::size_t(l.cout));
    const auto dy = randoms(std::size_t(o.batch) * os * os * l.cout);
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size()), db(b.size());
    std::vector<unsigned char> ws(be.conv().conv2d_workspace_bytes(p));
    float* dx_or_none = l.first ? nullptr : dx.data();
    t.forward = bench::median_seconds(o.reps, [&] {
      be.conv().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data());
    });
    t.backward = bench::median_seconds(o.reps, [&] {
      be.conv().conv2d_backward(p, x.data(), w.data(), dy.data(), dx_or_none, dw.data(), db.data(), ws.data());
    });
  } else {
    kernels::DenseParams p;
    p.batch = o.batch, p.in_features = l.cin, p.out_features = l.cout, p.relu = l.relu, p.precision = precision;
    const auto x = randoms(std::size_t(o.batch) * l.cin), w = randoms(std::size_t(l.cin) * l.cout);
    const auto b = randoms(std::size_t(l.cout)), dy = randoms(std::size_t(o.batch) * l.cout);
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size()), db(b.size());
    std::vector<unsigned char> ws(be.dense().dense_workspace_bytes(p));
    t.forward = bench::median_seconds(o.reps, [&] {
      be.dense().dense_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data());
    });
    t.backward = bench::median_seconds(o.reps, [&] {
      be.dense().dense_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), ws.data());
    });
  }
  return t;
}

// A memory in oneDNN's chosen layout `want`, filled from plain data (`plain` layout, f32) by a reorder.
dnnl::memory prepared(const dnnl::engine& eng, dnnl::stream& s, const dnnl::memory::desc& want,
                      const dnnl::memory::dims& dims, tag plain, const std::vector<float>& values) {
  dnnl::memory src({dims, dt::f32, plain}, eng, const_cast<float*>(values.data()));
  dnnl::memory dst(want, eng);
  dnnl::reorder(src, dst).execute(s, src, dst);
  s.wait();
  return dst;
}

// What oneDNN needs for one layer: the engine, a stream, the operands' data type, the forward's fused ReLU.
struct OneDnn {
  OneDnn(const Layer& l, bool bf16) : in(bf16 ? dt::bf16 : dt::f32) {
    dnnl::post_ops ops;
    if (l.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream s{eng};
  dt in;
  dnnl::primitive_attr attr;
};

// oneDNN's implementations of the three primitives ("fwd jit:avx2, bwd-w gemm:jit, bwd-d ..."), as
// DNNL_VERBOSE names them.
std::string implementations(const std::string& forward, const std::string& weights, const std::string& data) {
  return "fwd " + forward + ", bwd-w " + weights + (data.empty() ? "" : ", bwd-d " + data);
}

// oneDNN's forward `fpd` timed: its source, weights and bias from plain data (NHWC or NC, HWIO or IO), as
// pmapcc's read them.
template <class Forward>
double time_forward(OneDnn& d, const typename Forward::primitive_desc& fpd, int reps, const dnnl::memory::dims& src_d,
                    tag src_tag, const std::vector<float>& x, const dnnl::memory::dims& wei_d, tag wei_tag,
                    const std::vector<float>& w, const std::vector<float>& b) {
  dnnl::memory src = prepared(d.eng, d.s, fpd.src_desc(), src_d, src_tag, x);
  dnnl::memory wei = prepared(d.eng, d.s, fpd.weights_desc(), wei_d, wei_tag, w);
  dnnl::memory bias({{static_cast<dnnl::memory::dim>(b.size())}, dt::f32, tag::a}, d.eng, const_cast<float*>(b.data()));
  dnnl::memory dst(fpd.dst_desc(), d.eng);
  const Forward fwd(fpd);
  return bench::median_seconds(reps, [&] {
    fwd.execute(d.s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, dst}});
    d.s.wait();
  });
}

// oneDNN on a convolution: forward (bias, fused ReLU), backward-weights (bias) + backward-data (not for a
// first layer). bf16: bf16 operands (sources, weights, output gradients), f32 results.
Times time_onednn_conv(const Layer& l, const Options& o, bool bf16, bench::Normals& randoms, std::string& impl) {
  OneDnn d(l, bf16);
  const dnnl::memory::dim n = o.batch;
  const int os = out_size(l);
  const auto [pad_lo, pad_hi] = l.same ? same_pads(l) : std::pair{0, 0};
  const dnnl::memory::dims src_d{n, l.cin, l.size, l.size}, wei_d{l.cout, l.cin, l.kernel, l.kernel},
      bias_d{l.cout}, dst_d{n, l.cout, os, os}, strides{l.stride, l.stride}, lo{pad_lo, pad_lo}, hi{pad_hi, pad_hi};
  const dnnl::memory::desc src_any(src_d, d.in, tag::any), wei_any(wei_d, d.in, tag::any),
      bias_md(bias_d, dt::f32, tag::a), dst_f32(dst_d, dt::f32, tag::any), ddst_any(dst_d, d.in, tag::any),
      dsrc_f32(src_d, dt::f32, tag::any), dwei_f32(wei_d, dt::f32, tag::any);
  const auto direct = dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::primitive_desc fpd(
      {dnnl::prop_kind::forward_training, direct, src_any, wei_any, bias_md, dst_f32, strides, lo, hi}, d.attr, d.eng);
  const auto x = randoms(std::size_t(n) * l.size * l.size * l.cin);
  const auto w = randoms(std::size_t(l.kernel) * l.kernel * l.cin * l.cout);
  const auto b = randoms(std::size_t(l.cout));
  const auto dy = randoms(std::size_t(n) * os * os * l.cout);
  Times t;
  t.forward = time_forward<dnnl::convolution_forward>(d, fpd, o.reps, src_d, tag::nhwc, x, wei_d, tag::hwio, w, b);
  const dnnl::convolution_backward_weights::primitive_desc wpd(
      {direct, src_any, dwei_f32, bias_md, ddst_any, strides, lo, hi}, d.eng, fpd);
  dnnl::memory src_w = prepared(d.eng, d.s, wpd.src_desc(), src_d, tag::nhwc, x);
  dnnl::memory ddst_w = prepared(d.eng, d.s, wpd.diff_dst_desc(), dst_d, tag::nhwc, dy);
  dnnl::memory dwei(wpd.diff_weights_desc(), d.eng), dbias({bias_d, dt::f32, tag::a}, d.eng);
  const dnnl::convolution_backward_weights bww(wpd);
  std::unique_ptr<dnnl::convolution_backward_data> bwd;
  std::unordered_map<int, dnnl::memory> data_args;
  std::string data_impl;
  if (!l.first) {
    const dnnl::convolution_backward_data::primitive_desc dpd({direct, dsrc_f32, wei_any, ddst_any, strides, lo, hi},
                                                              d.eng, fpd);
    data_args = {{DNNL_ARG_DIFF_DST, prepared(d.eng, d.s, dpd.diff_dst_desc(), dst_d, tag::nhwc, dy)},
                 {DNNL_ARG_WEIGHTS, prepared(d.eng, d.s, dpd.weights_desc(), wei_d, tag::hwio, w)},
                 {DNNL_ARG_DIFF_SRC, dnnl::memory(dpd.diff_src_desc(), d.eng)}};
    bwd = std::make_unique<dnnl::convolution_backward_data>(dpd);
    data_impl = dpd.impl_info_str();
  }
  t.backward = bench::median_seconds(o.reps, [&] {
    bww.execute(d.s, {{DNNL_ARG_SRC, src_w}, {DNNL_ARG_DIFF_DST, ddst_w}, {DNNL_ARG_DIFF_WEIGHTS, dwei},
                      {DNNL_ARG_DIFF_BIAS, dbias}});
    if (bwd) bwd->execute(d.s, data_args);
    d.s.wait();
  });
  impl = implementations(fpd.impl_info_str(), wpd.impl_info_str(), data_impl);
  return t;
}

// oneDNN on a dense layer (an inner product), as time_onednn_conv.
Times time_onednn_dense(const Layer& l, const Options& o, bool bf16, bench::Normals& randoms, std::string& impl) {
  OneDnn d(l, bf16);
  const dnnl::memory::dim n = o.batch;
  const dnnl::memory::dims src_d{n, l.cin}, wei_d{l.cout, l.cin}, bias_d{l.cout}, dst_d{n, l.cout};
  const dnnl::memory::desc src_any(src_d, d.in, tag::any), wei_any(wei_d, d.in, tag::any),
      bias_md(bias_d, dt::f32, tag::a), dst_f32(dst_d, dt::f32, tag::any), ddst_any(dst_d, d.in, tag::any),
      dsrc_f32(src_d, dt::f32, tag::any), dwei_f32(wei_d, dt::f32, tag::any);
  const dnnl::inner_product_forward::primitive_desc fpd(
      {dnnl::prop_kind::forward_training, src_any, wei_any, bias_md, dst_f32}, d.attr, d.eng);
  const auto x = randoms(std::size_t(n) * l.cin), w = randoms(std::size_t(l.cin) * l.cout);
  const auto b = randoms(std::size_t(l.cout)), dy = randoms(std::size_t(n) * l.cout);
  Times t;
  t.forward = time_forward<dnnl::inner_product_forward>(d, fpd, o.reps, src_d, tag::nc, x, wei_d, tag::io, w, b);
  const dnnl::inner_product_backward_weights::primitive_desc wpd({src_any, dwei_f32, bias_md, ddst_any}, d.eng, fpd);
  const dnnl::inner_product_backward_data::primitive_desc dpd({dsrc_f32, wei_any, ddst_any}, d.eng, fpd);
  dnnl::memory src_w = prepared(d.eng, d.s, wpd.src_desc(), src_d, tag::nc, x);
  dnnl::memory ddst_w = prepared(d.eng, d.s, wpd.diff_dst_desc(), dst_d, tag::nc, dy);
  dnnl::memory ddst_d = prepared(d.eng, d.s, dpd.diff_dst_desc(), dst_d, tag::nc, dy);
  dnnl::memory wei_d2 = prepared(d.eng, d.s, dpd.weights_desc(), wei_d, tag::io, w);
  dnnl::memory dwei(wpd.diff_weights_desc(), d.eng), dbias({bias_d, dt::f32, tag::a}, d.eng);
  dnnl::memory dsrc(dpd.diff_src_desc(), d.eng);
  const dnnl::inner_product_backward_weights bww(wpd);
  const dnnl::inner_product_backward_data bwd(dpd);
  t.backward = bench::median_seconds(o.reps, [&] {
    bww.execute(d.s, {{DNNL_ARG_SRC, src_w}, {DNNL_ARG_DIFF_DST, ddst_w}, {DNNL_ARG_DIFF_WEIGHTS, dwei},
                      {DNNL_ARG_DIFF_BIAS, dbias}});
    bwd.execute(d.s, {{DNNL_ARG_DIFF_DST, ddst_d}, {DNNL_ARG_WEIGHTS, wei_d2}, {DNNL_ARG_DIFF_SRC, dsrc}});
    d.s.wait();
  });
  impl = implementations(fpd.impl_info_str(), wpd.impl_info_str(), dpd.impl_info_str());
  return t;
}

// Each reason once, in the order first given.
void add_reason(std::vector<std::string>& reasons, const std::string& reason) {
  if (std::find(reasons.begin(), reasons.end(), reason) == reasons.end()) reasons.push_back(reason);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const pmap::Error& e) {
    std::fprintf(stderr, "bench_onednn_layers: %s\n", e.what());
    return 2;
  }
  // oneDNN's threads: OpenMP reads OMP_NUM_THREADS when the program loads, so the program starts itself
  // again with it set; pmapcc's through its own setting.
  const std::string threads = std::to_string(o.threads);
  if (const char* set = std::getenv("OMP_NUM_THREADS"); set == nullptr || threads != set) {
    setenv("OMP_NUM_THREADS", threads.c_str(), 1);
    execv("/proc/self/exe", argv);
    std::perror("bench_onednn_layers: cannot restart itself with OMP_NUM_THREADS set: execv /proc/self/exe");
    return 1;
  }
  kernels::cpu::set_threads(o.threads);
  std::printf("machine: %s, %u hardware threads; load %s\ncommand: %s\n", bench::cpu_model().c_str(),
              std::thread::hardware_concurrency(), bench::first_line("/proc/loadavg").c_str(),
              bench::command_line(argc, argv).c_str());
  std::printf("oneDNN %d.%d.%d, pmapcc CPU kernels %s; batch %d, %d thread(s) each, median of %d calls\n\n",
              dnnl::version()->major, dnnl::version()->minor, dnnl::version()->patch, kernels::cpu::isa().c_str(),
              o.batch, o.threads, o.reps);
  std::printf("%-28s %-5s %11s %11s %8s %11s %11s %8s\n", "layer", "prec", "pmapcc fwd", "oneDNN fwd", "ratio",
              "pmapcc bwd", "oneDNN bwd", "ratio");
  std::printf("%-28s %-5s %11s %11s %8s %11s %11s %8s\n", "", "", "ms", "ms", "oD/pm", "ms", "ms", "oD/pm");
  bench::Normals randoms(1);
  std::vector<std::string> why;    // what a library said where it printed n/a
  std::vector<std::string> impls;  // oneDNN's implementations, per row
  for (const bool bf16 : {false, true}) {
    if (o.precision != "both" && (o.precision == "bf16") != bf16) continue;
    for (const Layer& l : kLayers) {
      const std::string name = std::string(l.model) + " " + l.name;
      Times p, d;
      std::string pm_note, od_note;
      try {
        p = time_pmapcc(l, o, bf16 ? kernels::Precision::bf16 : kernels::Precision::fp32, randoms);
      } catch (const pmap::Error& e) {  // bf16 on a CPU without AVX-512: refused
        pm_note = "n/a";
        add_reason(why, std::string("pmapcc: ") + e.what());
      }
      std::string impl;
      try {
        d = l.conv ? time_onednn_conv(l, o, bf16, randoms, impl) : time_onednn_dense(l, o, bf16, randoms, impl);
      } catch (const dnnl::error& e) {  // no implementation for this CPU and data type
        od_note = "n/a";
        add_reason(why, std::string("oneDNN: ") + e.what());
      }
      if (!impl.empty()) impls.push_back(name + (bf16 ? " bf16: " : " fp32: ") + impl);
      auto cell = [](const std::string& note, double seconds) {
        char buf[32];
        if (note.empty()) std::snprintf(buf, sizeof buf, "%.3f", seconds * 1e3);
        return note.empty() ? std::string(buf) : note;
      };
      auto ratio = [&](double pm, double od) {
        char buf[32];
        if (!pm_note.empty() || !od_note.empty()) return std::string("-");
        std::snprintf(buf, sizeof buf, "%.2f", od / pm);
        return std::string(buf);
      };
      std::printf("%-28s %-5s %11s %11s %8s %11s %11s %8s\n", name.c_str(), bf16 ? "bf16" : "fp32",
                  cell(pm_note, p.forward).c_str(), cell(od_note, d.forward).c_str(),
                  ratio(p.forward, d.forward).c_str(),
                  cell(pm_note, p.backward).c_str(), cell(od_note, d.backward).c_str(),
                  ratio(p.backward, d.backward).c_str());
    }
  }
  std::printf("\nratio: oneDNN's time over pmapcc's (above 1: pmapcc is faster)\n");
  for (const std::string& w : why) std::printf("n/a: %s\n", w.c_str());
  std::printf("\noneDNN's implementations:\n");
  for (const std::string& i : impls) std::printf("  %s\n", i.c_str());
  return 0;
}
