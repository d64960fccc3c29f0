// pmap::P (partition.h): what a spec says, printed as JAX prints it.
#include <pmap/partition.h>

namespace pmap {

bool P::replicated() const {
  for (const AxisNames& a : dims_)
    if (!a.empty()) return false;
  return true;
}

std::string P::str() const {
  std::string s = "P(";
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i > 0) s += ", ";
    s += dims_[i].empty() ? std::string("None") : dims_[i].str();
  }
  return s + ")";
}

}  // namespace pmap
