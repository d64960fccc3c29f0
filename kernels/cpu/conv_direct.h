// Internal to the CPU conv2d: the direct path for small patches (ConvPlan::direct), forward and dw/db.
#pragma once

#include <pmapcc/kernels/cpu/im2col.h>

namespace PMAPCC_CPU_NS::detail {

// y (M, N, OH, OW, Cout) = conv(x, w) + b (b may be null), then max(., 0) when plan.p.relu. padded: scratch
// of plan.padded_floats; rounded: scratch of plan.rounded_floats (bf16 only, else unused).
void direct_forward(const ConvPlan& plan, const float* x, const float* w, const float* b, float* y, float* padded,
                    float* rounded);

// dw (M, KH, KW, Cin, Cout), written, and db (M, Cout), written unless null, from dy (M, N, OH, OW, Cout). db
// sums dy (unrounded in bf16) over pixels in double in pixel order, as column_sums does (bitwise the same).
// padded and rounded as above; db_sum: scratch of Cout doubles.
void direct_weights(const ConvPlan& plan, const float* x, const float* dy, float* dw, float* db, float* padded,
                    double* db_sum, float* rounded);

}  // namespace PMAPCC_CPU_NS::detail
