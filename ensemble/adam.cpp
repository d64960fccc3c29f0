// Adam and AdamW as Keras computes them (kernels::AdamParams): two slots, the first and second moments;
// the bias-corrected step size is computed once per step and member, on the device. AdamW is Adam with
// decoupled weight decay (optimizer_step applies it; its default is 0.004).
#include <pmapcc/ensemble/optimizer.h>

namespace pmap::ensemble {
namespace {

class Adam final : public Optimizer {
 public:
  Adam(std::string name, kernels::AdamParams p) : name_(std::move(name)), p_(p) {}
  std::string name() const override { return name_; }
  const std::vector<std::string>& slots() const override {
    static const std::vector<std::string> names{"m", "v"};
    return names;
  }
  void prepare(const kernels::OptimizerOps& ops, int members, const std::int64_t* step, const float* lr,
               float* aux) const override {
    ops.adam_step_size(p_, members, step, lr, aux);
  }
  void update(const kernels::OptimizerOps& ops, int members, std::size_t n, kernels::UpdateScalars s, const float* aux,
              float* params, float* const* slots, const float* grads) const override {
    ops.adam_update(p_, members, n, s, aux, params, slots[0], slots[1], grads);
  }

 private:
  std::string name_;
  kernels::AdamParams p_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adam(const OptimizerConfig& c) {
  return std::make_unique<Adam>(c.name, kernels::AdamParams{c.beta_1, c.beta_2, c.epsilon});
}

}  // namespace pmap::ensemble
