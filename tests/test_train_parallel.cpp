// Tensor parallelism on the Trainer (options.sharding, nn::TensorParallel): flax-cnn and keras-convnet with
// their Dense and Conv layers split over a "model" axis train as the unsplit models (up to the order of the
// sums), as an ensemble or data parallel on the mesh's first axis; clipping takes the unsplit norm; checkpoints
// hold whole tensors and resume under any layout; the layouts a model cannot run are refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/io/safetensors.h>
#include <pmapcc/kernels/eager/array_ops_optim.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/nn/parallel.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "cuda_testing.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace nn = pmap::nn;
namespace train = pmap::train;
using pmap::none;
using pmap::P;

namespace {

pmap::Mesh mesh_of(int first, int model, const char* axis = "ensemble") {
  return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, first * model), {{axis, first}, {"model", model}});
}

// Megatron's MLP pattern: Dense_0 column-parallel, Dense_1 row-parallel.
nn::Sharding megatron() {
  nn::Sharding s;
  s.params.set("Dense_0/kernel", P(none, "model"));
  s.params.set("Dense_0/bias", P("model"));
  s.params.set("Dense_1/kernel", P("model", none));
  return s;
}

struct Run {
  std::vector<double> losses;
  std::vector<float> params, state, opt;
  train::EpochReport epoch;
};

// One epoch (3 steps of options.batch_size) of `model` on `mesh` under `sharding`, then the whole tensors.
Run train_run(const train::Model& model, const train::Optimizer& opt, pmap::Mesh mesh, train::TrainerOptions o) {
  const train::Dataset examples = pmap::testing::synthetic_dataset(3 * o.batch_size, 12, 4);
  train::Trainer t(model, opt, std::move(mesh), std::move(o));
  Run r;
  r.epoch = t.run_epoch(examples, [&](const train::StepReport& s) { r.losses.push_back(s.loss); });
  r.params = pmap::testing::stacked(t.params(), t.model().param_names());
  r.state = pmap::testing::stacked(t.model_state(), t.model().state_names());
  for (const auto& [name, a] : t.optimizer_state())
    if (a.dtype() == pmap::DType::f32) {
      const auto v = a.to_vector<float>();
      r.opt.insert(r.opt.end(), v.begin(), v.end());
    }
  return r;
}

void check_close(const Run& split, const Run& whole, float tolerance) {
  REQUIRE(split.params.size() == whole.params.size());
  const float params = pmap::testing::max_abs_diff(split.params, whole.params);
  MESSAGE("max |difference| of the parameters from the unsplit model's: " << params);
  CHECK(params <= tolerance);
  CHECK(pmap::testing::max_abs_diff(split.state, whole.state) <= tolerance);
  REQUIRE(split.opt.size() == whole.opt.size());
  CHECK(pmap::testing::max_abs_diff(split.opt, whole.opt) <= tolerance);
  REQUIRE(split.losses.size() == whole.losses.size());
  for (std::size_t i = 0; i < whole.losses.size(); ++i)
    CHECK(split.losses[i] == doctest::Approx(whole.losses[i]).epsilon(1e-5));
  CHECK(split.epoch.train_accuracy == doctest::Approx(whole.epoch.train_accuracy).epsilon(0.02));
}

std::vector<std::byte> bytes_of(const pmap::Array& a) {
  const auto* p = static_cast<const std::byte*>(a.raw_data());
  return {p, p + a.nbytes()};
}

const train::Optimizer& momentum() {
  static const train::Optimizer o(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f});
  return o;
}

}  // namespace

TEST_CASE("tensor parallel: flax-cnn's layers split over 'model' train an ensemble as the unsplit model") {
  const train::Model cnn = train::flax_cnn({12, 12, 1});
  const Run whole = train_run(cnn, momentum(), pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "ensemble"),
                              {.members = 2, .batch_size = 32});
  // (2026-12-07: 6e-8 at most; 0.016 without the column-parallel layers' pvary.)
  nn::Sharding convs;  // Conv_0 column-parallel, Conv_1 row-parallel: ReLU and pooling keep the blocks between
  convs.params.set("Conv_0/kernel", P(none, none, none, "model"));
  convs.params.set("Conv_0/bias", P("model"));
  convs.params.set("Conv_1/kernel", P(none, none, "model", none));
  nn::Sharding gathered = megatron();  // Conv_1's features gathered before Flatten, Dense_0 then column-parallel
  gathered.params.set("Conv_1/kernel", P(none, none, none, "model"));
  gathered.params.set("Conv_1/bias", P("model"));
  nn::Sharding output = megatron();  // Dense_0's features gathered right after it: Dense_1 whole
  output.params.set("Dense_1/kernel", P());
  output.outputs.set("Dense_0/output", P(none, none));
  const std::vector<std::tuple<std::string, nn::Sharding, int, int>> cases = {
      {"megatron 1x2", megatron(), 1, 2},   {"megatron 2x2", megatron(), 2, 2}, {"unsplit 1x3", nn::Sharding{}, 1, 3},
      {"convs 1x2", convs, 1, 2},           {"gathered 2x2", gathered, 2, 2},   {"output layout 1x2", output, 1, 2},
      {"megatron 1x4", megatron(), 1, 4},   {"megatron 2x1 (no collective)", megatron(), 2, 1}};
  for (const auto& [name, sharding, first, model] : cases) {
    CAPTURE(name);
    const Run split = train_run(cnn, momentum(), mesh_of(first, model), {.members = 2, .batch_size = 32,
                                                                          .sharding = sharding});
    check_close(split, whole, 1e-6f);
  }
  // Both members of a device in one vmap (as on a GPU): the collectives' batching rules.
  for (const nn::Sharding* sharding : {&gathered, &convs}) {
    const Run split = train_run(cnn, momentum(), mesh_of(1, 2), {.members = 2, .batch_size = 32, .member_batch = 2,
                                                                 .sharding = *sharding});
    check_close(split, whole, 1e-6f);
  }
}

TEST_CASE("tensor parallel: keras-convnet ensemble members vmapped together, split over 'model', as unsplit") {
  // Dropout's masks on the whole features and BatchNorm on gathered ones, two members per vmap.
  const train::Model convnet = train::keras_convnet({12, 12, 1});
  const Run whole = train_run(convnet, momentum(), pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1),
                                                              "ensemble"),
                              {.members = 2, .batch_size = 32, .member_batch = 2});
  nn::Sharding conv = megatron();
  conv.params.set("Conv_1/kernel", P(none, none, none, "model"));
  const Run split = train_run(convnet, momentum(), mesh_of(1, 2), {.members = 2, .batch_size = 32, .member_batch = 2,
                                                                   .sharding = conv});
  check_close(split, whole, 1e-6f);
}

TEST_CASE("tensor parallel: keras-convnet data parallel over 'data' and split over 'model', clipped, as one device") {
  // BatchNorm over the global batch, Dropout's masks the unsplit model's, and the clipped norm of every block
  // (a chain: each member's momentum kept per member, split as its parameter).
  const train::Model convnet = train::keras_convnet({12, 12, 1});
  const train::Optimizer clipped(pmap::optim::chain(pmap::optim::clip_by_global_norm(0.05f),
                                                    pmap::optim::Sgd{.learning_rate = 0.5f, .momentum = 0.9f}));
  const train::Optimizer unclipped(pmap::optim::Sgd{.learning_rate = 0.5f, .momentum = 0.9f});
  {  // the clip is active: the unclipped run differs
    const Run a = train_run(convnet, clipped, pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "data"),
                            {.data_parallel = true, .batch_size = 32});
    const Run b = train_run(convnet, unclipped, pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "data"),
                            {.data_parallel = true, .batch_size = 32});
    CHECK(pmap::testing::max_abs_diff(a.params, b.params) > 1e-3f);
  }
  for (const train::Optimizer* opt : {&momentum(), &clipped}) {
    const Run whole = train_run(convnet, *opt, pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "data"),
                                {.data_parallel = true, .batch_size = 32});
    nn::Sharding conv = megatron();  // large_k column-parallel, gathered for its BatchNorm; Dense_0's output
    conv.params.set("large_k/kernel", P(none, none, none, "model"));  // kept split (the examples over 'data')
    conv.params.set("large_k/bias", P("model"));
    conv.outputs.set("Dense_0/output", P("data", "model"));
    for (const auto& [first, model, sharding] : {std::tuple{2, 2, megatron()}, std::tuple{1, 2, conv}}) {
      CAPTURE(first);
      CAPTURE(model);
      const Run split = train_run(convnet, *opt, mesh_of(first, model, "data"),
                                  {.data_parallel = true, .batch_size = 32, .sharding = sharding});
      check_close(split, whole, 1e-6f);
    }
  }
  // A batch that does not split evenly over 'data' (blocks of 16 and 15) would give the collectives over 'model'
  // two shapes: refused.
  CHECK_THROWS_WITH_AS(train_run(convnet, clipped, mesh_of(2, 2, "data"),
                                 {.data_parallel = true, .batch_size = 31, .sharding = megatron()}),
                       doctest::Contains("options.batch_size is 31; with options.sharding it must split evenly over "
                                         "the 2 devices of 'data'"),
                       pmap::ValueError);
}

TEST_CASE("tensor parallel on the CUDA kernels run on the host: split and clipped, as one device") {
  // The psum of a split clip meets the other devices on the host, so that step replays without a graph (a
  // captured step records no such collective): it runs eagerly, and trains as the unsplit model does.
  const train::Model cnn = train::flax_cnn({12, 12, 1});
  const train::Optimizer clipped(pmap::optim::chain(pmap::optim::clip_by_global_norm(0.05f),
                                                    pmap::optim::Sgd{.learning_rate = 0.5f, .momentum = 0.9f}));
  const pmap::kernels::Backend* host = &pmap::kernels::cuda_backend_on_host();
  const Run whole = train_run(cnn, clipped, pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "ensemble"),
                              {.members = 1, .batch_size = 32, .cpu_backend = host});
  const Run split = train_run(cnn, clipped, mesh_of(1, 2),
                              {.members = 1, .batch_size = 32, .cpu_backend = host, .sharding = megatron()});
  check_close(split, whole, 1e-6f);
}

TEST_CASE("tensor parallel: the split form of clip_factor and SplitLeaves refuse what does not fit") {
  const pmap::Array a = pmap::Array::from_host(std::vector<float>{3, 4}, {2});
  const pmap::Array b = pmap::Array::from_host(std::vector<float>{1}, {1});
  CHECK(pmap::ops::eager::clip_factor({&a, &b}, 1.0f, {{}, {}}).to_vector<float>() ==
        pmap::ops::eager::clip_factor({&a, &b}, 1.0f).to_vector<float>());
  CHECK_THROWS_WITH_AS(pmap::ops::eager::clip_factor({&a, &b}, 1.0f, {{}}),
                       "ops::clip_factor: 1 split axes for 2 arrays", pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::ops::eager::clip_factor({&a, &b}, 1.0f, {pmap::AxisNames("model"),
                                                                      pmap::AxisNames("data")}),
                       doctest::Contains("the split ones must share their axes"), pmap::ValueError);
  const pmap::optim::SplitLeaves scope({pmap::AxisNames("model")});
  CHECK(pmap::optim::SplitLeaves::current() != nullptr);
  const auto clip = pmap::optim::clip_by_global_norm(1.0f);
  pmap::optim::EmptyState state;
  CHECK_THROWS_WITH_AS(clip.update_leaves({&a, &b}, state, {&a, &b}),
                       doctest::Contains("an optim::SplitLeaves scope gives 1 leaves' axes for 2 gradients"),
                       pmap::ValueError);
}

TEST_CASE("tensor parallel on GPUs: split over 'model', as the same run on CPU devices") {
  PMAPCC_REQUIRE_GPU();
  // keras-convnet data parallel on a 2x2 mesh, and a flax-cnn ensemble of 4 on 1x2 (each GPU's members in one
  // vmap, the GPUs' default); the same meshes of CPU devices. cuBLAS sums in its own order.
  const train::Model convnet = train::keras_convnet({12, 12, 1}), cnn = train::flax_cnn({12, 12, 1});
  auto mesh_on = [](pmap::DeviceKind kind, int first, int model, const char* axis) {
    return pmap::Mesh(pmap::local_devices(kind, first * model), {{axis, first}, {"model", model}});
  };
  const Run gpu_dp = train_run(convnet, momentum(), mesh_on(pmap::DeviceKind::cuda, 2, 2, "data"),
                               {.data_parallel = true, .batch_size = 32, .sharding = megatron()});
  const Run cpu_dp = train_run(convnet, momentum(), mesh_on(pmap::DeviceKind::cpu, 2, 2, "data"),
                               {.data_parallel = true, .batch_size = 32, .sharding = megatron()});
  check_close(gpu_dp, cpu_dp, 1e-5f);
  const Run gpu_ens = train_run(cnn, momentum(), mesh_on(pmap::DeviceKind::cuda, 1, 2, "ensemble"),
                                {.members = 4, .batch_size = 32, .sharding = megatron()});
  const Run cpu_ens = train_run(cnn, momentum(), mesh_on(pmap::DeviceKind::cpu, 1, 2, "ensemble"),
                                {.members = 4, .batch_size = 32, .sharding = megatron()});
  check_close(gpu_ens, cpu_ens, 1e-5f);
}

TEST_CASE("tensor parallel: checkpoints hold whole tensors, and resume split, unsplit or split another way") {
  const train::Model cnn = train::flax_cnn({12, 12, 1});
  const train::Dataset examples = pmap::testing::synthetic_dataset(96, 12, 4);
  const auto dir = pmap::testing::scratch_dir("pmapcc_tensor_parallel_ckpt");
  const auto file = dir / "split.safetensors";
  const train::TrainerOptions base{.members = 2, .batch_size = 32};
  train::TrainerOptions split_options = base;
  split_options.sharding = megatron();
  train::Trainer split(cnn, momentum(), mesh_of(1, 2), split_options);
  split.run_epoch(examples);
  split.save(file);
  // Straight on: the split run's second epoch. Resumed: unsplit on one device, and split over 'model' by columns
  // of Conv_0 on a 2x2 mesh.
  split.run_epoch(examples);
  const auto straight = pmap::testing::stacked(split.params(), cnn.param_names());
  train::Trainer whole(cnn, momentum(), pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "ensemble"), base);
  whole.load(file);
  train::TrainerOptions other_options = base;
  other_options.sharding.params.set("Conv_0/kernel", P(none, none, none, "model"));
  other_options.sharding.params.set("Conv_0/bias", P("model"));
  train::Trainer other(cnn, momentum(), mesh_of(2, 2), other_options);
  other.load(file);
  const auto saved = pmap::io::load_safetensors(file);
  for (train::Trainer* t : {&whole, &other}) {
    for (const auto& [name, a] : t->params()) {  // the file's tensors, bit for bit
      CAPTURE(name);
      CHECK(bytes_of(a) == saved.at("params/" + name).data);
    }
    for (const auto& [name, a] : t->optimizer_state())
      CHECK(bytes_of(a) == saved.at("opt/" + name).data);
    t->run_epoch(examples);
    CHECK(pmap::testing::max_abs_diff(pmap::testing::stacked(t->params(), cnn.param_names()), straight) <= 1e-5f);
  }
  // set_members: member 1 takes member 0's whole tensors; its blocks then are member 0's.
  const train::Variables p = split.params(), s = split.model_state();
  train::Variables copied;
  for (const auto& [name, a] : p) {
    auto v = a.to_vector<float>();
    const std::size_t half = v.size() / 2;
    std::copy(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(half), v.begin() + static_cast<std::ptrdiff_t>(half));
    copied.emplace(name, pmap::Array::from_host(v, a.shape()));
  }
  split.set_members(copied, s, {1});
  for (const auto& [name, a] : split.params()) CHECK(a.to_vector<float>() == copied.at(name).to_vector<float>());
  std::filesystem::remove_all(dir);
}

TEST_CASE("tensor parallel: a layout the mesh or the model cannot run is refused by name, at construction") {
  const train::Model cnn = train::flax_cnn({12, 12, 1});
  const train::Model convnet = train::keras_convnet({12, 12, 1});
  auto make = [&](const train::Model& m, pmap::Mesh mesh, nn::Sharding sharding) {
    train::TrainerOptions o{.members = 2, .batch_size = 32};
    o.sharding = std::move(sharding);
    train::Trainer t(m, momentum(), std::move(mesh), std::move(o));
  };
  auto with = [](std::initializer_list<std::pair<const char*, P>> params) {
    nn::Sharding s;
    for (const auto& [name, spec] : params) s.params.set(name, spec);
    return s;
  };
  CHECK_THROWS_WITH_AS(make(cnn, pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "ensemble"), megatron()),
                       doctest::Contains("options.sharding splits parameters, but the mesh"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), with({{"Dense_0/kernel", P(none, "ensemble")}})),
                       doctest::Contains("options.sharding.params 'Dense_0/kernel' is P(None, 'ensemble'): the mesh's "
                                         "first axis 'ensemble'"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), with({{"Dense_0/kernel", P(none, "tensor")}})),
                       doctest::Contains("has no axis 'tensor'"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), with({{"Dense_9/kernel", P(none, "model")}})),
                       doctest::Contains("the layout names 'Dense_9/kernel', which is not a parameter of model "
                                         "'flax-cnn'"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 3), with({{"Dense_1/kernel", P(none, "model")}})),
                       doctest::Contains("dimension 1 (10) does not split over the 3 devices"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), with({{"Dense_1/kernel", P("model", none)}})),
                       doctest::Contains("its input arrives whole: a row-parallel layer must follow a column-parallel"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), with({{"Dense_0/kernel", P(none, "model")}})),
                       doctest::Contains("layout of Dense_0/bias: P(): a bias follows its kernel's output features: "
                                         "it must be P('model')"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 3), with({{"Conv_0/kernel", P("model", none, none, none)}})),
                       doctest::Contains("only the input (2) and output (3) dimensions of a kernel can be split"),
                       pmap::ValueError);
  {  // both feature dimensions split (over two axes: the Trainer's meshes have one for parameters)
    nn::Sharding both;
    both.params.set("D/kernel", P("x", "y"));
    const pmap::Mesh xy(pmap::local_devices(pmap::DeviceKind::cpu, 4), {{"x", 2}, {"y", 2}});
    CHECK_THROWS_WITH_AS(pmap::pmap([&](int) {
      const nn::DenseParams p{pmap::Array(pmap::Shape{2, 2}, pmap::DType::f32, pmap::current_device()),
                              pmap::Array(pmap::Shape{2}, pmap::DType::f32, pmap::current_device())};
      const pmap::Array x(pmap::Shape{1, 2}, pmap::DType::f32, pmap::current_device());
      (void)nn::TensorParallel(&both).dense(nn::Dense{.features = 2}, p, "D", nn::features(x));
      return 0;
    }, xy)(0), doctest::Contains("splits both its input and its output features"), pmap::ValueError);
  }
  CHECK_THROWS_WITH_AS(make(convnet, mesh_of(1, 2), with({{"BatchNorm_1/beta", P("model")}})),
                       doctest::Contains("layout of BatchNorm_1/beta: P('model'): BatchNormalization's weights cannot "
                                         "be split"),
                       pmap::ValueError);
  nn::Sharding kept = megatron();  // Dense_1 whole after features kept split
  kept.params.set("Dense_1/kernel", P());
  kept.outputs.set("Dense_0/output", P(none, "model"));
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), kept),
                       doctest::Contains("layout of Dense_0/output keeps its features split over P('model'), but "
                                         "Dense_1"),
                       pmap::ValueError);
  nn::Sharding bad_output = megatron();
  bad_output.outputs.set("Dense_0", P(none, none));
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), bad_output),
                       doctest::Contains("an output layout is '<layer>/output'"), pmap::ValueError);
  nn::Sharding wrong_output = megatron();
  wrong_output.outputs.set("Dense_1/output", P(none, "model"));
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), wrong_output),
                       doctest::Contains("splits the features over P('model'), but Dense_1/kernel is P('model', None): "
                                         "its outputs come out whole"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2),
                                            {{"ensemble", 1}, {"model", 2}, {"pipe", 1}}), megatron()),
                       doctest::Contains("has 3 axes"), pmap::ValueError);
  nn::Sharding twice = megatron();
  twice.params.set("Dense_1/kernel", P("model", "model"));
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), twice), doctest::Contains("axis 'model' is named twice"),
                       pmap::ValueError);
  nn::Sharding examples = megatron();  // an ensemble's examples are not split
  examples.outputs.set("Dense_0/output", P("ensemble", "model"));
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), examples),
                       doctest::Contains("the examples are split over the batch's axis (data parallel) or not at all"),
                       pmap::ValueError);
  nn::Sharding image = megatron();  // an image's rows are not split
  image.outputs.set("Conv_0/output", P(none, "model"));
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(1, 2), image),
                       doctest::Contains("only the first (the examples) and the last (the features) dimension"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make(cnn, mesh_of(3, 1), {}), doctest::Contains("options.members is 2; it must be a positive "
                                                                         "multiple of the mesh's 3 devices along "
                                                                         "'ensemble'"),
                       pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
