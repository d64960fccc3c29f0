// Model parallelism's settings in the program (examples/mnist_ensemble): the meshes and member counts that
// cannot run are refused naming the flag (build_mesh, resolved_config's TrainConfig::check, recipe_sharding),
// and the resolved configuration records the mesh, and the layout where weights are split. The training itself
// is tests/test_train_parallel.cpp's (train::Trainer under a sharding), tests/test_program_recipe.cpp's (the
// program's flags made into one) and the program's own (tests/cli/run_cli_tests.sh).
#include <doctest/doctest.h>

#include <string>

#include <pmap/error.h>
#include <pmap/mesh.h>

#include "examples/mnist_ensemble/config.h"
#include "examples/mnist_ensemble/recipe.h"
#include "examples/mnist_ensemble/run_checks.h"
#include "examples/mnist_ensemble/run_parts.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

// The program's flags for one epoch in `mode` on --mesh AxM (A x M CPU devices), batches of 64.
pe::TrainConfig config(pe::Mode mode, int a, int m, int members) {
  pe::TrainConfig c = pmap::testing::small_config(a * m, members, 1);
  c.mode = mode;
  c.mesh_axis = a;
  c.mesh_model = m;
  return c;
}

// The program's resolution of `c` on the mesh it builds for it; "(accepted)", or the error.
std::string refusal(const pe::TrainConfig& c) {
  try {
    (void)pe::resolved_config(c, pe::build_mesh(c), data().train, data().test);
  } catch (const pmap::ValueError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("model parallelism in the program: settings that cannot run are refused naming the flag") {
  CHECK(refusal(config(pe::Mode::model_parallel, 2, 2, 2)) ==
        "--mode model-parallel trains one model over the devices: --members must be 1, got 2");
  pe::TrainConfig dp = pmap::testing::small_config(2, 2, 1);  // no --mesh
  dp.mode = pe::Mode::data_parallel;
  CHECK(refusal(dp) == "--mode data-parallel trains one model over the devices: --members must be 1, got 2");
  CHECK(refusal(config(pe::Mode::data_parallel, 1, 2, 1)) ==
        "--mesh 1x2: --mode data-parallel keeps the whole model on every device (--mesh 2x1); --mode model-parallel "
        "splits its weights over 'model'");
  CHECK(refusal(config(pe::Mode::ensemble, 2, 2, 3)) ==
        "--members 3 is not a multiple of the 2 devices of --mesh's first axis: every device runs the same number of "
        "members");
  // Split weights need the batch in equal blocks (the collectives over 'model' take one shape on every device);
  // data parallel alone takes any batch.
  CHECK(refusal(config(pe::Mode::model_parallel, 3, 1, 1)) ==
        "--batch-size 64 does not split evenly over the 3 devices of --mesh's first axis: model parallelism needs "
        "equal blocks");
  CHECK(refusal(config(pe::Mode::data_parallel, 3, 1, 1)) == "(accepted)");
  // A layout that splits a weight over the members' axis.
  pe::TrainConfig over = config(pe::Mode::ensemble, 2, 2, 2);
  pe::LayoutMap layout;
  layout.add("Dense_0/kernel", pe::PartitionSpec::parse("None,ensemble"), true);
  for (const pe::LayoutMap::Entry& e : over.layout.entries()) layout.add(e.pattern, e.spec, e.must_match);
  over.layout = layout;
  REQUIRE(refusal(over) == "(accepted)");
  const pmap::Mesh mesh = pe::build_mesh(over);
  const pe::TrainConfig r = pe::resolved_config(over, mesh, data().train, data().test);
  CHECK_THROWS_WITH_AS(pe::recipe_sharding(r, pe::recipe_model(r, data().train), mesh.axes()),
                       "layout of Dense_0/kernel (shape (576, 256)): (None, 'ensemble') (from pattern "
                       "'Dense_0/kernel'): splits it over 'ensemble', which holds other members: weights may be "
                       "split over 'model' only (--layout)",
                       pmap::ValueError);
}

TEST_CASE("model parallelism in the program: the resolved configuration names the mesh, and the layout if split") {
  pe::TrainConfig e = pmap::testing::small_config(2, 2, 1);  // an ensemble on 2 devices, no --mesh
  const pmap::io::Json ej = pe::resolved_config(e, pe::build_mesh(e), data().train, data().test).to_json();
  CHECK(ej.at("mode") == "ensemble");
  CHECK(ej.at("mesh") == "2x1");
  CHECK(!ej.contains("layout"));
  const pe::TrainConfig mp = config(pe::Mode::model_parallel, 1, 2, 1);
  const pmap::io::Json j = pe::resolved_config(mp, pe::build_mesh(mp), data().train, data().test).to_json();
  CHECK(j.at("mode") == "model-parallel");
  CHECK(j.at("mesh") == "1x2");
  REQUIRE(j.at("layout").size() == 3);  // the reference layout: Dense_0 column-, Dense_1 row-parallel
  CHECK(j.at("layout")[0].at("pattern") == "Dense_0/kernel");
  CHECK(j.at("layout")[0].at("spec") == "(None, 'model')");
  CHECK(j.at("layout")[2].at("pattern") == "Dense_1/kernel");
  CHECK(j.at("layout")[2].at("spec") == "('model', None)");
}

}  // namespace PMAPCC_TEST_FILE
