// The member layout of checkpoints and of Trainer::params() / optimizer_state(): every member's tensors stacked
// tensor by tensor, so tensor t of member g of M sits at [t.offset * M + g * t.size, ... + t.size). A
// device's buffer holds its `local` members the same way, with M = local: these functions convert between
// the two (host memory; the Trainer moves the blocks to and from its devices).
#pragma once

#include <cstdint>
#include <vector>

#include <pmapcc/ensemble/model.h>

namespace pmap::ensemble {

// The `total` members stacked, from `devices` device blocks laid end to end in `blocks`, block d holding
// members d * local .. d * local + local - 1 (devices * local == total).
std::vector<float> stack_members(const Sequential& model, const std::vector<float>& blocks, int devices,
                                 std::int64_t local, std::int64_t total);

// The block of a device holding members first .. first + local - 1 of the `total` in `stacked`.
std::vector<float> member_block(const Sequential& model, const std::vector<float>& stacked, std::int64_t total,
                                std::int64_t first, std::int64_t local);

}  // namespace pmap::ensemble
