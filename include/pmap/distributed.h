// Several processes, one mesh (JAX's multi-process model). Launch the same program on every host
// with `mpirun -np P` or Slurm's `srun`, call distributed::initialize() first, and build the Mesh
// over global_devices(): each process then runs workers for its own (local) devices only, and
// collectives span every process. Sharded<T> values and pmap results hold one entry per LOCAL
// device (Mesh::local_devices(), in mesh order), as jax.pmap's inputs and outputs do in a
// multi-process program.
//
// CUDA devices: where every device of the mesh has a GPU of its own, collectives run on NCCL, within
// one process or across processes (one NCCL communicator over every process's devices: the process
// running mesh device 0 makes the ncclUniqueId and MPI carries it to the others; the MPI exchange then
// only checks that every process calls the same collective). Within one process, virtual devices
// sharing GPUs meet on the GPU (device hub). A mesh spanning processes whose processes share a GPU
// stages every CUDA collective through host memory and MPI (results bitwise those of CPU devices);
// PMAPCC_NCCL_SINGLE_GPU=1 on such a mesh raises NotAvailable.
//
// Failures: a process that dies, hangs or fails makes every other process raise in its next
// collective across processes (Aborted when a peer reported its failure, Timeout when a peer did not
// arrive within MeshOptions::process_timeout / PMAPCC_MPI_TIMEOUT, default 8 s), naming the lost
// process; in a chain of waits, the process at its head reports first (the first collectives of a call
// give up slightly sooner) and the others raise with its report, and a timeout also names this process's
// devices that returned early or never came to the collective (what the missing process may wait for).
// A late process that comes back raises Aborted in the collective it comes back to. Such a
// failure cannot be recovered: every later pmap over a multi-process mesh raises
// Aborted, and the program should exit with a non-zero status (mpirun then ends the job).
#pragma once

#include <cstdint>
#include <vector>

#include <pmap/device.h>

namespace pmap {
class Mesh;
}

namespace pmap::distributed {

// Joins the other processes of the job when this program was launched by mpirun or srun
// (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE or SLURM_STEP_NUM_TASKS set) and pmapcc was built with
// MPI; otherwise does nothing and the program is one process. Idempotent; call it first in main.
// MPI is initialized with MPI_THREAD_SERIALIZED (a program that initialized MPI itself must have
// asked for at least that) and, when pmapcc initialized it, finalized at exit. Raises MpiError.
void initialize();
// Finalizes MPI now instead of at exit; no mesh spanning processes may be alive or built after it.
void shutdown();

int process_index();  // this process's rank, 0..process_count()-1 (0 when not distributed)
int process_count();  // number of processes (1 when not distributed)

// Every process's local devices (local_devices(kind, local_n)), in process order: global device
// index = process_index * local count + local index, and Device::process tells the owner. Every
// process must call it, with the same local count (ValueError listing each process's count
// otherwise). Blocks until all processes have called it (Timeout after the process timeout).
// Without several processes this is local_devices(kind, local_n).
std::vector<Device> global_devices(DeviceKind kind, int local_n = -1);

// Per-device host data gathered onto every process (JAX's multihost_utils.process_allgather, tiled):
// `mine` holds one vector per local device of `mesh` (in Mesh::local_devices() order), all of one length;
// returns every device's vector, concatenated in the order of the mesh's devices, on every process. It is
// an all_gather over every axis of the mesh: every process must call it, with vectors of the same length.
// Raises ShapeError when `mine` does not hold one vector per local device or the lengths differ.
std::vector<float> process_allgather(const Mesh& mesh, const std::vector<std::vector<float>>& mine);
std::vector<std::int64_t> process_allgather(const Mesh& mesh, const std::vector<std::vector<std::int64_t>>& mine);

}  // namespace pmap::distributed
