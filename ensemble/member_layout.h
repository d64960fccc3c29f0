// The member layout of checkpoints and of Trainer::params() / optimizer_state(): every member's tensors stacked
// tensor by tensor, so tensor t of member g of M sits at [t.offset * M + g * t.size, ... + t.size). A
// device's buffer holds its `local` members the same way, with M = local: these functions convert between
// the two (host memory; the Trainer moves the blocks to and from its devices).
#pragma once

#include <cstdint>
#include <vector>

#include <pmapcc/ensemble/model.h>

namespace pmap::ensemble {

// Each function works on the variables of one role (model.h's TensorLayout); the overloads taking a model
// work on its parameters.

// The `total` members stacked, from `devices` device blocks laid end to end in `blocks`, block d holding
// members d * local .. d * local + local - 1 (devices * local == total).
std::vector<float> stack_members(const TensorLayout& layout, const std::vector<float>& blocks, int devices,
                                 std::int64_t local, std::int64_t total);
inline std::vector<float> stack_members(const Sequential& model, const std::vector<float>& blocks, int devices,
                                        std::int64_t local, std::int64_t total) {
  return stack_members(model.params_layout(), blocks, devices, local, total);
}

// The block of a device holding members first .. first + local - 1 of the `total` in `stacked`.
std::vector<float> member_block(const TensorLayout& layout, const std::vector<float>& stacked, std::int64_t total,
                                std::int64_t first, std::int64_t local);
inline std::vector<float> member_block(const Sequential& model, const std::vector<float>& stacked,
                                       std::int64_t total, std::int64_t first, std::int64_t local) {
  return member_block(model.params_layout(), stacked, total, first, local);
}

}  // namespace pmap::ensemble
