// A run's checks against the machine and against a checkpoint, from its TrainConfig (the program's flags):
// the mesh the flags ask for, bf16 where the kernels can run it, memory, the processes of one run agreeing,
// and a checkpoint's recipe against the resumed run's. Each error names the flag.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include <pmap/mesh.h>

#include <pmapcc/io/json.h>

#include "examples/mnist_ensemble/config.h"

namespace pmap::ensemble {

// --precision bf16 where the kernels can run it: the CUDA kernels (cuBLAS's bf16 GEMMs, or their host run),
// or the CPU's avx512 kernels on a CPU with AVX512_BF16. ValueError naming --precision otherwise, and for a
// bad PMAPCC_BF16_PATH (kernels::bf16::active_path's), before anything runs.
void check_precision(const TrainConfig& c);

// The mesh's axes. as_configured: the mode's axis ("ensemble", or "data" in both parallel modes) by "model"
// when --mesh was given or weights are split (2-D), else the mode's axis over every device. one_axis: the
// mode's axis alone, for a run that splits no weight (train::Trainer's); a --mesh AxM with M > 1 or
// --mode model-parallel is refused, naming the flag.
enum class MeshAxes { as_configured, one_axis };

// The devices of c.backend (c.devices per process, or --mesh's spread evenly over the processes under
// mpirun/srun; the default count otherwise) on the axes `axes` says. Checks check_precision first, and
// cuda_kernels_on_host against the backend. ValueError naming the flag for a mesh that does not fit the
// devices or the processes.
Mesh build_mesh(const TrainConfig& c, MeshAxes axes = MeshAxes::as_configured);

// The members' parameters, optimizer state and gradients must fit in this machine's memory (CPU devices; a
// GPU's own limit shows as a CUDA allocation error naming the size): a ValueError naming --members instead of
// std::bad_alloc or the system's out-of-memory killer. `devices`: along the mode's axis; params_per_member:
// the floats a device holds per member; `copies`: of them per member (parameters, gradients and the
// optimizer's slots).
void check_memory(const TrainConfig& c, int devices, std::int64_t params_per_member, int copies);

// Processes started with different flags or data would train different things under one mesh: every process
// of `mesh` passes its `config` (TrainConfig::to_json of the resolved run) and data, and each compares a hash
// of them with process 0's. ValueError naming the processes that differ. Collective over the mesh's processes.
void check_processes_agree(const Mesh& mesh, const io::Json& config, const Dataset& train, const Dataset& test);

// The checkpoint `path` (its recorded config `saved`, TrainConfig::to_json when it was written) continues
// exactly as the run of `now` (this run's resolved to_json): the same recipe (model, mode, members, seed,
// batch, data, architecture) and every optimizer field `now` records, a field the file lacks taking the value
// runs had before it was recorded. DataError naming the file, the field and both values otherwise.
void check_resumable(const std::filesystem::path& path, const io::Json& saved, const io::Json& now);

// The checkpoint's model (`saved`: its recorded config's "architecture", TrainConfig::architecture) computes
// what this run's (`now`) does: the same input shape and modules (train::Model::architecture(); a runner's
// record, which lists every layer, read as one: its ReLUs folded into the module before them, its pooling and
// flattening left out). DataError naming the file and the first module that differs.
void check_architecture(const std::filesystem::path& path, const io::Json& saved, const io::Json& now);

// --members-subset's members against the `members` of the checkpoint `path`: each among them and named once.
// ValueError naming the flag and the member otherwise.
void check_member_subset(const std::vector<int>& subset, int members, const std::filesystem::path& path);

}  // namespace pmap::ensemble
