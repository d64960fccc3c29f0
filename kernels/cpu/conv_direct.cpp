// CPU conv2d, direct path for small patches (KH*KW*Cin <= kDirectMaxPatch, i.e. the first layer on 1-channel
// images): each image is copied into a zero-padded buffer; the forward sums every output pixel's taps into a
// block of output channels held in SIMD registers (Eigen's packets: 16 floats with AVX-512, 8 with AVX, 4 with
// SSE), and the backward's dw accumulates a few taps at a time over the image's pixels, reading dy once per
// image. Channels left over after the full packets take half and quarter packets (12 channels with AVX-512:
// 8 + 4), and only what is left after those runs one float at a time. In bf16 the padded image, w and dy are
// rounded to bf16 first: their products are exact in fp32, so this is bf16 products summed in fp32.
#include <pmapcc/kernels/cpu/conv_direct.h>

#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>

#include <algorithm>
#include <array>
#include <utility>

namespace PMAPCC_CPU_NS::detail {
namespace {

namespace ei = Eigen::internal;
// Packet types are named through their lane counts (find_best_packet: the widest packet whose width divides
// the count, the narrowest one where none does), not as template arguments of class templates, which would
// drop the vector types' attributes (-Wignored-attributes).
using Packet = ei::packet_traits<float>::type;
template <typename P>
constexpr int lanes_of() {
  return static_cast<int>(sizeof(P) / sizeof(float));
}
constexpr int kLanes = lanes_of<Packet>();
using HalfPacket = ei::find_best_packet<float, kLanes / 2>::type;  // 4 lanes at least (SSE's Packet4f)
using QuarterPacket = ei::find_best_packet<float, kLanes / 4>::type;
constexpr int kWide = 32 / kLanes;  // packets in the forward's widest block of 32 output channels

bool bf16_products(const ConvPlan& plan) { return plan.p.precision == Precision::bf16; }

// padded (PH, PW, Cin) = the image x (H, W, Cin) at offset (pad_top, pad_left), zeros around it; rounded to
// bf16 for bf16 products.
void pad_image(const ConvPlan& plan, const float* x, float* padded) {
  const Conv2dParams& p = plan.p;
  const Index c = p.in_channels;
  std::fill_n(padded, plan.padded_floats, 0.0f);
  for (Index iy = 0; iy < p.height; ++iy) {
    std::copy_n(x + iy * p.width * c, Index{p.width} * c,
                padded + ((iy + plan.g.pad_top) * plan.padded_w + plan.g.pad_left) * c);
  }
  if (bf16_products(plan)) bf16::round_into(padded, plan.padded_floats, padded);
}

// Offsets of the patch's taps in the padded image, relative to the output pixel's first tap.
void tap_offsets(const ConvPlan& plan, Index* offsets) {
  const Conv2dParams& p = plan.p;
  Index t = 0;
  for (Index ky = 0; ky < p.kernel_h; ++ky)
    for (Index kx = 0; kx < p.kernel_w; ++kx)
      for (Index c = 0; c < p.in_channels; ++c) offsets[t++] = (ky * plan.padded_w + kx) * p.in_channels + c;
}

// Where output pixel (oy, ox)'s first tap lies in the padded image.
Index pixel_base(const ConvPlan& plan, Index oy, Index ox) {
  return (oy * plan.p.stride_h * plan.padded_w + ox * plan.p.stride_w) * plan.p.in_channels;
}

// Output channels [o0, o0 + NP * lanes of P) of PX neighbouring output pixels (oy, ox + i): y = b + taps . w,
// each sum in tap order. The PX * NP sums are independent chains of FMAs, enough to hide their latency.
template <typename P, int NP, int PX>
void forward_pixels(const ConvPlan& plan, const Index* offsets, const float* padded, const float* w, const float* b,
                    float* y, Index o0, Index oy, Index ox) {
  const Index cout = plan.p.out_channels;
  P acc[PX][NP];
  const float* taps[PX];
#pragma GCC unroll 8
  for (int i = 0; i < PX; ++i) {
    taps[i] = padded + pixel_base(plan, oy, ox + i);
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j)
      acc[i][j] = b == nullptr ? ei::pset1<P>(0.0f) : ei::ploadu<P>(b + o0 + j * lanes_of<P>());
  }
  for (Index t = 0; t < plan.patch; ++t) {
    const float* wt = w + t * cout + o0;
    P wv[NP];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) wv[j] = ei::ploadu<P>(wt + j * lanes_of<P>());
    const Index offset = offsets[t];
#pragma GCC unroll 8
    for (int i = 0; i < PX; ++i) {
      const P xv = ei::pset1<P>(taps[i][offset]);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[i][j] = ei::pmadd(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < PX; ++i) {
    float* out = y + (oy * plan.g.out_width + ox + i) * cout + o0;
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) ei::pstoreu(out + j * lanes_of<P>(), acc[i][j]);
  }
}

// Output channels [o0, o0 + NP * lanes of P) of one image, about 8 sums at a time (fewer where NP alone
// fills the registers).
template <typename P, int NP>
void forward_packets(const ConvPlan& plan, const Index* offsets, const float* padded, const float* w, const float* b,
                     float* y, Index o0) {
  constexpr int kPixels = NP >= 8 ? 1 : 8 / NP;
  for (Index oy = 0; oy < plan.g.out_height; ++oy) {
    Index ox = 0;
    for (; ox + kPixels <= plan.g.out_width; ox += kPixels)
      forward_pixels<P, NP, kPixels>(plan, offsets, padded, w, b, y, o0, oy, ox);
    for (; ox < plan.g.out_width; ++ox) forward_pixels<P, NP, 1>(plan, offsets, padded, w, b, y, o0, oy, ox);
  }
}

// The same for single output channels (a Cout that is not a multiple of the packet width).
void forward_scalar(const ConvPlan& plan, const Index* offsets, const float* padded, const float* w, const float* b,
                    float* y, Index o) {
  const Index cout = plan.p.out_channels;
  for (Index oy = 0; oy < plan.g.out_height; ++oy) {
    for (Index ox = 0; ox < plan.g.out_width; ++ox) {
      float acc = b == nullptr ? 0.0f : b[o];
      const float* taps = padded + pixel_base(plan, oy, ox);
      for (Index t = 0; t < plan.patch; ++t) acc = ei::pmadd(taps[offsets[t]], w[t * cout + o], acc);
      y[(oy * plan.g.out_width + ox) * cout + o] = acc;
    }
  }
}

// One image's dw for taps [t0, t0 + G) and the output channels of NP packets P at o0: the image's partial
// sums stay in G x NP registers over its pixels (each tap's value broadcast once for all NP packets), then are
// added to dw. Each sum runs in pixel order whatever NP is, so NP changes the speed, not the bits.
template <typename P, int G, int NP>
void weights_taps(const ConvPlan& plan, const Index* offsets, const float* padded, const float* dy, float* dw, Index t0,
                  Index o0) {
  const Index cout = plan.p.out_channels;
  constexpr Index kL = lanes_of<P>();
  P acc[G][NP];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) acc[g][j] = ei::pset1<P>(0.0f);
  for (Index oy = 0; oy < plan.g.out_height; ++oy) {
    for (Index ox = 0; ox < plan.g.out_width; ++ox) {
      const float* dp = dy + (oy * plan.g.out_width + ox) * cout + o0;
      P d[NP];
#pragma GCC unroll 4
      for (int j = 0; j < NP; ++j) d[j] = ei::ploadu<P>(dp + j * kL);
      const float* taps = padded + pixel_base(plan, oy, ox);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) {
        const P xv = ei::pset1<P>(taps[offsets[t0 + g]]);
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) acc[g][j] = ei::pmadd(xv, d[j], acc[g][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) {
    float* out = dw + (t0 + g) * cout + o0;
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) ei::pstoreu(out + j * kL, ei::padd(ei::ploadu<P>(out + j * kL), acc[g][j]));
  }
}

// weights_taps<P, G, NP> for G = 1..kMaxGroup, indexed by G - 1: a group is as many taps as fit in registers
// (12 x 2 accumulators, 2 packets of dy and a broadcast: 27 of AVX-512's 32; 12 + 2 of AVX's 16 with NP 1).
constexpr int kMaxGroup = 12;
// Packets of output channels per pass of the weight gradient: 2 where there are 32 vector registers
// (AVX-512), else 1.
constexpr int kWeightsWide = kLanes >= 16 ? 2 : 1;
using WeightsFn = void (*)(const ConvPlan&, const Index*, const float*, const float*, float*, Index, Index);
template <typename P, int NP, std::size_t... I>
constexpr std::array<WeightsFn, sizeof...(I)> weights_table(std::index_sequence<I...>) {
  return {&weights_taps<P, static_cast<int>(I) + 1, NP>...};
}
template <typename P, int NP>
WeightsFn weights_fn(Index group) {
  static constexpr auto table = weights_table<P, NP>(std::make_index_sequence<kMaxGroup>{});
  return table[static_cast<std::size_t>(group - 1)];
}

// The output channels [o0, o0 + NP * lanes of P) of one image's dw, over every tap in groups.
template <typename P, int NP = 1>
void weights_packet(const ConvPlan& plan, const Index* offsets, const float* padded, const float* dy, float* dw,
                    Index o0) {
  for (Index t0 = 0; t0 < plan.patch; t0 += kMaxGroup) {
    const Index group = std::min<Index>(kMaxGroup, plan.patch - t0);
    weights_fn<P, NP>(group)(plan, offsets, padded, dy, dw, t0, o0);
  }
}

// Half and quarter packets for the channels after the full ones, each only where it is narrower than the
// packet before it; returns the first channel left for the scalar loop.
template <typename Fn>
Index narrower_packets(Index o0, Index cout, const Fn& run) {
  if constexpr (lanes_of<HalfPacket>() < kLanes) {
    for (; o0 + lanes_of<HalfPacket>() <= cout; o0 += lanes_of<HalfPacket>()) run(HalfPacket{}, o0);
    if constexpr (lanes_of<QuarterPacket>() < lanes_of<HalfPacket>())
      for (; o0 + lanes_of<QuarterPacket>() <= cout; o0 += lanes_of<QuarterPacket>()) run(QuarterPacket{}, o0);
  }
  return o0;
}

// Scalar channel: a Packet-wide load of one float would read past dy, so this column runs without packets.
void weights_scalar(const ConvPlan& plan, const Index* offsets, const float* padded, const float* dy, float* dw,
                    Index o) {
  const Index cout = plan.p.out_channels;
  for (Index t = 0; t < plan.patch; ++t) {
    float acc = 0.0f;
    for (Index oy = 0; oy < plan.g.out_height; ++oy)
      for (Index ox = 0; ox < plan.g.out_width; ++ox)
        acc =
            ei::pmadd(padded[pixel_base(plan, oy, ox) + offsets[t]], dy[(oy * plan.g.out_width + ox) * cout + o], acc);
    dw[t * cout + o] += acc;
  }
}

// db_sum (Cout) += dy summed over the image's pixels, in pixel order, in double.
void bias_sums(const ConvPlan& plan, const float* dy, double* db_sum) {
  const Index cout = plan.p.out_channels;
  for (Index px = 0; px < plan.out_pixels; ++px)
    for (Index o = 0; o < cout; ++o) db_sum[o] += static_cast<double>(dy[px * cout + o]);
}

}  // namespace

void direct_forward(const ConvPlan& plan, const float* x, const float* w, const float* b, float* y, float* padded,
                    float* rounded) {
  const Conv2dParams& p = plan.p;
  const Index cout = p.out_channels;
  Index offsets[kDirectMaxPatch];
  tap_offsets(plan, offsets);
  for (int m = 0; m < p.members; ++m) {
    const float* wm = w + m * plan.patch * cout;
    if (bf16_products(plan)) {
      bf16::round_into(wm, static_cast<std::size_t>(plan.patch * cout), rounded);
      wm = rounded;
    }
    const float* bm = b == nullptr ? nullptr : b + m * cout;
    for (int n = 0; n < p.batch; ++n) {
      const Index image = (p.shared_input ? 0 : Index{m} * p.batch) + n;
      pad_image(plan, x + image * plan.in_image, padded);
      float* yn = y + (Index{m} * p.batch + n) * plan.out_image;
      Index o0 = 0;
      for (; o0 + kWide * kLanes <= cout; o0 += kWide * kLanes)
        forward_packets<Packet, kWide>(plan, offsets, padded, wm, bm, yn, o0);
      for (; o0 + kLanes <= cout; o0 += kLanes) forward_packets<Packet, 1>(plan, offsets, padded, wm, bm, yn, o0);
      o0 = narrower_packets(o0, cout, [&](auto packet, Index o) {
        forward_packets<decltype(packet), 1>(plan, offsets, padded, wm, bm, yn, o);
      });
      for (; o0 < cout; ++o0) forward_scalar(plan, offsets, padded, wm, bm, yn, o0);
      if (p.relu) relu_in_place(yn, plan.out_image);
    }
  }
}

void direct_weights(const ConvPlan& plan, const float* x, const float* dy, float* dw, float* db, float* padded,
                    double* db_sum, float* rounded) {
  const Conv2dParams& p = plan.p;
  const Index cout = p.out_channels;
  Index offsets[kDirectMaxPatch];
  tap_offsets(plan, offsets);
  for (int m = 0; m < p.members; ++m) {
    float* dwm = dw + m * plan.patch * cout;
    std::fill_n(dwm, plan.patch * cout, 0.0f);
    std::fill_n(db_sum, cout, 0.0);
    for (int n = 0; n < p.batch; ++n) {
      const Index image = (p.shared_input ? 0 : Index{m} * p.batch) + n;
      pad_image(plan, x + image * plan.in_image, padded);
      const float* dyn = dy + (Index{m} * p.batch + n) * plan.out_image;
      bias_sums(plan, dyn, db_sum);
      if (bf16_products(plan)) {  // after the bias sums, which take dy as it is
        bf16::round_into(dyn, static_cast<std::size_t>(plan.out_image), rounded + plan.patch * cout);
        dyn = rounded + plan.patch * cout;
      }
      Index o0 = 0;
      if constexpr (kWeightsWide > 1)
        for (; o0 + kWeightsWide * kLanes <= cout; o0 += kWeightsWide * kLanes)
          weights_packet<Packet, kWeightsWide>(plan, offsets, padded, dyn, dwm, o0);
      for (; o0 + kLanes <= cout; o0 += kLanes) weights_packet<Packet>(plan, offsets, padded, dyn, dwm, o0);
      o0 = narrower_packets(o0, cout, [&](auto packet, Index o) {
        weights_packet<decltype(packet)>(plan, offsets, padded, dyn, dwm, o);
      });
      for (; o0 < cout; ++o0) weights_scalar(plan, offsets, padded, dyn, dwm, o0);
    }
    if (db != nullptr)
      for (Index o = 0; o < cout; ++o) db[m * cout + o] = static_cast<float>(db_sum[o]);
  }
}

}  // namespace PMAPCC_CPU_NS::detail
