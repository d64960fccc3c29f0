// clip_by_global_norm's and add_decayed_weights' leaf functions (optim/transforms.h).
#include <pmapcc/optim/transforms.h>

#include <string>
#include <utility>
#include <vector>

#include <pmapcc/kernels/eager/array_ops_optim.h>

namespace pmap::optim {

void ClipByGlobalNorm::validate() const { detail::require_positive(kName, "max_norm", max_norm); }

EmptyState ClipByGlobalNorm::init_leaves(const Leaves& params) const {
  validate();
  detail::params_device("optim::clip_by_global_norm::init", params);
  return {};
}

std::vector<Array> ClipByGlobalNorm::update_leaves(const Leaves& grads, EmptyState&, const Leaves& params) const {
  validate();
  detail::params_device("optim::clip_by_global_norm::update", params);
  const std::vector<AxisNames>* split = SplitLeaves::current();
  if (split != nullptr && split->size() != grads.size())
    throw ValueError(std::string(kName) + ": an optim::SplitLeaves scope gives " + std::to_string(split->size()) +
                     " leaves' axes for " + std::to_string(grads.size()) + " gradients");
  const Array factor = split != nullptr ? ops::eager::clip_factor(grads, max_norm, *split)
                                        : ops::eager::clip_factor(grads, max_norm);
  std::vector<Array> updates;
  for (const Array* g : grads) updates.push_back(ops::multiply(*g, factor));  // the kernels' g *= grad_scale
  return updates;
}

namespace {
thread_local const std::vector<AxisNames>* split_leaves = nullptr;
}  // namespace

SplitLeaves::SplitLeaves(std::vector<AxisNames> split) : split_(std::move(split)), previous_(split_leaves) {
  split_leaves = &split_;
}
SplitLeaves::~SplitLeaves() { split_leaves = previous_; }
const std::vector<AxisNames>* SplitLeaves::current() { return split_leaves; }

ClipByGlobalNorm clip_by_global_norm(float max_norm) {
  ClipByGlobalNorm tx{.max_norm = max_norm};
  tx.validate();
  return tx;
}

void AddDecayedWeights::validate() const { detail::require_finite_nonnegative(kName, "weight_decay", weight_decay); }

EmptyState AddDecayedWeights::init_leaves(const Leaves& params) const {
  validate();
  detail::params_device("optim::add_decayed_weights::init", params);
  return {};
}

std::vector<Array> AddDecayedWeights::update_leaves(const Leaves& grads, EmptyState&, const Leaves& params) const {
  validate();
  detail::check_same("optim::add_decayed_weights::update", grads, "grads", params, "params");
  std::vector<Array> updates;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Array& p = *params[i];
    // With per-member values (p * wd[m]) * 1 + 0, the bits of the one-value form p * wd + 0.
    Array decay = weight_decays ? ops::scale(ops::multiply(p, detail::per_member(kName, *weight_decays, p)), 1.0f)
                                : ops::scale(p, weight_decay);
    updates.push_back(ops::add(*grads[i], decay));
  }
  return updates;
}

AddDecayedWeights add_decayed_weights(float weight_decay) {
  AddDecayedWeights tx{.weight_decay = weight_decay};
  tx.validate();
  return tx;
}

}  // namespace pmap::optim
