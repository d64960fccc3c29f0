// The checks and state helpers every transformation of pmap::optim shares (optim/base.h).
#include <pmapcc/optim/base.h>

#include <cmath>
#include <string>
#include <string_view>

#include <pmapcc/kernels/eager/array_ops.h>

namespace pmap::optim::detail {

void check_same(const char* fn, const Leaves& a, const char* an, const Leaves& b, const char* bn) {
  if (a.size() != b.size()) {
    throw ShapeError(std::string(fn) + ": " + an + " has " + std::to_string(a.size()) + " arrays and " + bn + " " +
                     std::to_string(b.size()) + " (trees of different structure)");
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (const auto& [x, name] : {std::pair{a[i], an}, std::pair{b[i], bn}}) {
      if (!x->valid() || x->dtype() != DType::f32) {
        throw ValueError(std::string(fn) + ": leaf " + std::to_string(i) + " of " + name + " is " +
                         (x->valid() ? x->signature() : std::string("an empty Array handle")) + "; it must be f32");
      }
    }
    if (a[i]->shape() != b[i]->shape()) {
      throw ShapeError(std::string(fn) + ": leaf " + std::to_string(i) + " is " + a[i]->signature() + " in " + an +
                       " and " + b[i]->signature() + " in " + bn);
    }
  }
}

Device params_device(const char* fn, const Leaves& params) {
  if (params.empty()) throw ValueError(std::string(fn) + ": params has no Array leaves to optimize");
  check_same(fn, params, "params", params, "params");
  for (std::size_t i = 1; i < params.size(); ++i) {
    if (params[i]->device() != params[0]->device()) {
      throw ValueError(std::string(fn) + ": params leaf " + std::to_string(i) + " is on " +
                       params[i]->device().str() + " and leaf 0 on " + params[0]->device().str() +
                       "; the parameters must be on one device");
    }
  }
  return params[0]->device();
}

std::vector<Array> zeros_like(const Leaves& params) {
  std::vector<Array> out;
  for (const Array* p : params) out.push_back(ops::eager::zeros_like(*p));
  return out;
}

Array zero_count(const char* fn, const Leaves& params) {
  return Array(Shape{1}, DType::i64, params_device(fn, params));
}

void check_count(const char* fn, const Array& count, const Leaves& params) {
  const Device d = params_device(fn, params);
  if (!count.valid() || count.dtype() != DType::i64 || count.size() != 1 || count.device() != d) {
    throw ValueError(std::string(fn) + ": the state's count is " +
                     (count.valid() ? count.str() : std::string("an empty Array handle")) +
                     "; it must be (1) i64 on the parameters' device " + d.str() + " (a state from init)");
  }
}

void check_per_member(const char* fn, const Array& v, const Array& like) {
  if (v.size() != 1 && (like.ndim() == 0 || like.dim(0) != v.size())) {
    throw ShapeError(std::string(fn) + ": per-member values " + v.signature() + " against a leaf " +
                     like.signature() + "; they must be one value, or one per row of the leaf's leading axis");
  }
}

Array per_member(const char* fn, const Array& v, const Array& like) {
  check_per_member(fn, v, like);
  if (v.size() == 1) return vmap_detail::alias(v);
  Shape rows(static_cast<std::size_t>(like.ndim()), 1);
  rows[0] = v.size();
  return ops::broadcast_to(ops::reshape(v, rows), like.shape());
}

Array decayed(const char* fn, const Array& p, float decay, const std::shared_ptr<const Array>& decays,
              const Array& lr) {
  // p * wd: with per-member values (p * wd[m]) * 1 + 0, the bits of the one-value form p * wd + 0.
  Array d = decays ? ops::scale(ops::multiply(p, per_member(fn, *decays, p)), 1.0f) : ops::scale(p, decay);
  return ops::subtract(p, ops::multiply(d, per_member(fn, lr, p)));
}

void ambiguous_hyperparam(const char* chain, std::string_view name, int takers) {
  throw ValueError(std::string(chain) + ": " + std::to_string(takers) + " of its transformations take the "
                   "per-member hyper-parameter '" + std::string(name) + "'; give it to one of them only");
}

void require_finite_nonnegative(const char* who, const char* field, double v) {
  if (!(v >= 0) || !std::isfinite(v)) {
    throw ValueError(std::string(who) + ": " + field + " must be finite and >= 0, got " + std::to_string(v));
  }
}

void require_positive(const char* who, const char* field, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    throw ValueError(std::string(who) + ": " + field + " must be a positive number, got " + std::to_string(v));
  }
}

void require_unit_interval(const char* who, const char* field, double v) {
  if (!(v >= 0 && v < 1)) {
    throw ValueError(std::string(who) + ": " + field + " must be in [0, 1), got " + std::to_string(v));
  }
}

}  // namespace pmap::optim::detail
