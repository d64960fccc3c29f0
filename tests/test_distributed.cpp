// pmap::distributed in a program that was not launched by mpirun / srun: one process, and meshes
// whose devices name another process are refused. (Multi-process runs: tests/mpi.)
#include <doctest/doctest.h>

#include <pmap/pmap.h>

TEST_CASE("distributed: a plain launch is one process and global devices are the local ones") {
  pmap::distributed::initialize();
  pmap::distributed::initialize();  // idempotent
  CHECK(pmap::distributed::process_index() == 0);
  CHECK(pmap::distributed::process_count() == 1);
  auto global = pmap::distributed::global_devices(pmap::DeviceKind::cpu, 3);
  CHECK(global == pmap::local_devices(pmap::DeviceKind::cpu, 3));
  for (const auto& d : global) CHECK(d.process == 0);
  pmap::Mesh mesh(global, "i");
  CHECK(mesh.local_size() == 3);
  CHECK(mesh.local_devices() == mesh.devices());
}

TEST_CASE("distributed: a mesh over another process's devices needs MPI running") {
  auto devices = pmap::local_devices(pmap::DeviceKind::cpu, 4);
  devices[2].process = devices[3].process = 1;
  CHECK_THROWS_AS(pmap::Mesh(devices, "i"), pmap::NotAvailable);
  for (auto& d : devices) d.process = 1;
  CHECK_THROWS_WITH_AS(pmap::Mesh(devices, "i"), doctest::Contains("none of its 4 devices belongs to this process"),
                       pmap::ValueError);
}

TEST_CASE("distributed: MeshOptions::process_timeout must not be negative") {
  pmap::MeshOptions o;
  o.process_timeout = std::chrono::milliseconds(-1);
  CHECK_THROWS_AS(pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "i", o), pmap::ValueError);
}
