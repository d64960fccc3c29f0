// TensorParallel: the layers' splits from their parameters' specs, and the collectives between them.
#include <pmapcc/nn/parallel.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pmap/collectives.h>
#include <pmap/error.h>
#include <pmapcc/core/vmap.h>

namespace pmap::nn {
namespace {

std::string axes_text(const AxisNames& axes) { return P::from_dims({axes}).str(); }

// This device's block of y's last axis, split over `axes`.
Array own_block(const Array& y, const AxisNames& axes) {
  const std::int64_t n = axis_size(axes), i = axis_index(axes), last = y.ndim() - 1;
  const std::int64_t width = y.dim(static_cast<int>(last));
  if (width % n != 0)
    throw ValueError("TensorParallel: " + std::to_string(width) + " features do not split over the " +
                     std::to_string(n) + " devices of " + axes_text(axes));
  std::vector<std::int64_t> start(y.shape().size(), 0), stop(y.shape().begin(), y.shape().end());
  start[static_cast<std::size_t>(last)] = i * (width / n);
  stop[static_cast<std::size_t>(last)] = (i + 1) * (width / n);
  return ops::slice(y, start, stop);
}

// Over axes of one device a split changes nothing: the collectives are skipped (the layers' checks are not).
bool one_device(const AxisNames& axes) { return axis_size(axes) == 1; }

}  // namespace

Features features(const Array& x) { return {vmap_detail::alias(x)}; }

P TensorParallel::param_spec(const std::string& name) const {
  if (!active()) return P();
  const auto it = sharding_->params.by_path().find(name);
  return it == sharding_->params.by_path().end() ? P() : it->second;
}

void TensorParallel::require_whole(const std::string& name, const std::string& what) const {
  const P spec = param_spec(name);
  if (!spec.replicated())
    throw ValueError("layout of " + name + ": " + spec.str() + ": " + what + "'s weights cannot be split: it must be " +
                     "whole, P()");
}

Array TensorParallel::whole(const Features& x, const std::string& what) const {
  if (x.split.empty()) return vmap_detail::alias(x.value);
  if (!x.kept_by.empty())
    throw ValueError("layout of " + x.kept_by + " keeps its features split over " + axes_text(x.split) + ", but " +
                     what + " needs them whole");
  if (one_device(x.split)) return vmap_detail::alias(x.value);
  return all_gather_invariant(x.value, x.split, static_cast<int>(x.value.ndim()) - 1, /*tiled=*/true);
}

Array TensorParallel::whole(Features&& x, const std::string& what) const {
  if (x.split.empty() || (x.kept_by.empty() && one_device(x.split))) return std::move(x.value);
  return whole(static_cast<const Features&>(x), what);
}

Features TensorParallel::on_whole(const Features& x, const std::function<Array(const Array&)>& f) const {
  if (x.split.empty() || one_device(x.split)) return {f(x.value), x.split, x.kept_by};
  const Array y = f(all_gather_invariant(x.value, x.split, static_cast<int>(x.value.ndim()) - 1, /*tiled=*/true));
  return {own_block(pvary(y, x.split), x.split), x.split, x.kept_by};
}

template <class Run>
Features TensorParallel::layer(const std::string& name, const Array& kernel, const Array* bias, const Features& x,
                               bool relu,
                               const Run& run) const {
  const P ks = param_spec(name + "/kernel");
  const std::size_t rank = kernel.shape().size(), in_dim = rank - 2, out_dim = rank - 1;
  const std::string about = "layout of " + name + "/kernel (a block " + kernel.signature() + "): " + ks.str() + ": ";
  if (ks.size() > rank)
    throw ValueError(about + "has " + std::to_string(ks.size()) + " entries for a kernel of " + std::to_string(rank) +
                     " dimensions");
  for (std::size_t d = 0; d < in_dim; ++d)
    if (!ks.axes_of(d).empty())
      throw ValueError(about + "only the input (" + std::to_string(in_dim) + ") and output (" +
                       std::to_string(out_dim) + ") dimensions of a kernel can be split, not dimension " +
                       std::to_string(d));
  const AxisNames in_axes = ks.axes_of(in_dim), out_axes = ks.axes_of(out_dim);
  if (!in_axes.empty() && !out_axes.empty())
    throw ValueError(about + "splits both its input and its output features; one of them at most");
  if (bias != nullptr) {
    const P bs = param_spec(name + "/bias");
    const bool fits = out_axes.empty() ? bs.replicated() : bs == P::from_dims({out_axes});
    if (!fits)
      throw ValueError("layout of " + name + "/bias: " + bs.str() + ": a bias follows its kernel's output features: " +
                       "it must be " + (out_axes.empty() ? std::string("whole, P()") : P::from_dims({out_axes}).str()) +
                       " as " + name + "/kernel is " + ks.str());
  }
  Features out;
  if (in_axes.empty()) {  // whole or column-parallel: the whole input
    const Array in = whole(x, name + " (its kernel " + ks.str() + " takes whole features)");
    if (out_axes.empty()) {
      out.value = run(in, /*partial=*/false);
    } else {
      out.value = one_device(out_axes) ? run(in, false) : run(pvary(in, out_axes), false);
      out.split = out_axes;
    }
  } else {  // row-parallel: this device's block of the input features, the partial products summed
    if (x.split.empty())
      throw ValueError(about + "splits its input features over " + axes_text(in_axes) +
                       ", but its input arrives whole: a row-parallel layer must follow a column-parallel one");
    if (x.split != in_axes)
      throw ValueError(about + "its input arrives split over " + axes_text(x.split) + ", so dimension " +
                       std::to_string(in_dim) + " must be split over " + axes_text(x.split) + " too (row-parallel)");
    out.value = run(x.value, /*partial=*/true);
    if (!one_device(in_axes)) out.value = psum(out.value, in_axes);
    if (bias != nullptr) out.value = ops::add(out.value, *bias);
    if (relu) out.value = ops::relu(out.value);
  }
  if (!active()) return out;
  const auto given = sharding_->outputs.by_path().find(name + "/output");
  if (given == sharding_->outputs.by_path().end()) return out;
  const P& os = given->second;
  const std::size_t out_rank = out.value.shape().size();
  const std::string about_out = "layout of " + name + "/output (" + std::to_string(out_rank) + " dimensions): " +
                                os.str() + ": ";
  if (os.size() > out_rank)
    throw ValueError(about_out + "has " + std::to_string(os.size()) + " entries for an output of " +
                     std::to_string(out_rank) + " dimensions");
  for (std::size_t d = 1; d < os.size() && d + 1 < out_rank; ++d)  // every entry between the examples' and features'
    if (!os.axes_of(d).empty())
      throw ValueError(about_out + "only the first (the examples) and the last (the features) dimension of an " +
                       "output can be split");
  const AxisNames features = os.size() == out_rank ? os.axes_of(out_rank - 1) : AxisNames();
  if (features.empty()) return {whole(std::move(out), name + "/output's layout"), {}, {}};
  if (features != out.split)
    throw ValueError(about_out + "splits the features over " + axes_text(features) + ", but " + name + "/kernel is " +
                     ks.str() + ": its outputs come out " +
                     (out.split.empty() ? std::string("whole") : "split over " + axes_text(out.split)));
  out.kept_by = name + "/output";
  return out;
}

Features TensorParallel::dense(const Dense& m, const DenseParams& p, const std::string& name, const Features& x,
                               bool relu) const {
  return layer(name, p.kernel, &p.bias, x, relu, [&](const Array& in, bool partial) {
    return partial ? ops::matmul(in, p.kernel) : m(p, in, relu);
  });
}

Features TensorParallel::conv(const Conv& m, const ConvParams& p, const std::string& name, const Features& x,
                              bool relu) const {
  return layer(name, p.kernel, &p.bias, x, relu, [&](const Array& in, bool partial) {
    const ops::Conv2dOptions no_bias{.stride_h = m.stride_h, .stride_w = m.stride_w, .same = m.same};
    return partial ? ops::conv2d(in, p.kernel, Array(), no_bias) : m(p, in, relu);
  });
}

Features TensorParallel::conv(const Conv& m, const ConvKernel& p, const std::string& name, const Features& x,
                              bool relu) const {
  return layer(name, p.kernel, nullptr, x, relu, [&](const Array& in, bool partial) {
    return m(p, in, relu && !partial);
  });
}

}  // namespace pmap::nn
