// Stacking members for checkpoints, and a device's block of them.
#include <pmapcc/ensemble/member_layout.h>

#include <algorithm>
#include <string>

#include <pmap/error.h>

namespace pmap::ensemble {

std::vector<float> stack_members(const TensorLayout& model, const std::vector<float>& blocks, int devices,
                                 std::int64_t local, std::int64_t total) {
  const std::int64_t per_device = local * model.per_member;
  if (devices * local != total || static_cast<std::int64_t>(blocks.size()) < devices * per_device)
    throw ValueError("stack_members: " + std::to_string(devices) + " blocks of " + std::to_string(local) +
                     " members do not make " + std::to_string(total) + " (or " + std::to_string(blocks.size()) +
                     " values are too few)");
  std::vector<float> out(static_cast<std::size_t>(total * model.per_member));
  for (int d = 0; d < devices; ++d) {
    const auto block = blocks.begin() + d * per_device;
    for (const auto& t : model.tensors)
      for (std::int64_t j = 0; j < local; ++j)
        std::copy_n(block + t.offset * local + j * t.size, t.size,
                    out.begin() + t.offset * total + (d * local + j) * t.size);
  }
  return out;
}

std::vector<float> member_block(const TensorLayout& model, const std::vector<float>& stacked, std::int64_t total,
                                std::int64_t first, std::int64_t local) {
  if (first < 0 || first + local > total ||
      static_cast<std::int64_t>(stacked.size()) != total * model.per_member)
    throw ValueError("member_block: members " + std::to_string(first) + ".." + std::to_string(first + local - 1) +
                     " of " + std::to_string(total) + " (" + std::to_string(stacked.size()) + " values)");
  std::vector<float> block(static_cast<std::size_t>(local * model.per_member));
  for (const auto& t : model.tensors)
    for (std::int64_t j = 0; j < local; ++j)
      std::copy_n(stacked.begin() + t.offset * total + (first + j) * t.size, t.size,
                  block.begin() + t.offset * local + j * t.size);
  return block;
}

}  // namespace pmap::ensemble
