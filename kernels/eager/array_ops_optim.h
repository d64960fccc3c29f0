// The optimizer family's per-step scalars as functions of Arrays (pmap::ops::eager), for pmapcc/optim: the
// learning rate from a schedule, Adam's step size, the clipping factor and the next step counter, each
// computed on the device from the (1) i64 step counter in its memory, so a step never waits for the host.
// The rules of kernels/eager/array_ops.h hold (results on the operands' device; CUDA arrays only inside pmap).
// Not differentiable and not primitives: they compute optimizer state, never a value grad follows.
#pragma once

#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/mesh.h>

#include <pmapcc/kernels/optimizer_ops.h>

namespace pmap::ops::eager {

// lr (1) f32 = learning_rate * schedule_factor(schedule, *step), rounded to float once (learning_rate bit for
// bit for a constant schedule without warmup); step: (1) i64, the updates already made. The schedule is
// checked (kernels::validate: ValueError naming the field).
Array schedule_lr(const kernels::ScheduleParams& schedule, float learning_rate, const Array& step);
// The same for several base rates at once (a stacked ensemble's members, each its own rate): lr in
// learning_rates' shape, lr[m] = learning_rates[m] * schedule_factor(schedule, *step), each the bits the
// one-rate form gives for that rate. learning_rates: f32 with at least one value, on step's device.
Array schedule_lr(const kernels::ScheduleParams& schedule, const Array& learning_rates, const Array& step);

// alpha f32 in lr's shape = Adam's bias-corrected step size kernels::adam_alpha(params, lr[m], *step) for
// each of lr's values (one, or one per member); lr f32 on step's device.
Array adam_step_size(const kernels::AdamParams& params, const Array& step, const Array& lr);

// factor (1) f32 = optax's clip_by_global_norm factor for the f32 arrays xs together (one device): 1 when
// sqrt(sum of x^2) <= max_norm, else max_norm / that norm; the squares summed in double, array by array in
// order, each in index order (as the Trainer's clipping). max_norm > 0 (ValueError otherwise); xs not empty.
Array clip_factor(const std::vector<const Array*>& xs, float max_norm);
// The same for arrays some of which are blocks of tensors split over mesh axes (tensor parallelism, inside pmap):
// split[i] the axes xs[i] is split over (empty: whole on every device; every split array's the same axes). The
// blocks' squares are summed first and psum'd over their axes, then the whole arrays' added, so every device
// computes the factor of the unsplit tensors. ValueError for split of another length or of different axes.
Array clip_factor(const std::vector<const Array*>& xs, float max_norm, const std::vector<AxisNames>& split);

// optim::Sgd's update of one leaf in one pass (kernels::OptimizerOps::sgd_trace): {next, updates}, new arrays
// in grads' shape on its device, next = momentum * trace + grads and updates = -(lr * next) (nesterov:
// -(lr * (grads + momentum * next))). grads and trace: f32 of one shape; lr: one f32 value (schedule_lr's),
// or one per member for members stacked on grads' leading axis (grads (M, ...), lr M values: row m steps
// with lr[m]); all on one device. ShapeError / TypeError / DeviceError naming the argument otherwise.
std::pair<Array, Array> sgd_trace(const kernels::SgdParams& params, const Array& grads, const Array& trace,
                                  const Array& lr);

// A new (1) i64 array on step's device holding *step + 1 (step itself is left as it is).
Array increment(const Array& step);

}  // namespace pmap::ops::eager
