// Helpers of the multi-process test driver: inputs whose sums depend on the order of addition,
// result bits, clocks, and the Sharded / ordering checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include "../fault_program.h"

using fault_program::error_kind;  // "CollectiveMismatch", "Timeout", "Aborted", "ValueError" or "Error"

// `count` f32 values for device g, spread over 2^-10..2^10 with both signs, so that adding them in
// another order changes the rounding.
pmap::Array hard_floats(int g, std::int64_t count);
// Appends the array's elements' bits (f64 as two words) to `out`.
void append_bits(std::vector<std::uint32_t>& out, const pmap::Array& a);
// Milliseconds since the epoch (comparable across processes on one host).
long long now_ms();
// shard / replicate / unshard on a mesh over `devices`: Sharded holds this process's entries only.
// Returns the number of failed checks.
int check_sharded(const std::vector<pmap::Device>& devices, int rank, int processes);
// That the psum inputs of `n` devices sum to different bits when each process (local_n devices) first
// adds its own: i.e. that the bitwise comparison would catch a hierarchical sum. 0 when it would.
int check_order_matters(int n, int local_n);
// The randomized fault job (mpi_fault_stress.cpp): one mesh, calls and fault drawn from `seed`; 0 when
// every invariant held on this process.
int run_fault_stress(unsigned seed);
// train::Trainer on a mesh of `local_n` CPU devices per process against one process (mpi_trainer.cpp): 0 when
// every number is bitwise the single-process run's.
int check_trainer(int local_n);
