// pmap::distributed in a program that was not launched by mpirun / srun: one process, and meshes
// whose devices name another process are refused. (Multi-process runs: tests/mpi.)
#include <doctest/doctest.h>

#include <pmap/pmap.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

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

TEST_CASE("distributed: process_allgather concatenates every device's vector in mesh order") {
  const pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 3), "i");
  const std::vector<std::vector<float>> mine{{0.5f, 1.0f}, {10.5f, 11.0f}, {20.5f, 21.0f}};
  CHECK(pmap::distributed::process_allgather(mesh, mine) == std::vector<float>{0.5f, 1.0f, 10.5f, 11.0f, 20.5f, 21.0f});
  const std::vector<std::vector<std::int64_t>> big{{std::int64_t{1} << 62}, {-7}, {3}};
  CHECK(pmap::distributed::process_allgather(mesh, big) == std::vector<std::int64_t>{std::int64_t{1} << 62, -7, 3});
  // Over a 2-D mesh: every axis, in the order of the mesh's devices.
  const pmap::Mesh grid(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"a", 2}, {"b", 2}});
  CHECK(pmap::distributed::process_allgather(grid, std::vector<std::vector<float>>{{0}, {1}, {2}, {3}}) ==
        std::vector<float>{0, 1, 2, 3});
  CHECK_THROWS_WITH_AS(pmap::distributed::process_allgather(mesh, std::vector<std::vector<float>>{{1}, {2}}),
                       "process_allgather: 2 vectors for the 3 local devices of the mesh", pmap::ShapeError);
  CHECK_THROWS_WITH_AS(pmap::distributed::process_allgather(mesh, std::vector<std::vector<float>>{{1}, {2, 3}, {4}}),
                       "process_allgather: the vector of cpu:1 has 2 elements, that of cpu:0 1", pmap::ShapeError);
}

}  // namespace PMAPCC_TEST_FILE
