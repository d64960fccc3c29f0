// pmap_hello: first contact with pmapcc. Four CPU devices on a 1-D mesh "i"; device r contributes r + 1,
// and psum, pmean and all_gather combine the contributions across the axis (exactly: 10, 2.5, [1 2 3 4]).
#include <iostream>
#include <vector>

#include <pmap/pmap.h>

struct Combined {
  float sum = 0;
  float mean = 0;
  std::vector<float> gathered;
  bool operator==(const Combined&) const = default;
};

int main() {
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 4), "i");
  std::cout << mesh.str() << "\n";
  // Written for one device; pmap runs it on all four at once.
  auto results = pmap::pmap([] {
    pmap::Array mine = pmap::Array::scalar(static_cast<float>(pmap::axis_index("i") + 1));
    return Combined{pmap::psum(mine, "i").item<float>(), pmap::pmean(mine, "i").item<float>(),
                    pmap::all_gather(mine, "i").to_vector<float>()};
  }, mesh, "i")();

  const Combined& first = results[0];
  std::cout << "psum       = " << first.sum << "\n";
  std::cout << "pmean      = " << first.mean << "\n";
  std::cout << "all_gather = [";
  for (std::size_t k = 0; k < first.gathered.size(); ++k) std::cout << (k ? " " : "") << first.gathered[k];
  std::cout << "]\n";
  for (const Combined& r : results)
    if (!(r == first)) {
      std::cout << "devices disagree\n";
      return 1;
    }
  std::cout << "all " << results.size() << " devices agree\n";
  return 0;
}
