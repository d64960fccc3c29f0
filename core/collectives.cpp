// The runtime's collectives as primitives: pmap::psum and the others hand a traced operand here
// (include/pmap/detail/trace.h), and grad transposes them as pmapcc/core/grad.h documents.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pmap/collectives.h>
#include <pmap/detail/trace.h>
#include <pmap/error.h>

#include <pmapcc/core/ops.h>
#include <pmapcc/core/primitive.h>

namespace pmap::core {
namespace {

using detail::TracedCollective;
using Kind = detail::TracedCollectiveKind;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::psum: return "psum";
    case Kind::pmean: return "pmean";
    case Kind::pmax: return "pmax";
    case Kind::pmin: return "pmin";
    case Kind::all_gather: return "all_gather";
    case Kind::psum_scatter: return "psum_scatter";
    case Kind::ppermute: return "ppermute";
    case Kind::all_to_all: return "all_to_all";
  }
  return "collective";
}

// This device's block of a cotangent of all_gather(x, axes, axis, tiled)'s result.
Array gathered_block(const Array& ct, const Array& x, const AxisNames& axes, int axis, bool tiled) {
  const auto d = static_cast<std::size_t>(axis);
  const std::int64_t i = axis_index(axes), n = tiled ? x.dim(axis) : 1;
  std::vector<std::int64_t> start(ct.shape().size(), 0), stop(ct.shape().begin(), ct.shape().end());
  start[d] = i * n;
  stop[d] = (i + 1) * n;
  Array g = ops::eager::slice(ct, start, stop);
  if (!tiled) g = ops::eager::reshape(g, x.shape());
  return g;
}

class Collective final : public Primitive {
 public:
  explicit Collective(TracedCollective call) : call_(std::move(call)) {}
  std::string name() const override { return kind_name(call_.kind); }
  Attributes attributes() const override {
    std::vector<std::int64_t> perm;
    for (const auto& [from, to] : call_.perm) perm.insert(perm.end(), {from, to});
    return {{"axes", call_.axes.str()},
            {"axis", std::int64_t{call_.axis}},
            {"tiled", std::int64_t{call_.tiled}},
            {"perm", perm},
            {"split_axis", std::int64_t{call_.split_axis}}};
  }

  std::vector<Array> eval(Arrays in) const override {
    const Array& x = *in[0];
    std::vector<Array> out;
    switch (call_.kind) {
      case Kind::psum: out.push_back(psum(x, call_.axes)); break;
      case Kind::pmean: out.push_back(pmean(x, call_.axes)); break;
      case Kind::pmax: out.push_back(pmax(x, call_.axes)); break;
      case Kind::pmin: out.push_back(pmin(x, call_.axes)); break;
      case Kind::all_gather: out.push_back(all_gather(x, call_.axes, call_.axis, call_.tiled)); break;
      case Kind::psum_scatter: out.push_back(psum_scatter(x, call_.axes, call_.tiled)); break;
      case Kind::ppermute: out.push_back(ppermute(x, call_.axes, call_.perm)); break;
      case Kind::all_to_all:
        out.push_back(all_to_all(x, call_.axes, call_.split_axis, call_.axis, call_.tiled));
        break;
    }
    return out;
  }

  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& wanted) const override {
    std::vector<Array> g(1);
    if (!wanted[0]) return g;
    const Array& ct = *cts[0];
    switch (call_.kind) {
      case Kind::psum: g[0] = ops::eager::copy(ct); break;  // the result is replicated: its cotangent passes through
      case Kind::pmean: g[0] = ops::scale(ct, 1.0f / static_cast<float>(axis_size(call_.axes))); break;
      case Kind::all_gather: g[0] = psum_scatter(ct, call_.axes, call_.tiled); break;
      case Kind::psum_scatter: g[0] = all_gather(ct, call_.axes, call_.tiled); break;
      case Kind::ppermute: {
        std::vector<std::pair<int, int>> inverse;
        for (const auto& [src, dst] : call_.perm) inverse.emplace_back(dst, src);
        g[0] = ppermute(ct, call_.axes, inverse);
        break;
      }
      // The chunk device j sent to device i comes back from i to j: the exchange with the axes swapped (a
      // result's concat_axis is where x's split axis was, counted in the result's axes).
      case Kind::all_to_all: g[0] = all_to_all(ct, call_.axes, call_.axis, call_.split_axis, call_.tiled); break;
      case Kind::pmax:
      case Kind::pmin:
        throw NotAvailable(std::string("grad through ") + kind_name(call_.kind) + " of " + in[0]->signature() +
                           " over " + call_.axes.str() + " is not defined (as in JAX); apply stop_gradient");
    }
    return g;
  }
  AxisNames collective_axes() const override { return call_.axes; }
  bool result_invariant() const override { return elementwise() || call_.kind == Kind::all_gather; }
  std::vector<Array> tracked_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted) const override {
    if (call_.kind != Kind::all_gather) return vjp(in, out, cts, wanted);
    std::vector<Array> g(1);
    if (wanted[0]) g[0] = gathered_block(*cts[0], *in[0], call_.axes, call_.axis, call_.tiled);
    return g;
  }
  // psum, pmean, pmax and pmin combine element by element: each member with the same member of the other
  // devices, all of them in one collective. The others member by member (the same order on every device).
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    return elementwise() ? eval(in) : Primitive::batch(in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    return elementwise() ? vjp(in, out, cts, wanted) : Primitive::batch_vjp(in, out, cts, wanted, batched, members);
  }
  std::vector<Array> batch_tracked_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                                       const std::vector<bool>& batched, std::int64_t members) const override {
    if (call_.kind == Kind::all_gather)  // its tracked VJP takes this device's block: not batched yet
      throw NotAvailable("grad of a function that calls shard_map: all_gather under vmap in its body is not "
                         "supported yet (all_gather_invariant is)");
    return batch_vjp(in, out, cts, wanted, batched, members);  // the others' tracked VJP is their VJP
  }

 private:
  bool elementwise() const {
    return call_.kind == Kind::psum || call_.kind == Kind::pmean || call_.kind == Kind::pmax || call_.kind == Kind::pmin;
  }
  TracedCollective call_;
};

// pvary: x itself; its cotangent is psum'd over the axes (each device used x for its own part of the result).
class Pvary final : public Primitive {
 public:
  explicit Pvary(AxisNames axes) : axes_(std::move(axes)) {}
  std::string name() const override { return "pvary"; }
  Attributes attributes() const override { return {{"axes", axes_.str()}}; }
  std::vector<Array> eval(Arrays in) const override {
    std::vector<Array> out;
    out.push_back(ops::eager::copy(*in[0]));
    return out;
  }
  std::vector<Array> vjp(Arrays, Arrays, Arrays cts, const std::vector<bool>& wanted) const override {
    std::vector<Array> g(1);
    if (wanted[0]) g[0] = psum(*cts[0], axes_);
    return g;
  }
  AxisNames collective_axes() const override { return axes_; }
  std::vector<Array> tracked_vjp(Arrays, Arrays, Arrays cts, const std::vector<bool>& wanted) const override {
    std::vector<Array> g(1);  // (the backward pass sums it over the axes x does not vary along)
    if (wanted[0]) g[0] = ops::eager::copy(*cts[0]);
    return g;
  }
  std::vector<Array> batch(Arrays in, const std::vector<bool>&, std::int64_t) const override { return eval(in); }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>&, std::int64_t) const override {
    return vjp(in, out, cts, wanted);
  }
  std::vector<Array> batch_tracked_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                                       const std::vector<bool>&, std::int64_t) const override {
    return tracked_vjp(in, out, cts, wanted);  // element-wise: the members as they are
  }

 private:
  AxisNames axes_;
};

// all_gather_invariant: the gathered whole, which every device uses alike; x's cotangent is this device's block of
// the whole's.
class AllGatherInvariant final : public Primitive {
 public:
  AllGatherInvariant(AxisNames axes, int axis, bool tiled) : axes_(std::move(axes)), axis_(axis), tiled_(tiled) {}
  std::string name() const override { return "all_gather_invariant"; }
  Attributes attributes() const override {
    return {{"axes", axes_.str()}, {"axis", std::int64_t{axis_}}, {"tiled", std::int64_t{tiled_}}};
  }
  std::vector<Array> eval(Arrays in) const override {
    std::vector<Array> out;
    out.push_back(all_gather(*in[0], axes_, axis_, tiled_));
    return out;
  }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& wanted) const override {
    std::vector<Array> g(1);
    if (wanted[0]) g[0] = gathered_block(*cts[0], *in[0], axes_, axis_, tiled_);
    return g;
  }
  AxisNames collective_axes() const override { return axes_; }
  bool result_invariant() const override { return true; }

 private:
  AxisNames axes_;
  int axis_;
  bool tiled_;
};

Array traced_collective(const TracedCollective& call, const Array& x) {
  if (call.kind == Kind::all_gather && call.axis != 0) {
    throw NotAvailable("grad through all_gather(axis=" + std::to_string(call.axis) + ") over " + call.axes.str() +
                       " of " + x.signature() + " is not supported yet: gather along axis 0 and reshape");
  }
  return apply1(std::make_shared<Collective>(call), {&x});
}

}  // namespace

// Called by every Trace (so that this file is linked whenever grad is used).
void register_traced_collectives() noexcept { detail::set_traced_collective_handler(&traced_collective); }

}  // namespace pmap::core

namespace pmap {

Array pvary(const Array& x, const AxisNames& axes) {
  return core::apply1(std::make_shared<core::Pvary>(axes), {&x});
}

Array all_gather_invariant(const Array& x, const AxisNames& axes, int axis, bool tiled) {
  const int rank = static_cast<int>(x.ndim());
  if (axis < 0 || axis > (tiled ? rank - 1 : rank))
    throw ValueError("all_gather_invariant: axis " + std::to_string(axis) + " is outside " + x.signature() +
                     (tiled ? " (tiled: an existing axis)" : " (stacked: 0.." + std::to_string(rank) + ")"));
  return core::apply1(std::make_shared<core::AllGatherInvariant>(axes, axis, tiled), {&x});
}

}  // namespace pmap
