// What the optimizers (optim/sgd.h) check outside their templates.
#include <pmapcc/optim/sgd.h>

namespace pmap::optim::detail {

void check_same(const char* fn, const std::vector<const Array*>& a, const char* an, const std::vector<const Array*>& b,
                const char* bn) {
  if (a.size() != b.size()) {
    throw ShapeError(std::string(fn) + ": " + an + " has " + std::to_string(a.size()) + " arrays and " + bn + " " +
                     std::to_string(b.size()) + " (trees of different structure)");
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i]->shape() != b[i]->shape() || a[i]->dtype() != b[i]->dtype()) {
      throw ShapeError(std::string(fn) + ": leaf " + std::to_string(i) + " is " + a[i]->signature() + " in " + an +
                       " and " + b[i]->signature() + " in " + bn);
    }
  }
}

}  // namespace pmap::optim::detail
