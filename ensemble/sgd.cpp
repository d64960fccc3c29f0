// SGD with momentum (optax.sgd: m <- momentum m + g; p <- p - lr m; Nesterov optional): one slot.
#include <pmapcc/ensemble/optimizer.h>

namespace pmap::ensemble {
namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(kernels::SgdParams p) : p_(p) {}
  std::string name() const override { return "sgd"; }
  const std::vector<std::string>& slots() const override {
    static const std::vector<std::string> names{"momentum"};
    return names;
  }
  void update(const kernels::OptimizerOps& ops, int members, std::size_t n, kernels::UpdateScalars s, const float*,
              float* params, float* const* slots, const float* grads) const override {
    ops.sgd_update(p_, members, n, s, params, slots[0], grads);
  }

 private:
  kernels::SgdParams p_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(const OptimizerConfig& c) {
  return std::make_unique<Sgd>(kernels::SgdParams{c.momentum, c.nesterov});
}

}  // namespace pmap::ensemble
