// vmap's machinery: the thread's BatchLevel, the default batching rules (member by member), the primitive a
// batched call records for grad, and the helpers batching rules are written with.
#include <pmapcc/core/batching.h>

#include <atomic>
#include <memory>
#include <utility>

#include <pmap/detail/trace.h>
#include <pmap/error.h>

#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>

namespace pmap::core {

void register_traced_collectives() noexcept;  // core/collectives.cpp

namespace {

thread_local BatchLevel* tls_level = nullptr;
std::atomic<std::uint64_t> next_serial{1};

constexpr std::uint64_t tag_of(std::uint64_t serial, std::size_t slot) {
  return detail::kBatchedTag | serial << 32 | (static_cast<std::uint64_t>(slot) + 1);
}

Shape member_shape(const Array& stacked) { return Shape(stacked.shape().begin() + 1, stacked.shape().end()); }

}  // namespace

// ---- BatchLevel -------------------------------------------------------------------------------------------

BatchLevel::BatchLevel(std::string function, std::int64_t members)
    : function_(std::move(function)), members_(members), serial_(next_serial++) {
  if (tls_level != nullptr) {
    throw NotAvailable("vmap of '" + function_ + "' inside vmap of '" + tls_level->function_ +
                       "': nested vmap is not supported yet (stack the members along one axis)");
  }
  if (members_ < 1) throw ValueError("vmap of '" + function_ + "': the mapped axis has no members");
  if (serial_ >= (std::uint64_t{1} << 31)) throw Error("vmap: call counter exhausted");
  register_traced_collectives();
  tls_level = this;
}

BatchLevel::~BatchLevel() {
  if (tls_level == this) tls_level = nullptr;
}

BatchLevel* BatchLevel::active() { return tls_level; }

Array BatchLevel::wrap(Array stacked) {
  if (stacked.ndim() < 1 || stacked.dim(0) != members_) {
    throw Error("vmap of '" + function_ + "': a stacked value " + stacked.signature() + " does not have " +
                std::to_string(members_) + " members along axis 0");
  }
  // The view points at member 0's part, so that its pointer is valid; reading through it raises.
  Array view = Array::borrow(stacked.size() == 0 ? nullptr : const_cast<void*>(plain_view(stacked).raw_data()),
                             member_shape(stacked), stacked.dtype(), stacked.device());
  values_.push_back(std::move(stacked));
  detail::set_trace_tag(view, tag_of(serial_, values_.size() - 1));
  return view;
}

std::size_t BatchLevel::slot_of(const Array& x) const {
  return static_cast<std::size_t>(detail::trace_tag(x) & 0xffffffffu) - 1;
}

bool BatchLevel::holds(const Array& x, const std::string& op, std::size_t operand) const {
  const std::uint64_t tag = detail::trace_tag(x);
  if ((tag & detail::kBatchedTag) == 0) return false;
  if ((tag & ~detail::kBatchedTag) >> 32 == serial_ && slot_of(x) < values_.size()) return true;
  throw ValueError(op + ": operand " + std::to_string(operand) + " (" + x.signature() +
                   ") is a value computed inside vmap after that vmap returned; keep only what the function returns");
}

const Array& BatchLevel::stacked(const Array& view) const { return values_.at(slot_of(view)); }

Array BatchLevel::take(const Array& view) {
  // A value of this call's own that no transformation follows is moved out, and a borrowed view of it stays
  // behind, so that a second take (the value returned twice) copies it. An argument's storage (borrowed) or a
  // value grad traces is copied.
  Array& held = values_.at(slot_of(view));
  if (held.owns_data() && detail::trace_tag(held) == 0) {
    Array out = std::move(held);
    held = plain_view(out);
    return out;
  }
  return ops::eager::copy(held);
}

// ---- helpers ------------------------------------------------------------------------------------------------

Array plain_view(const Array& x) { return view_as(x, x.shape()); }

Array view_as(const Array& x, Shape shape) {
  return Array::borrow(const_cast<void*>(x.raw_data()), std::move(shape), x.dtype(), x.device());
}

Array member_view(const Array& stacked, std::int64_t m) {
  const std::size_t bytes = stacked.nbytes() / static_cast<std::size_t>(stacked.dim(0));
  char* base = static_cast<char*>(const_cast<void*>(stacked.raw_data()));
  return Array::borrow(bytes == 0 ? base : base + static_cast<std::size_t>(m) * bytes, member_shape(stacked),
                       stacked.dtype(), stacked.device());
}

// One member's result as a stack of one: moved, with a leading axis of 1, when it is an untraced array that owns
// its storage (no copy); a view (of an input, say) is copied, as stack copies.
Array stack(std::vector<Array>&& parts) {
  if (parts.size() == 1 && parts[0].owns_data() && pmap::detail::trace_tag(parts[0]) == 0) {
    Shape shape = parts[0].shape();
    shape.insert(shape.begin(), 1);
    return std::move(parts[0]).reshape(std::move(shape));
  }
  return stack(static_cast<const std::vector<Array>&>(parts));
}

Array stack(const std::vector<Array>& parts) {
  const Array& first = parts.at(0);
  bool one_device = true;
  for (const Array& p : parts) one_device = one_device && p.device() == first.device();
  std::vector<const Array*> ptrs;
  for (const Array& p : parts) ptrs.push_back(&p);
  if (!one_device) return pmap::concatenate(ptrs, first.device(), /*stacked=*/true);
  // The backend's copies, queued with its other work (pmap::concatenate's wait for a GPU, and a graph
  // capture refuses them).
  for (const Array& p : parts) {
    if (p.dtype() != first.dtype() || p.shape() != first.shape())
      throw ShapeError("stack: " + p.str() + " does not fit " + first.str());
  }
  Shape shape = first.shape();
  shape.insert(shape.begin(), static_cast<std::int64_t>(parts.size()));
  Array out = Array::uninitialized(shape, first.dtype(), first.device());  // the parts cover it
  if (out.nbytes() == 0) return out;
  const kernels::Backend& be = ops::detail::backend_of("stack", first.device());
  char* dst = static_cast<char*>(out.raw_data());
  for (const Array& p : parts) {
    be.copy(dst, p.raw_data(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

Array broadcast_members(const Array& x, std::int64_t members) {
  Shape one = x.shape(), all = x.shape();
  one.insert(one.begin(), 1);
  all.insert(all.begin(), members);
  return ops::eager::broadcast_to(view_as(x, one), all);
}

Array merge_members(const Array& stacked) {
  Shape s(stacked.shape().begin() + 1, stacked.shape().end());
  s.at(0) *= stacked.dim(0);
  return view_as(stacked, s);
}

Array split_members(Array merged, std::int64_t members) {
  Shape s = merged.shape();
  s.at(0) /= members;
  s.insert(s.begin(), members);
  return std::move(merged).reshape(std::move(s));
}

std::vector<Array> batch_images(const Primitive& p, Arrays in, const std::vector<bool>& batched,
                                std::int64_t members) {
  if (in[0]->ndim() != 5) return p.Primitive::batch(in, batched, members);
  Array x = merge_members(*in[0]);
  const Array* ptrs[] = {&x};
  std::vector<Array> y = p.eval(ptrs);
  for (Array& o : y) o = split_members(std::move(o), members);
  return y;
}

std::vector<Array> batch_images_vjp(const Primitive& p, Arrays in, Arrays out, Arrays cts,
                                    const std::vector<bool>& wanted, const std::vector<bool>& batched,
                                    std::int64_t members) {
  if (in[0]->ndim() != 5) return p.Primitive::batch_vjp(in, out, cts, wanted, batched, members);
  Array x = merge_members(*in[0]), y = merge_members(*out[0]), ct = merge_members(*cts[0]);
  const Array* i[] = {&x};
  const Array* o[] = {&y};
  const Array* c[] = {&ct};
  std::vector<Array> g = p.vjp(i, o, c, wanted);
  if (!g.empty() && g[0].valid()) g[0] = split_members(std::move(g[0]), members);
  return g;
}

// ---- the default rules: member by member ---------------------------------------------------------------------

std::vector<Array> Primitive::batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const {
  std::vector<std::vector<Array>> outs;  // [output][member]
  for (std::int64_t m = 0; m < members; ++m) {
    std::vector<Array> views;
    for (std::size_t i = 0; i < in.size(); ++i) views.push_back(batched[i] ? member_view(*in[i], m) : plain_view(*in[i]));
    std::vector<const Array*> ptrs;
    for (const Array& v : views) ptrs.push_back(&v);
    std::vector<Array> o = eval(ptrs);
    if (outs.empty()) outs.resize(o.size());
    for (std::size_t k = 0; k < o.size(); ++k) outs[k].push_back(std::move(o[k]));
  }
  std::vector<Array> result;
  for (auto& parts : outs) result.push_back(stack(std::move(parts)));
  return result;
}

std::vector<Array> Primitive::batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                                        const std::vector<bool>& batched, std::int64_t members) const {
  std::vector<std::vector<Array>> parts(in.size());  // batched inputs: each member's cotangent
  std::vector<Array> sums(in.size());                // inputs every member reads: the sum over members
  for (std::int64_t m = 0; m < members; ++m) {
    std::vector<Array> ins, outs, cs;
    for (std::size_t i = 0; i < in.size(); ++i) ins.push_back(batched[i] ? member_view(*in[i], m) : plain_view(*in[i]));
    for (std::size_t k = 0; k < out.size(); ++k) {
      outs.push_back(member_view(*out[k], m));
      cs.push_back(member_view(*cts[k], m));
    }
    std::vector<const Array*> pi, po, pc;
    for (const Array& v : ins) pi.push_back(&v);
    for (const Array& v : outs) po.push_back(&v);
    for (const Array& v : cs) pc.push_back(&v);
    std::vector<Array> g = vjp(pi, po, pc, wanted);
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!wanted[i]) continue;
      Array gi = i < g.size() && g[i].valid() ? std::move(g[i]) : ops::eager::zeros_like(ins[i]);
      if (batched[i]) {
        parts[i].push_back(std::move(gi));
      } else {
        sums[i] = sums[i].valid() ? ops::eager::add(sums[i], gi) : std::move(gi);
      }
    }
  }
  std::vector<Array> result(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (wanted[i]) result[i] = batched[i] ? stack(std::move(parts[i])) : std::move(sums[i]);
  }
  return result;
}

// ---- the primitive a batched call is, for grad ---------------------------------------------------------------

namespace {

class Batched final : public Primitive {
 public:
  Batched(std::shared_ptr<const Primitive> p, std::vector<bool> batched, std::int64_t members)
      : p_(std::move(p)), batched_(std::move(batched)), members_(members) {}
  std::string name() const override { return "vmap(" + p_->name() + ")"; }
  Attributes attributes() const override {
    Attributes a = p_->attributes();
    a.emplace_back("members", members_);
    return a;
  }
  std::vector<Array> eval(Arrays in) const override {
    std::vector<Array> out = p_->batch(in, batched_, members_);
    for (const Array& o : out) {
      if (o.ndim() < 1 || o.dim(0) != members_) {
        throw Error("vmap: the batching rule of " + p_->name() + " gave " + o.signature() + ", not " +
                    std::to_string(members_) + " members along axis 0");
      }
    }
    return out;
  }
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted) const override {
    return p_->batch_vjp(in, out, cts, wanted, batched_, members_);
  }
  bool output_is_relu() const override { return p_->output_is_relu(); }
  std::shared_ptr<const Primitive> masking_input(bool over_input) const override {
    // (an r every member reads is one buffer for all of them: none may write over it)
    return rewrap(p_->masking_input(over_input && batched_[0]));
  }
  std::shared_ptr<const Primitive> premasked() const override { return rewrap(p_->premasked()); }
  AxisNames collective_axes() const override { return p_->collective_axes(); }
  bool result_invariant() const override { return p_->result_invariant(); }
  bool keeps_cotangents() const override { return p_->keeps_cotangents(); }
  std::vector<Array> tracked_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted) const override {
    return p_->batch_tracked_vjp(in, out, cts, wanted, batched_, members_);
  }
 private:
  std::shared_ptr<const Primitive> rewrap(std::shared_ptr<const Primitive> p) const {
    return p ? std::make_shared<Batched>(std::move(p), batched_, members_) : nullptr;
  }
  std::shared_ptr<const Primitive> p_;
  std::vector<bool> batched_;
  std::int64_t members_;
};

}  // namespace

std::shared_ptr<const Primitive> batched_primitive(std::shared_ptr<const Primitive> p, std::vector<bool> batched,
                                                   std::int64_t members) {
  return std::make_shared<Batched>(std::move(p), std::move(batched), members);
}

}  // namespace pmap::core
