// What grad and value_and_grad (pmapcc/core/grad.h) check outside their templates.
#include <pmapcc/core/grad.h>

namespace pmap::grad_detail {

void check_value(const std::string& function, const Array& value) {
  if (!value.valid())
    throw ValueError("grad of '" + function + "': the function returned an empty Array handle");
  if (value.dtype() != DType::f32 || value.ndim() != 0) {
    throw ValueError("grad of '" + function + "': the function returned " + value.str() +
                     "; it must return a scalar f32 (shape ()): reduce it with ops::sum or ops::mean");
  }
}

}  // namespace pmap::grad_detail
