// What vmap and map (pmapcc/core/vmap.h) do outside their templates.
#include <pmapcc/core/vmap.h>

#include <algorithm>

#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>

namespace pmap::vmap_detail {

std::vector<bool> mapped_arguments(const std::string& function, const InAxes& in_axes, std::size_t arity) {
  if (in_axes.empty()) return std::vector<bool>(arity, true);
  if (in_axes.size() != arity) {
    throw ValueError("vmap of '" + function + "': in_axes has " + std::to_string(in_axes.size()) +
                     " entries for a call with " + std::to_string(arity) + " arguments");
  }
  std::vector<bool> mapped;
  for (std::size_t i = 0; i < arity; ++i) {
    if (in_axes[i].has_value() && *in_axes[i] != 0) {
      throw NotAvailable("vmap of '" + function + "': in_axes " + std::to_string(*in_axes[i]) + " for argument " +
                         std::to_string(i) + ": only 0 (mapped over the leading axis) and none are supported; "
                         "move the axis first with ops::transpose");
    }
    mapped.push_back(in_axes[i].has_value());
  }
  return mapped;
}

Array alias(const Array& x) {
  if (!x.valid()) return Array();
  if ((detail::trace_tag(x) & detail::kBatchedTag) != 0) return x.copy();  // a member's view: its alias
  Array a = core::plain_view(x);
  detail::set_trace_tag(a, detail::trace_tag(x));
  return a;
}

Array members_part(const std::string& function, const Array& leaf, std::int64_t first, std::int64_t count) {
  const std::uint64_t tag = detail::trace_tag(leaf);
  if ((tag & detail::kBatchedTag) != 0) {
    throw NotAvailable("map of '" + function + "' inside vmap: map's arguments are one member's values there; "
                       "map over the stacked arrays outside the vmap instead");
  }
  if (tag != 0) {  // traced: a slice, so that the gradient flows back into the leaf
    std::vector<std::int64_t> start(leaf.shape().size(), 0), stop(leaf.shape().begin(), leaf.shape().end());
    start[0] = first;
    stop[0] = first + count;
    return ops::slice(leaf, start, stop);
  }
  const std::size_t row = leaf.dim(0) == 0 ? 0 : leaf.nbytes() / static_cast<std::size_t>(leaf.dim(0));
  Shape shape = leaf.shape();
  shape[0] = count;
  char* base = static_cast<char*>(const_cast<void*>(leaf.raw_data()));
  return Array::borrow(base + static_cast<std::size_t>(first) * row, std::move(shape), leaf.dtype(), leaf.device());
}

Array joined_members(const std::vector<const Array*>& parts) {
  const Array& first = *parts.at(0);
  if (!first.valid()) return Array();  // vmap's result for an empty leaf
  bool traced = false;
  for (const Array* p : parts) traced = traced || detail::trace_tag(*p) != 0;
  if (traced) return ops::concatenate(parts, 0);  // grad traces them: the differentiable join
  // Any dtype, as vmap stacks it: the backend's copies, queued with its other work (pmap::concatenate waits
  // for a GPU, and a graph capture refuses that).
  Shape shape = first.shape();
  shape[0] = 0;
  for (const Array* p : parts) {
    if (!p->valid() || p->dtype() != first.dtype() || !(p->device() == first.device()) || p->ndim() != first.ndim() ||
        !std::equal(shape.begin() + 1, shape.end(), p->shape().begin() + 1)) {
      throw ShapeError("map: a batch's result " + (p->valid() ? p->str() : std::string("(empty)")) +
                       " does not join " + first.str() + " along axis 0");
    }
    shape[0] += p->dim(0);
  }
  Array out = Array::uninitialized(shape, first.dtype(), first.device());  // the parts cover it
  if (out.nbytes() == 0) return out;
  const kernels::Backend& be = ops::detail::backend_of("map", first.device());
  char* dst = static_cast<char*>(out.raw_data());
  for (const Array* p : parts) {
    be.copy(dst, p->raw_data(), p->nbytes());
    dst += p->nbytes();
  }
  return out;
}

Array stacked_leaf(core::BatchLevel& level, const Array& leaf) {
  if (!leaf.valid()) return Array();
  if (level.holds(leaf, "vmap of '" + level.function() + "'", 0)) return level.take(leaf);
  // Computed without the mapped arguments: the same for every member.
  if (detail::trace_tag(leaf) == 0) return core::broadcast_members(leaf, level.members());
  Shape one = leaf.shape(), all = leaf.shape();
  one.insert(one.begin(), 1);
  all.insert(all.begin(), level.members());
  return ops::broadcast_to(ops::reshape(leaf, one), all);
}

}  // namespace pmap::vmap_detail
