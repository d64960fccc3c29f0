// Model parallelism end to end. At the step level: the real train_step (ensemble/step.h) on a ("data",
// "model") mesh of CPU devices, each device running its blocks of the weights, against the 1x1 mesh on the
// same global batches; and the same mesh run twice. At the trainer level: Mode::model_parallel and
// ("ensemble", "model") meshes against unsplit training, checkpoints of whole tensors that reshard onto
// any mesh, and the configurations that are refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <tuple>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/ensemble/layout.h>
#include <pmapcc/ensemble/step.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/io/safetensors.h>
#include <pmapcc/kernels/backend.h>

#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;

namespace {

constexpr int kBatch = 8, kSteps = 20, kSide = 12, kClasses = 10;


struct Data {
  std::vector<float> images;          // kSteps * kBatch examples
  std::vector<std::int32_t> labels;
};

Data make_data() {
  Data d{std::vector<float>(static_cast<std::size_t>(kSteps * kBatch * kSide * kSide)),
         std::vector<std::int32_t>(static_cast<std::size_t>(kSteps * kBatch))};
  pmap::uniform(pmap::key(21), d.images);
  std::vector<float> u(d.labels.size());
  pmap::uniform(pmap::key(22), u);
  for (std::size_t i = 0; i < u.size(); ++i) d.labels[i] = std::min(kClasses - 1, static_cast<int>(u[i] * kClasses));
  return d;
}

// Trains one member for kSteps SGD steps on a data x model mesh from `init` (the whole model's weights);
// returns the trained weights put back together from the devices' blocks.
std::vector<float> train(const pe::Sequential& model, const std::vector<float>& init, const Data& data, int d_size,
                         int m_size) {
  const std::vector<pmap::AxisSpec> axes{{"data", d_size}, {"model", m_size}};
  const pe::ShardingPlan plan(model, pe::reference_cnn_layout(), axes);
  const pe::LocalModel local = pe::local_model(model, plan);
  const pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, d_size * m_size), axes);
  const auto& be = pmap::kernels::backend_for(pmap::DeviceKind::cpu);
  const int rows = kBatch / d_size;
  std::vector<std::unique_ptr<pe::DeviceWork>> work;
  std::vector<pe::TrainState> states;
  const pe::OptimizerConfig sgd;  // SGD 0.1, momentum 0.9
  const auto optimizer = pe::make_optimizer(sgd);
  for (int i = 0; i < mesh.size(); ++i) {
    const pmap::Device dev = mesh.local_devices()[static_cast<std::size_t>(i)];
    work.push_back(std::make_unique<pe::DeviceWork>(*local.model, be, dev, 1, rows, rows, 0, kSteps,
                                                    pe::OptimizerWork(sgd, 1, 0, dev), false,
                                                    pe::RunnerSplit{local.splits, {"data", "model"}, "data"}));
    std::vector<float> block(static_cast<std::size_t>(plan.local_params()));
    plan.shard(init, mesh.coords(i), block);
    states.push_back(pe::make_train_state(*optimizer, pmap::Array::from_host(block, {plan.local_params()}, dev)));
  }
  pe::StepOptions opt;
  opt.optimizer = optimizer.get();
  opt.data_parallel = true;
  opt.axis = "data";
  for (int step = 0; step < kSteps; ++step)
    pmap::pmap([&] {
      const auto i = static_cast<std::size_t>(pmap::axis_index({"data", "model"}));  // the mesh index
      const pmap::Device dev = pmap::current_device();
      const auto first = static_cast<std::size_t>(step * kBatch + pmap::axis_index("data") * rows);
      const std::size_t pixels = kSide * kSide;
      pe::Batch batch{
          pmap::Array::from_host(std::span<const float>(data.images.data() + first * pixels, rows * pixels),
                                 {rows, kSide, kSide, 1}, dev),
          pmap::Array::from_host(std::span<const std::int32_t>(data.labels.data() + first, rows), {rows}, dev)};
      pe::train_step(states[i], *work[i], batch, opt);
    }, mesh)();
  std::vector<float> full(init.size(), 0.0f);
  std::vector<std::vector<float>> blocks;
  for (int i = 0; i < mesh.size(); ++i) {
    blocks.push_back(states[static_cast<std::size_t>(i)].params.to_vector<float>());
    plan.unshard(blocks.back(), mesh.coords(i), full);
  }
  // Devices that hold the same blocks (the same model coordinate) hold the same bits.
  for (int i = 0; i < mesh.size(); ++i)
    for (int j = 0; j < mesh.size(); ++j)
      if (mesh.coords(i)[1] == mesh.coords(j)[1])
        CHECK(blocks[static_cast<std::size_t>(i)] == blocks[static_cast<std::size_t>(j)]);
  return full;
}

}  // namespace

TEST_CASE("model parallel: 20 steps on every mesh shape match the 1x1 mesh up to float reassociation") {
  const auto model = pe::flax_mnist_cnn({kSide, kSide, 1}, kClasses);
  std::vector<float> init(static_cast<std::size_t>(model->params_per_member()));
  const std::vector<pmap::Key> keys{pmap::key(20)};
  model->init(keys, init);
  const Data data = make_data();
  const std::vector<float> ref = train(*model, init, data, 1, 1);
  float scale = 0, moved = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::abs(ref[i]));
    moved = std::max(moved, std::abs(ref[i] - init[i]));
  }
  REQUIRE(moved > 1e-3f);  // the steps changed the weights
  const std::pair<int, int> meshes[] = {{2, 1}, {1, 2}, {2, 2}, {1, 4}, {4, 2}, {2, 4}};
  for (const auto& [d, m] : meshes) {
    CAPTURE(d);
    CAPTURE(m);
    const std::vector<float> got = train(*model, init, data, d, m);
    float diff = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) diff = std::max(diff, std::abs(got[i] - ref[i]));
    MESSAGE("mesh ", d, "x", m, ": max |w - w_1x1| = ", diff, " (max |w| ", scale, ")");
    CHECK(diff <= 1e-6f * scale);  // measured: at most 1.5e-7 (max |w| 0.78)
    CHECK(train(*model, init, data, d, m) == got);  // bitwise, run after run
  }
}

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

// 10 steps of 64 on the 12x12 training data; mesh A x M (0 x 0: no --mesh).
pe::TrainConfig config(pe::Mode mode, int a, int m, int members = 1) {
  pe::TrainConfig c;
  c.mode = mode;
  c.mesh_axis = a;
  c.mesh_model = m;
  c.members = members;
  c.epochs = 2;
  c.batch_size = 64;
  c.eval_batch = 128;
  return c;
}

// The largest |a - b| relative to the largest |a|.
float relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float scale = 0;
  for (float v : a) scale = std::max(scale, std::abs(v));
  return pmap::testing::max_abs_diff(a, b) / scale;
}

std::filesystem::path temp_path(const std::string& name) {
  return pmap::testing::scratch_dir("pmapcc_model_parallel") / name;
}

}  // namespace

TEST_CASE("the model-parallel trainer: a Dx1 mesh is data parallel bit for bit, and DxM matches one device") {
  pe::Trainer dp(config(pe::Mode::data_parallel, 0, 0), data().train, data().test);
  pe::Trainer dp2(config(pe::Mode::data_parallel, 2, 1), data().train, data().test);
  pe::Trainer mp21(config(pe::Mode::model_parallel, 2, 1), data().train, data().test);
  CHECK(mp21.mesh().str() == "Mesh(data=2, model=1; cpu:0..cpu:1)");
  CHECK(mp21.plan() != nullptr);
  CHECK(dp.plan() == nullptr);
  const pe::EpochMetrics a = dp2.run_epoch(), b = mp21.run_epoch();
  CHECK(mp21.params() == dp2.params());
  CHECK(mp21.optimizer_state("momentum") == dp2.optimizer_state("momentum"));
  CHECK(a.train_loss == b.train_loss);
  CHECK(a.member_test_accuracy == b.member_test_accuracy);
  CHECK(a.ensemble_test_accuracy == b.ensemble_test_accuracy);
  const pe::EpochMetrics ref = dp.run_epoch();
  // The last mesh with Dense_0's outputs gathered whole (its output layout) and Dense_1 whole.
  pe::LayoutMap gathered;
  gathered.add("Dense_0/kernel", pe::PartitionSpec::parse("None,model"));
  gathered.add("Dense_0/bias", pe::PartitionSpec::parse("model"));
  gathered.add("Dense_0/output", pe::PartitionSpec::parse("data,None"));
  const std::tuple<int, int, const pe::LayoutMap*> meshes[] = {{1, 2, nullptr}, {2, 2, nullptr}, {1, 4, nullptr},
                                                              {2, 2, &gathered}};
  for (const auto& [d, m, layout] : meshes) {
    CAPTURE(d);
    CAPTURE(m);
    CAPTURE(layout != nullptr);
    pe::TrainConfig c = config(pe::Mode::model_parallel, d, m);
    if (layout != nullptr) c.layout = *layout;
    pe::Trainer t(c, data().train, data().test);
    const pe::EpochMetrics e = t.run_epoch();
    const float rel = relative_diff(dp.params(), t.params());
    MESSAGE("trainer ", d, "x", m, " after 10 steps: max |w - w_1| / max |w| = ", rel);
    CHECK(rel <= 1e-6f);  // measured: at most 7.6e-8
    CHECK(relative_diff(dp.optimizer_state("momentum"), t.optimizer_state("momentum")) <= 1e-5f);
    CHECK(e.train_loss == doctest::Approx(ref.train_loss).epsilon(1e-5));
    CHECK(e.test_loss == doctest::Approx(ref.test_loss).epsilon(1e-5));
    CHECK(e.member_test_accuracy.size() == 1);
    pe::Trainer again(c, data().train, data().test);
    again.run_epoch();
    CHECK(again.params() == t.params());  // bitwise, run after run
  }
}

TEST_CASE("clipping by global norm with split weights: the norm adds every device's blocks, as on one device") {
  // A norm small enough that every step clips: the run differs from the unclipped one.
  pe::TrainConfig one = config(pe::Mode::data_parallel, 0, 0);
  one.optimizer.clip_norm = 0.05f;
  pe::Trainer ref(one, data().train, data().test);
  ref.run_epoch();
  pe::Trainer unclipped(config(pe::Mode::data_parallel, 0, 0), data().train, data().test);
  unclipped.run_epoch();
  CHECK(relative_diff(ref.params(), unclipped.params()) > 1e-3f);
  const std::pair<int, int> meshes[] = {{1, 2}, {2, 2}, {1, 4}};
  for (const auto& [d, m] : meshes) {
    CAPTURE(d);
    CAPTURE(m);
    pe::TrainConfig c = config(pe::Mode::model_parallel, d, m);
    c.optimizer.clip_norm = 0.05f;
    pe::Trainer t(c, data().train, data().test);
    t.run_epoch();
    const float rel = relative_diff(ref.params(), t.params());
    MESSAGE("clipped ", d, "x", m, " after 10 steps: max |w - w_1| / max |w| = ", rel);
    CHECK(rel <= 1e-6f);
  }
  // Each member of an ensemble split over 'model' clips as it would unsplit.
  pe::TrainConfig whole = config(pe::Mode::ensemble, 0, 0, 2);
  whole.devices = 2;
  whole.optimizer.clip_norm = 0.05f;
  pe::Trainer ens_ref(whole, data().train, data().test);
  ens_ref.run_epoch();
  pe::TrainConfig split = config(pe::Mode::ensemble, 2, 2, 2);
  split.optimizer.clip_norm = 0.05f;
  pe::Trainer ens(split, data().train, data().test);
  ens.run_epoch();
  CHECK(relative_diff(ens_ref.params(), ens.params()) <= 1e-6f);
  // With a backend that captures the step (the CUDA kernels, run on the host), the update, whose psum
  // meets on the host, runs eagerly: the run trains, and as one device does with those kernels.
  pe::TrainConfig host_one = one;
  host_one.cuda_kernels_on_host = true;
  pe::Trainer host_ref(host_one, data().train, data().test);
  host_ref.run_epoch();
  pe::TrainConfig host_split = config(pe::Mode::model_parallel, 1, 2);
  host_split.optimizer.clip_norm = 0.05f;
  host_split.cuda_kernels_on_host = true;
  pe::Trainer host(host_split, data().train, data().test);
  host.run_epoch();
  CHECK(relative_diff(host_ref.params(), host.params()) <= 1e-6f);
}

TEST_CASE("an ensemble on an ('ensemble', 'model') mesh: each member split over 'model' trains as unsplit") {
  pe::TrainConfig whole = config(pe::Mode::ensemble, 0, 0, 4);
  whole.devices = 2;
  pe::Trainer ref(whole, data().train, data().test);
  const pe::EpochMetrics r = ref.run_epoch();
  const std::pair<int, int> meshes[] = {{2, 2}, {1, 2}, {4, 1}};
  for (const auto& [e, m] : meshes) {
    CAPTURE(e);
    CAPTURE(m);
    pe::Trainer t(config(pe::Mode::ensemble, e, m, 4), data().train, data().test);
    CHECK(t.members_per_device() == 4 / e);
    CHECK(t.mesh().axes()[0].name == "ensemble");
    CHECK((t.plan() != nullptr) == (m > 1));
    const pe::EpochMetrics got = t.run_epoch();
    const float rel = relative_diff(ref.params(), t.params());
    MESSAGE("ensemble mesh ", e, "x", m, " after 10 steps: max |w - w_unsplit| / max |w| = ", rel);
    CHECK(rel <= 1e-6f);
    REQUIRE(got.member_test_accuracy.size() == 4);
    for (std::size_t g = 0; g < 4; ++g)
      CHECK(got.member_calibration[g].nll == doctest::Approx(r.member_calibration[g].nll).epsilon(1e-4));
    CHECK(got.ensemble_calibration.nll == doctest::Approx(r.ensemble_calibration.nll).epsilon(1e-4));
  }
}

TEST_CASE("checkpoints of split weights hold whole tensors, resume exactly and reshard onto any mesh") {
  const auto path = temp_path("mp.safetensors"), whole = temp_path("dp.safetensors");
  pe::Trainer straight(config(pe::Mode::model_parallel, 2, 2), data().train, data().test);
  straight.run_epoch();
  straight.run_epoch();
  {
    pe::Trainer first(config(pe::Mode::model_parallel, 2, 2), data().train, data().test);
    first.run_epoch();
    first.save_checkpoint(path);
    pe::Trainer dp(config(pe::Mode::data_parallel, 0, 0), data().train, data().test);
    dp.save_checkpoint(whole);
  }
  // The same tensors, names and shapes as an unsplit model's checkpoint.
  const auto split_file = pmap::io::load_safetensors(path), whole_file = pmap::io::load_safetensors(whole);
  REQUIRE(split_file.tensors.size() == whole_file.tensors.size());
  for (std::size_t i = 0; i < split_file.tensors.size(); ++i) {
    CHECK(split_file.tensors[i].name == whole_file.tensors[i].name);
    CHECK(split_file.tensors[i].shape == whole_file.tensors[i].shape);
  }
  pe::Trainer resumed(config(pe::Mode::model_parallel, 2, 2), data().train, data().test);
  resumed.load_checkpoint(path);
  const std::vector<float> saved = resumed.params(), saved_momentum = resumed.optimizer_state("momentum");
  resumed.run_epoch();
  CHECK(resumed.params() == straight.params());
  CHECK(resumed.optimizer_state("momentum") == straight.optimizer_state("momentum"));
  CHECK(resumed.history().back().member_test_accuracy == straight.history().back().member_test_accuracy);
  // Onto other mesh shapes (another layout too): the same whole weights come back, bit for bit.
  const std::pair<int, int> meshes[] = {{1, 4}, {1, 1}, {4, 1}, {1, 2}};
  for (const auto& [d, m] : meshes) {
    CAPTURE(d);
    CAPTURE(m);
    pe::Trainer t(config(pe::Mode::model_parallel, d, m), data().train, data().test);
    t.load_checkpoint(path);
    CHECK(t.params() == saved);
    CHECK(t.optimizer_state("momentum") == saved_momentum);
    CHECK(t.epochs_done() == 1);
  }
  pe::TrainConfig conv = config(pe::Mode::model_parallel, 1, 2);
  pe::LayoutMap layout;  // the convolutions column- then row-parallel too
  layout.add("Conv_0/kernel", pe::PartitionSpec::parse("None,None,None,model"));
  layout.add("Conv_0/bias", pe::PartitionSpec::parse("model"));
  layout.add("Conv_1/kernel", pe::PartitionSpec::parse("None,None,model,None"));
  for (const pe::LayoutMap::Entry& e : conv.layout.entries()) layout.add(e.pattern, e.spec);
  conv.layout = layout;
  pe::Trainer t(conv, data().train, data().test);
  t.load_checkpoint(path);
  CHECK(t.params() == saved);
  // A checkpoint of one mode does not resume in another.
  pe::Trainer dp(config(pe::Mode::data_parallel, 0, 0), data().train, data().test);
  CHECK_THROWS_WITH_AS(dp.load_checkpoint(path), doctest::Contains("mode"), pmap::DataError);
  std::filesystem::remove_all(path.parent_path());
}

TEST_CASE("model-parallel configurations that cannot run are refused, naming the flag or the weight") {
  auto refused = [](pe::TrainConfig c, const char* text) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(pe::Trainer(c, data().train, data().test), doctest::Contains(text), pmap::ValueError);
  };
  pe::TrainConfig c = config(pe::Mode::model_parallel, 2, 2);
  c.devices = 2;
  refused(c, "--mesh 2x2 needs 4 devices, the run has 2");
  refused(config(pe::Mode::data_parallel, 1, 2), "--mode data-parallel keeps the whole model on every device");
  refused(config(pe::Mode::ensemble, 2, 2, 3), "--members 3 is not a multiple of the 2 devices of --mesh's first axis");
  refused(config(pe::Mode::model_parallel, 2, 2, 2), "--members must be 1");
  c = config(pe::Mode::model_parallel, 3, 1);
  refused(c, "--batch-size 64 does not split evenly over the 3 devices");
  // Data parallel: any batch of one example a device or more (train::Trainer's); the runner needs equal blocks.
  c = config(pe::Mode::data_parallel, 3, 1);
  refused(c, "--batch-size 64 does not split evenly over the 3 devices of 'data': the runner (ensemble::Trainer) "
             "needs equal blocks; train::Trainer, the program's, takes any batch size");
  c.batch_size = 2;
  refused(c, "--batch-size 2 is smaller than --devices 3: data parallel gives every "
             "device at least one example");
  for (const auto& [pattern, spec, text] : {
           std::tuple{"Dense_0/kernel", "data,None", "layout of Dense_0/kernel (shape (576, 256)): ('data', None): "
                                                     "splits it over 'data', which holds other examples"},
           std::tuple{"Dense_0/kernel", "None,expert", "'expert'"},
           std::tuple{"Dense_1/kernel", "None,model", "Dense_1"},
           std::tuple{"Dense_0/bias", "model", "Dense_0"}}) {
    c = config(pe::Mode::model_parallel, 2, 2);
    pe::LayoutMap layout;
    layout.add(pattern, pe::PartitionSpec::parse(spec));
    c.layout = layout;
    refused(c, text);
  }
  c = config(pe::Mode::ensemble, 2, 2, 2);
  pe::LayoutMap over_members;
  over_members.add("Dense_0/kernel", pe::PartitionSpec::parse("None,ensemble"));
  c.layout = over_members;
  refused(c, "which holds other members");
}

TEST_CASE("the recorded configuration names the mesh and, when weights are split, the layout") {
  pe::Trainer mp(config(pe::Mode::model_parallel, 1, 2), data().train, data().test);
  const pmap::io::Json j = mp.config().to_json();
  CHECK(j.at("mode") == "model-parallel");
  CHECK(j.at("mesh") == "1x2");
  REQUIRE(j.at("layout").size() == 3);
  CHECK(j.at("layout")[0].at("pattern") == "Dense_0/kernel");
  CHECK(j.at("layout")[0].at("spec") == "(None, 'model')");
  pe::TrainConfig e = config(pe::Mode::ensemble, 0, 0, 2);
  e.devices = 2;
  pe::Trainer ens(e, data().train, data().test);
  CHECK(ens.config().to_json().at("mesh") == "2x1");
  CHECK(!ens.config().to_json().contains("layout"));
  CHECK(pe::parse_mode("model-parallel") == pe::Mode::model_parallel);
  CHECK(pe::to_string(pe::Mode::model_parallel) == "model-parallel");
  CHECK_THROWS_WITH_AS(pe::parse_mode("pipeline"), doctest::Contains("model-parallel"), pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
