// Named-axis collectives on Arrays: argument checks, output allocation, and dispatch to the device's
// communicator. Arrays are staged to where the communicator wants its buffers: CUDA arrays through the
// host for the host hub, host arrays (scalars) onto the device for NCCL and the device hub.
#include <pmap/collectives.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>

#include <pmap/detail/capture.h>
#include <pmap/detail/hash.h>
#include <pmap/detail/trace.h>

#include "cuda_seam.h"
#include "mesh_impl.h"

namespace pmap {
namespace {

struct Target {
  detail::MeshImpl* mesh;
  int device;
  Communicator* comm;
  Device memory;  // where the communicator's buffers must live: the host, or the calling device
};

Target target(const char* what, const AxisNames& axes) {
  auto& ctx = detail::current_context(what);
  const auto ep = ctx.mesh->endpoint(ctx.device, axes);
  if (detail::capturing() != nullptr) {
    // Recorded into the graph when the communicator can be (NCCL on the device's own memory) and the
    // capturer meets the peers at each launch (jit's CollectiveLog); refused otherwise.
    detail::CollectiveLog* log = detail::CollectiveLog::current();
    if (log == nullptr || !ep.comm->captures() || !ep.device_memory) {
      detail::check_not_capturing(std::string(what) + " over " + axes.str(),
                                  "meets the other devices on the host (a collective)");
    } else if (const Communicator* peers = log->with_peers();
               ep.comm->size() > 1 && peers != nullptr && peers != ep.comm) {
      detail::check_not_capturing(std::string(what) + " over " + axes.str(),
                                  "is a collective over a second axis with several devices (a graph records "
                                  "one such axis's collectives)");
    }
  }
  ++ctx.collectives;
  return Target{ctx.mesh, ctx.device, ep.comm,
                ep.device_memory ? ctx.mesh->devices()[static_cast<std::size_t>(ctx.device)] : Device{}};
}

// True when an array on `d` lives in the memory `want` names: any host memory, or the same GPU.
bool resides(const Device& d, const Device& want) {
  return want.is_cpu() ? d.is_cpu() : !d.is_cpu() && d.ordinal == want.ordinal;
}

// Runs op with `in` as the send buffer and `out` as the receive buffer. Arrays already where the
// communicator wants them go straight to it; others are staged through copies there.
void run(const Target& t, CollectiveOp op, const Array& in, Array& out) {
  if (resides(in.device(), t.memory) && resides(out.device(), t.memory)) {
    op.send = in.raw_data();
    op.recv = out.raw_data();
    return t.comm->run(op);
  }
  Array staged_in = in.to(t.memory);
  Array staged_out(out.shape(), out.dtype(), t.memory);
  op.send = staged_in.raw_data();
  op.recv = staged_out.raw_data();
  t.comm->run(op);
  out.copy_from(staged_out);
}

CollectiveOp make(CollectiveKind kind, const char* name, const Array& x, std::size_t count) {
  CollectiveOp op;
  op.kind = kind;
  op.name = name;
  op.dtype = x.dtype();
  op.count = count;
  return op;
}

void reduce_into(const char* name, const Array& x, Array& out, const AxisNames& axes, ReduceOp r) {
  Target t = target(name, axes);
  CollectiveOp op = make(CollectiveKind::all_reduce, name, x, static_cast<std::size_t>(x.size()));
  op.reduce = r;
  run(t, op, x, out);
}

// x / n, each element rounded once (n as x's dtype: a device count, or a sum of weights).
void divide_by(Array& x, double n) {
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::f32) {
      float* p = x.data<float>();
      const float d = static_cast<float>(n);
      for (std::int64_t i = 0; i < x.size(); ++i) p[i] /= d;
    } else {
      double* p = x.data<double>();
      for (std::int64_t i = 0; i < x.size(); ++i) p[i] /= n;
    }
    return;
  }
  detail::cuda_divide(x.device().ordinal, x.raw_data(), static_cast<std::size_t>(x.size()), x.dtype(), n);
}

// x * w, each element rounded once (w as x's dtype).
void multiply_by(Array& x, double w) {
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::f32) {
      float* p = x.data<float>();
      const float f = static_cast<float>(w);
      for (std::int64_t i = 0; i < x.size(); ++i) p[i] *= f;
    } else {
      double* p = x.data<double>();
      for (std::int64_t i = 0; i < x.size(); ++i) p[i] *= w;
    }
    return;
  }
  detail::cuda_multiply(x.device().ordinal, x.raw_data(), static_cast<std::size_t>(x.size()), x.dtype(), w);
}

// x for a message raised on the calling device, which pmap names first: "f32(2, 3)", and " on <device>"
// only for an array elsewhere than that device.
std::string describe(const Array& x) {
  const bool here = detail::in_pmap() && x.device() == current_device();
  return here ? x.signature() : x.str();
}

void check_floating(const char* name, const Array& x) {
  if (!is_floating(x.dtype()))
    throw ValueError(std::string(name) + " of " + describe(x) + ": needs a floating dtype (f32 or f64)");
}

std::atomic<detail::TracedCollectiveHandler> traced_handler{nullptr};

// A traced operand goes to the transformation tracing it (which calls back here on an untagged view).
bool traced(const Array& x) { return detail::trace_tag(x) != 0 && detail::traced_collective_handler() != nullptr; }

Array hand_over(detail::TracedCollective call, const Array& x) {
  return detail::traced_collective_handler()(call, x);
}

void refuse_traced_inplace(const char* name, const Array& x) {
  if (detail::trace_tag(x) != 0)
    throw ValueError(std::string(name) + "_inplace of " + x.str() + ", a value inside a function being "
                     "differentiated: use " + name + " there (it returns a new array the gradient follows)");
}

}  // namespace

namespace detail {
void set_traced_collective_handler(TracedCollectiveHandler handler) noexcept { traced_handler.store(handler); }
TracedCollectiveHandler traced_collective_handler() noexcept { return traced_handler.load(); }
}  // namespace detail

int axis_index(const AxisNames& axes) {
  auto& ctx = detail::current_context("axis_index");
  return ctx.mesh->axis_index(ctx.device, axes);
}

int axis_size(const AxisNames& axes) { return detail::current_context("axis_size").mesh->axis_size(axes); }

std::uint64_t collectives_entered() { return detail::current_context("collectives_entered").collectives; }

Device current_device() {
  auto& ctx = detail::current_context("current_device");
  return ctx.mesh->devices()[static_cast<std::size_t>(ctx.device)];
}

void* cuda_stream() {
  auto& ctx = detail::current_context("cuda_stream");
  const Device& d = ctx.mesh->devices()[static_cast<std::size_t>(ctx.device)];
  if (d.kind != DeviceKind::cuda) {
    throw ValueError("cuda_stream: the calling function runs on " + d.str() + ", which is not a CUDA device");
  }
  return detail::cuda_thread_stream();
}

Array psum(const Array& x, const AxisNames& axes) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::psum, axes, 0, false, {}}, x);
  Array out = Array::uninitialized(x.shape(), x.dtype(), x.device());  // the reduction writes it all
  reduce_into("psum", x, out, axes, ReduceOp::sum);
  return out;
}

Array pmax(const Array& x, const AxisNames& axes) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::pmax, axes, 0, false, {}}, x);
  Array out = Array::uninitialized(x.shape(), x.dtype(), x.device());  // the reduction writes it all
  reduce_into("pmax", x, out, axes, ReduceOp::max);
  return out;
}

Array pmin(const Array& x, const AxisNames& axes) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::pmin, axes, 0, false, {}}, x);
  Array out = Array::uninitialized(x.shape(), x.dtype(), x.device());  // the reduction writes it all
  reduce_into("pmin", x, out, axes, ReduceOp::min);
  return out;
}

Array pmean(const Array& x, const AxisNames& axes) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::pmean, axes, 0, false, {}}, x);
  check_floating("pmean", x);
  Array out = Array::uninitialized(x.shape(), x.dtype(), x.device());  // the reduction writes it all
  reduce_into("pmean", x, out, axes, ReduceOp::sum);
  divide_by(out, axis_size(axes));
  return out;
}

namespace detail {

double total_weight(double weight, const AxisNames& axes) {
  if (!std::isfinite(weight) || weight < 0) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", weight);
    throw ValueError(std::string("pmean: weight ") + text + ": a weight must be finite and non-negative");
  }
  const double total = psum(weight, axes);
  if (!(total > 0)) throw ValueError("pmean: every weight over " + axes.str() + " is 0; there is nothing to average");
  return total;
}

Array weighted_mean(const Array& x, const AxisNames& axes, double weight, double total) {
  if (traced(x))
    throw ValueError("pmean with a weight of " + x.signature() + " inside grad or vmap: not supported there; "
                     "inside grad, divide the loss's sum by psum(count) and psum the gradients instead");
  check_floating("pmean", x);
  Array out = x.copy();
  if (weight == 0) {
    out.fill_zero();  // adds nothing, even where x is NaN
  } else if (weight != 1) {
    multiply_by(out, weight);
  }
  reduce_into("pmean", out, out, axes, ReduceOp::sum);
  divide_by(out, total);
  return out;
}

}  // namespace detail

Array pmean(const Array& x, const AxisNames& axes, double weight) {
  if (traced(x)) return detail::weighted_mean(x, axes, weight, 1);  // raises, naming what to do
  return detail::weighted_mean(x, axes, weight, detail::total_weight(weight, axes));
}

void psum_inplace(Array& x, const AxisNames& axes) {
  refuse_traced_inplace("psum", x);
  reduce_into("psum", x, x, axes, ReduceOp::sum);
}
void pmax_inplace(Array& x, const AxisNames& axes) {
  refuse_traced_inplace("pmax", x);
  reduce_into("pmax", x, x, axes, ReduceOp::max);
}
void pmin_inplace(Array& x, const AxisNames& axes) {
  refuse_traced_inplace("pmin", x);
  reduce_into("pmin", x, x, axes, ReduceOp::min);
}

void pmean_inplace(Array& x, const AxisNames& axes) {
  refuse_traced_inplace("pmean", x);
  check_floating("pmean", x);
  reduce_into("pmean", x, x, axes, ReduceOp::sum);
  divide_by(x, axis_size(axes));
}

namespace detail {

void reduce_leaves_inplace(const std::vector<Array*>& leaves, const AxisNames& axes, bool mean) {
  const char* name = mean ? "pmean" : "psum";
  for (const Array* x : leaves) {
    refuse_traced_inplace(name, *x);
    if (mean) check_floating(name, *x);
  }
  if (leaves.empty()) return;
  auto one = [&](Array& x) { mean ? pmean_inplace(x, axes) : psum_inplace(x, axes); };
  // Packed only on a mesh of CPU devices, so every device decides alike (a mesh with GPUs goes leaf by leaf,
  // its CPU devices too). The groups depend on the tree alone: its CPU leaves by dtype, in tree order, whichever
  // CPU device holds them (Array::from_host puts a leaf on cpu:0 whichever device makes it), each pack at most
  // kMaxPack bytes (an MPI message's bound, and the copy's extra memory); a larger leaf goes alone.
  const detail::DeviceContext& ctx = detail::current_context(name);
  const auto& devices = ctx.mesh->devices();
  const bool cpu_mesh = std::all_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_cpu(); });
  constexpr std::size_t kMaxPack = std::size_t{64} << 20;
  std::vector<std::vector<Array*>> groups;
  std::vector<std::size_t> bytes;  // each open group's
  for (Array* x : leaves) {
    if (!cpu_mesh || !x->device().is_cpu() || x->nbytes() > kMaxPack) {
      one(*x);
      continue;
    }
    std::size_t g = 0;
    while (g < groups.size() && (groups[g][0]->dtype() != x->dtype() || bytes[g] + x->nbytes() > kMaxPack)) ++g;
    if (g == groups.size()) {
      groups.emplace_back();
      bytes.push_back(0);
    }
    groups[g].push_back(x);
    bytes[g] += x->nbytes();
  }
  const Device here = devices[static_cast<std::size_t>(ctx.device)];
  for (const std::vector<Array*>& g : groups) {
    if (g.size() == 1) {
      one(*g[0]);
      continue;
    }
    // The leaves' sizes are part of the collective's signature: devices whose trees split the same total
    // differently are a mismatch (raised on every device), as the leaf-by-leaf calls would be.
    std::int64_t total = 0;
    std::uint64_t layout = detail::fnv1a_word(detail::kFnvOffsetBasis, g.size());  // the leaf count and sizes
    for (const Array* x : g) {
      total += x->size();
      layout = detail::fnv1a_word(layout, static_cast<std::uint64_t>(x->size()));
    }
    Array packed = Array::uninitialized({total}, g[0]->dtype(), here);  // every leaf copied in
    char* at = static_cast<char*>(packed.raw_data());
    for (const Array* x : g) {
      if (x->nbytes() > 0) std::memcpy(at, x->raw_data(), x->nbytes());
      at += x->nbytes();
    }
    CollectiveOp op = make(CollectiveKind::all_reduce, name, packed, static_cast<std::size_t>(total));
    op.perm_id = layout;
    run(target(name, axes), op, packed, packed);
    if (mean) divide_by(packed, axis_size(axes));
    const char* from = static_cast<const char*>(packed.raw_data());
    for (Array* x : g) {
      if (x->nbytes() > 0) std::memcpy(x->raw_data(), from, x->nbytes());
      from += x->nbytes();
    }
  }
}

}  // namespace detail

Array all_gather(const Array& x, const AxisNames& axes, bool tiled) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::all_gather, axes, 0, tiled, {}}, x);
  Target t = target("all_gather", axes);
  const int n = t.comm->size();
  Shape shape = x.shape();
  if (tiled) {
    if (shape.empty()) throw ShapeError("all_gather(tiled=true) of " + describe(x) + ": a scalar has no leading axis");
    shape[0] *= n;
  } else {
    shape.insert(shape.begin(), n);
  }
  Array out = Array::uninitialized(shape, x.dtype(), x.device());  // every rank's block is written
  run(t,
      make(CollectiveKind::all_gather, tiled ? "all_gather(tiled)" : "all_gather", x,
           static_cast<std::size_t>(x.size())),
      x, out);
  return out;
}

Array all_gather(const Array& x, const AxisNames& axes, int axis, bool tiled) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::all_gather, axes, axis, tiled, {}}, x);
  const int positions = x.ndim() + (tiled ? 0 : 1);  // where the gathered axis may go
  const int a = axis < 0 ? axis + positions : axis;
  if (a < 0 || a >= positions)
    throw ShapeError("all_gather(axis=" + std::to_string(axis) + (tiled ? ", tiled" : "") + ") of " + describe(x) +
                     ": the axis must be in [" + std::to_string(-positions) + ", " + std::to_string(positions) + ")");
  if (a == 0) return all_gather(x, axes, tiled);
  const Array stacked = all_gather(x, axes, false);  // (n, outer, inner): outer = x.shape[:a], inner = x.shape[a:]
  const auto n = static_cast<std::size_t>(stacked.shape()[0]);
  Shape shape = x.shape();
  if (tiled) {
    shape[static_cast<std::size_t>(a)] *= static_cast<std::int64_t>(n);
  } else {
    shape.insert(shape.begin() + a, static_cast<std::int64_t>(n));
  }
  std::size_t outer = 1;
  for (int d = 0; d < a; ++d) outer *= static_cast<std::size_t>(x.shape()[static_cast<std::size_t>(d)]);
  const std::size_t block = outer == 0 ? 0 : x.nbytes() / outer;  // bytes of one device's inner block
  Array out = Array::uninitialized(shape, x.dtype(), x.device());  // (outer, n, inner), every block written
  if (block == 0) return out;  // nothing to move (an empty array's pointers may be null)
  if (x.device().is_cpu()) {
    const auto* src = static_cast<const char*>(stacked.raw_data());
    auto* dst = static_cast<char*>(out.raw_data());
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t o = 0; o < outer; ++o)
        std::memcpy(dst + (o * n + r) * block, src + (r * outer + o) * block, block);
  } else {
    detail::cuda_copy_blocks(x.device().ordinal, out.raw_data(), stacked.raw_data(), n, outer, block);
  }
  return out;
}

Array all_to_all(const Array& x, const AxisNames& axes, int split_axis, int concat_axis, bool tiled) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::all_to_all, axes, concat_axis, tiled, {}, split_axis}, x);
  const int n = axis_size(axes), me = axis_index(axes);
  const int rank = x.ndim();
  auto call = [&] {  // for messages
    return "all_to_all(split_axis=" + std::to_string(split_axis) + ", concat_axis=" + std::to_string(concat_axis) +
           (tiled ? ", tiled" : "") + ") over " + axes.str() + " of " + describe(x);
  };
  if (rank == 0) throw ShapeError(call() + ": a scalar has no axis to split");
  auto normalized = [&](int axis, const char* which) {
    const int a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank)
      throw ShapeError(call() + ": " + which + " must be in [" + std::to_string(-rank) + ", " + std::to_string(rank) +
                       ")");
    return a;
  };
  const int s = normalized(split_axis, "split_axis");
  const int c = normalized(concat_axis, "concat_axis");  // tiled: an axis of x; not tiled: of the result
  const std::int64_t split = x.shape()[static_cast<std::size_t>(s)];
  if (tiled && split % n != 0)
    throw ShapeError(call() + ": split_axis " + std::to_string(s) + " has size " + std::to_string(split) +
                     ", not divisible by the " + std::to_string(n) + " devices");
  if (!tiled && split != n)
    throw ShapeError(call() + ": split_axis " + std::to_string(s) + " has size " + std::to_string(split) +
                     ", which must equal the " + std::to_string(n) + " devices (or pass tiled=true)");
  // Every device's x, laid out so that the devices' chunks sit along the concat axis: tiled, concatenated
  // along c; not tiled, stacked as a new axis that lands at c once the split axis (size n) is gone.
  const int at = tiled || c <= s ? c : c + 1;
  const Array gathered = all_gather(x, axes, at, tiled);
  const int gs = !tiled && at <= s ? s + 1 : s;  // the split axis in `gathered`
  // `gathered` as (outer, n, block): the split axis cut into n chunks, this device's chunk kept. Tiled with
  // split and concat the same axis, that axis is (n devices, n chunks, the chunk): the devices join outer.
  const Shape& g = gathered.shape();
  std::size_t outer = 1;
  for (int d = 0; d < gs; ++d) outer *= static_cast<std::size_t>(g[static_cast<std::size_t>(d)]);
  if (tiled && s == c) outer *= static_cast<std::size_t>(n);
  Shape shape = x.shape();
  if (tiled) {
    shape[static_cast<std::size_t>(s)] /= n;
    shape[static_cast<std::size_t>(c)] *= n;
  } else {
    shape.erase(shape.begin() + s);
    shape.insert(shape.begin() + c, n);
  }
  Array out = Array::uninitialized(shape, x.dtype(), x.device());
  const std::size_t block = outer == 0 ? 0 : out.nbytes() / outer;  // bytes of one chunk's row
  if (block == 0) return out;  // nothing to move (an empty array's pointers may be null)
  const auto chunk = static_cast<std::size_t>(me);
  const auto chunks = static_cast<std::size_t>(n);
  if (x.device().is_cpu()) {
    const auto* src = static_cast<const char*>(gathered.raw_data());
    auto* dst = static_cast<char*>(out.raw_data());
    for (std::size_t o = 0; o < outer; ++o) std::memcpy(dst + o * block, src + (o * chunks + chunk) * block, block);
  } else {  // the same rows in one 2-D copy, on the stream all_gather's copies took there
    detail::cuda_copy_rows(x.device().ordinal, out.raw_data(),
                           static_cast<const char*>(gathered.raw_data()) + chunk * block, chunks * block, block, outer);
  }
  return out;
}

Array psum_scatter(const Array& x, const AxisNames& axes, bool tiled) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::psum_scatter, axes, 0, tiled, {}}, x);
  Target t = target("psum_scatter", axes);
  const int n = t.comm->size();
  if (x.ndim() == 0) throw ShapeError("psum_scatter of " + describe(x) + ": a scalar has no leading axis");
  Shape shape = x.shape();
  if (tiled) {
    if (shape[0] % n != 0)
      throw ShapeError("psum_scatter(tiled=true) over " + axes.str() + ": leading size " + std::to_string(shape[0]) +
                       " of " + describe(x) + " is not divisible by " + std::to_string(n));
    shape[0] /= n;
  } else {
    if (shape[0] != n)
      throw ShapeError("psum_scatter over " + axes.str() + ": leading size of " + describe(x) + " must equal the " +
                       std::to_string(n) + " devices (or pass tiled=true)");
    shape.erase(shape.begin());
  }
  Array out = Array::uninitialized(shape, x.dtype(), x.device());  // the reduction writes it all
  CollectiveOp op = make(CollectiveKind::reduce_scatter, "psum_scatter", x, static_cast<std::size_t>(out.size()));
  run(t, op, x, out);
  return out;
}

Array ppermute(const Array& x, const AxisNames& axes, const std::vector<std::pair<int, int>>& perm) {
  if (traced(x)) return hand_over({detail::TracedCollectiveKind::ppermute, axes, 0, false, perm}, x);
  Target t = target("ppermute", axes);
  const int n = t.comm->size();
  const int me = t.comm->rank();
  std::set<int> srcs, dsts;
  CollectiveOp op = make(CollectiveKind::permute, "ppermute", x, static_cast<std::size_t>(x.size()));
  std::uint64_t id = detail::kFnvOffsetBasis;
  for (const auto& [s, d] : perm) {
    if (s < 0 || s >= n || d < 0 || d >= n)
      throw ValueError("ppermute over " + axes.str() + ": pair (" + std::to_string(s) + ", " + std::to_string(d) +
                       ") is out of range for " + std::to_string(n) + " devices");
    if (!srcs.insert(s).second || !dsts.insert(d).second)
      throw ValueError("ppermute over " + axes.str() + ": source " + std::to_string(s) + " or destination " +
                       std::to_string(d) + " appears twice");
    if (s == me) op.send_to = d;
    if (d == me) op.recv_from = s;
    id = detail::fnv1a_word(id, static_cast<std::uint64_t>(s) * 4099 + static_cast<std::uint64_t>(d));
  }
  op.perm_id = id;
  Array out = Array::uninitialized(x.shape(), x.dtype(), x.device());  // received, or zeroed by the communicator
  run(t, op, x, out);
  return out;
}

void barrier(const AxisNames& axes) {
  Target t = target("barrier", axes);
  CollectiveOp op;
  op.name = "barrier";
  t.comm->run(op);
}

void Communicator::graph_meet(std::size_t, std::uint64_t) {
  throw ValueError("this communicator does not record collectives into graphs (captures() is false)");
}
void Communicator::graph_wait() {
  throw ValueError("this communicator does not record collectives into graphs (captures() is false)");
}

}  // namespace pmap
