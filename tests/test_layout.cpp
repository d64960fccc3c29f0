// Layouts for model parallelism (ensemble/layout.h): PartitionSpec text, LayoutMap's first full match,
// the ShardingPlan's checks and block copies on the reference CNN, the layouts the layers can run, and the
// split layers' forward and backward (ModelRunner with a RunnerSplit) against one device.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <pmap/error.h>
#include <pmap/pmap.h>

#include <pmapcc/ensemble/layout.h>
#include <pmapcc/ensemble/runner.h>
#include <pmapcc/kernels/backend.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

using pmap::ensemble::LayoutMap;
using pmap::ensemble::PartitionSpec;
using pmap::ensemble::ShardingPlan;

namespace {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const pmap::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The Keras example's layout in pmapcc terms: the big Dense column-parallel, the last one row-parallel.
LayoutMap megatron() { return pmap::ensemble::reference_cnn_layout(); }

}  // namespace

TEST_CASE("layout: PartitionSpec reads and prints Keras/JAX-style layouts") {
  using S = PartitionSpec;
  CHECK(S::parse("None,model").dims == std::vector<std::optional<std::string>>{std::nullopt, "model"});
  CHECK(S::parse("(None, 'model')") == S::parse("none,model"));
  CHECK(S::parse("('model',)") == S::parse("model"));
  CHECK(S::parse(" ( ) ").replicated());
  CHECK(S::parse("None,None").replicated());
  CHECK_FALSE(S::parse("data,None").replicated());
  CHECK(S::parse("None,model").str() == "(None, 'model')");
  CHECK(S::parse("model").str() == "('model',)");
  CHECK(S{}.str() == "()");
  for (const char* text : {"None,model", "('model',)", "data,model", "()"})
    CHECK(S::parse(S::parse(text).str()) == S::parse(text));
  CHECK(error_of([] { (void)S::parse("model,,None"); }) ==
        "layout 'model,,None': an empty entry (expected e.g. None,model or ('model',))");
  CHECK(error_of([] { (void)S::parse("(model"); }).find("unbalanced parentheses") != std::string::npos);
  CHECK(error_of([] { (void)S::parse("mo del"); }).find("'mo del' is neither an axis name nor None") !=
        std::string::npos);
}

TEST_CASE("layout: LayoutMap takes the first pattern that matches the whole name, others are replicated") {
  LayoutMap m;
  m.add("Dense_.*/kernel", PartitionSpec::parse("None,model"));
  m.add("Dense_0/kernel", PartitionSpec::parse("model,None"));  // shadowed by the first
  m.add("Dense", PartitionSpec::parse("model"));                // never a whole name
  std::optional<std::size_t> from;
  CHECK(m.layout_of("Dense_0/kernel", &from) == PartitionSpec::parse("None,model"));
  CHECK(from == 0u);
  CHECK(m.layout_of("Dense_1/kernel") == PartitionSpec::parse("None,model"));
  CHECK(m.layout_of("Dense_0/bias", &from).replicated());
  CHECK_FALSE(from.has_value());
  CHECK(m.layout_of("xDense_0/kernel").replicated());
  CHECK(error_of([&] { m.add("Dense_(0", {}); }).rfind("layout map: 'Dense_(0' is not a regular expression", 0) == 0);
  CHECK(m.entries().size() == 3);
}

TEST_CASE("layout: a plan of the reference CNN on a 2x4 mesh splits the dense weights 1/4 per device") {
  const auto model = pmap::ensemble::flax_mnist_cnn();
  const ShardingPlan plan(*model, megatron(), {{"data", 2}, {"model", 4}});
  CHECK(plan.full_params() == model->params_per_member());
  CHECK(plan.tensor("Dense_0/kernel").local_shape == pmap::ensemble::Dims{3136, 64});
  CHECK(plan.tensor("Dense_0/bias").local_shape == pmap::ensemble::Dims{64});
  CHECK(plan.tensor("Dense_1/kernel").local_shape == pmap::ensemble::Dims{64, 10});
  CHECK(plan.tensor("Dense_1/bias").local_shape == pmap::ensemble::Dims{10});
  CHECK(plan.tensor("Conv_0/kernel").spec == PartitionSpec::parse("None,None,None,None"));
  // Per device: the sharded weights at a quarter, the rest whole.
  std::int64_t sharded = 0, whole = 0;
  for (const auto& t : plan.tensors()) (t.spec.replicated() ? whole : sharded) += pmap::ensemble::product(t.shape);
  CHECK(plan.local_params() == whole + sharded / 4);
  CHECK(static_cast<double>(sharded) / static_cast<double>(plan.full_params()) > 0.97);
  CHECK(error_of([&] { (void)plan.tensor("dense1/kernel"); }).find("the model has no weight 'dense1/kernel'") == 0);
}

TEST_CASE("layout: shard then unshard over every model coordinate gives the weights back exactly") {
  const auto model = pmap::ensemble::flax_mnist_cnn();
  LayoutMap m = megatron();
  m.add("Conv_1/kernel", PartitionSpec::parse("None,None,None,model"));  // 4-D: output channels
  m.add("Conv_1/bias", PartitionSpec::parse("model"));
  m.add("Conv_0/kernel", PartitionSpec::parse("None,None,None,data"));   // a second axis
  const ShardingPlan plan(*model, m, {{"data", 2}, {"model", 4}});
  std::vector<float> full(static_cast<std::size_t>(plan.full_params()));
  std::iota(full.begin(), full.end(), 1.0f);  // every element distinct (exact below 2^24)
  std::vector<float> back(full.size(), 0.0f);
  std::vector<std::vector<float>> blocks;
  for (int d = 0; d < 2; ++d)
    for (int k = 0; k < 4; ++k) {
      std::vector<float> local(static_cast<std::size_t>(plan.local_params()), -1.0f);
      const int coords[2] = {d, k};
      plan.shard(full, coords, local);
      CHECK(std::find(local.begin(), local.end(), -1.0f) == local.end());
      plan.unshard(local, coords, back);
      blocks.push_back(std::move(local));
    }
  CHECK(back == full);
  // Device (d, k)'s block of Dense_0/kernel is columns [64k, 64k + 64) of the (3136, 256) matrix.
  const auto& t = plan.tensor("Dense_0/kernel");
  const std::int64_t base = model->tensors()[4].offset;
  REQUIRE(model->tensors()[4].name == "Dense_0/kernel");
  const auto& block = blocks[1 * 4 + 2];  // d = 1, k = 2
  for (std::int64_t row : {0, 1, 3135})
    for (std::int64_t col : {0, 63})
      CHECK(block[static_cast<std::size_t>(t.local_offset + row * 64 + col)] ==
            full[static_cast<std::size_t>(base + row * 256 + 128 + col)]);
  // A weight split over "model" only is the same on both data coordinates; Conv_0 differs.
  const auto& conv0 = plan.tensor("Conv_0/kernel");
  CHECK(std::equal(blocks[2].begin() + t.local_offset, blocks[2].begin() + t.local_offset + t.local_size,
                   blocks[4 + 2].begin() + t.local_offset));
  CHECK_FALSE(std::equal(blocks[2].begin() + conv0.local_offset,
                         blocks[2].begin() + conv0.local_offset + conv0.local_size,
                         blocks[4 + 2].begin() + conv0.local_offset));
}

TEST_CASE("layout: a layout the weight or the mesh cannot take is refused, naming weight, shape and layout") {
  const auto model = pmap::ensemble::flax_mnist_cnn();
  auto plan_error = [&](const char* pattern, const char* spec, std::vector<pmap::AxisSpec> axes) {
    LayoutMap m;
    m.add(pattern, PartitionSpec::parse(spec));
    return error_of([&] { ShardingPlan(*model, m, std::move(axes)); });
  };
  CHECK(plan_error("Dense_1/bias", "model", {{"data", 2}, {"model", 4}}) ==
        "layout of Dense_1/bias (shape (10,)): ('model',) (from pattern 'Dense_1/bias'): dimension 0 (10) is not "
        "divisible by the size of 'model' (4)");
  CHECK(plan_error("Dense_0/kernel", "None,tensor", {{"data", 2}, {"model", 4}}) ==
        "layout of Dense_0/kernel (shape (3136, 256)): (None, 'tensor') (from pattern 'Dense_0/kernel'): 'tensor' "
        "is not an axis of the mesh ('data', 'model')");
  CHECK(plan_error("Dense_0/kernel", "model,model", {{"model", 2}}).find("axis 'model' splits two dimensions") !=
        std::string::npos);
  CHECK(plan_error("Dense_.*", "None,None,model", {{"model", 2}}) ==
        "layout of Dense_0/kernel (shape (3136, 256)): (None, None, 'model') (from pattern 'Dense_.*'): has 3 "
        "entries for a 2-dimensional weight");
  // A user's rule that gives no weight (nor a layer's output) its layout is refused, naming it and the
  // weights there are (keras-hub#2827's silent no-op); a default rule may match nothing in a model it was not
  // made for.
  auto rule_error = [&](std::vector<const char*> patterns, bool must_match) {
    LayoutMap m;
    for (const char* p : patterns) m.add(p, PartitionSpec::parse("None,model"), must_match);
    return error_of([&] { ShardingPlan(*model, m, {{"model", 2}}); });
  };
  CHECK(rule_error({"Dense_9/kernel"}, true) ==
        "layout rule 'Dense_9/kernel=(None, 'model')' gives no weight of model 'flax-cnn' its layout: it matches "
        "none, or an earlier rule takes them (its weights: Conv_0/kernel, Conv_0/bias, Conv_1/kernel, Conv_1/bias, "
        "Dense_0/kernel, Dense_0/bias, Dense_1/kernel, Dense_1/bias; a layer's output is '<layer>/output')");
  CHECK(rule_error({"Dense_.*/kernel", "Dense_0/kernel"}, true).rfind("layout rule 'Dense_0/kernel=", 0) == 0);
  CHECK(rule_error({"Dense_9/kernel"}, false) == "(no error)");
  CHECK(rule_error({"Dense_1/output"}, true) == "(no error)");
  LayoutMap ok = megatron();
  const ShardingPlan plan(*model, ok, {{"model", 2}});
  std::vector<float> full(static_cast<std::size_t>(plan.full_params()));
  std::vector<float> local(static_cast<std::size_t>(plan.local_params()));
  const int bad[1] = {2}, two[2] = {0, 0};
  CHECK(error_of([&] { plan.shard(full, bad, local); }) ==
        "ShardingPlan::shard: coordinate 2 is outside axis 'model' of size 2");
  CHECK(error_of([&] { plan.shard(full, two, local); }) == "ShardingPlan::shard: 2 coordinates for a mesh of 1 axes");
  CHECK(error_of([&] { plan.unshard(full, bad, local); }).rfind("ShardingPlan::unshard: the whole model is", 0) == 0);
}

TEST_CASE("layout: the local model runs a device's blocks: Megatron's column- then row-parallel pattern") {
  using Kind = pmap::ensemble::LayerSplit::Kind;
  const auto model = pmap::ensemble::flax_mnist_cnn();
  const ShardingPlan plan(*model, megatron(), {{"data", 2}, {"model", 4}});
  const auto local = pmap::ensemble::local_model(*model, plan);
  CHECK(local.model->params_per_member() == plan.local_params());
  for (std::size_t k = 0; k < plan.tensors().size(); ++k) {
    CHECK(local.model->tensors()[k].name == plan.tensors()[k].name);
    CHECK(local.model->tensors()[k].shape == plan.tensors()[k].local_shape);
  }
  CHECK(local.model->output_shape() == model->output_shape());  // the logits come out whole
  // Layers: Conv_0 relu pool Conv_1 relu pool flatten Dense_0 relu Dense_1.
  REQUIRE(local.splits.size() == 10);
  CHECK(local.splits[7].kind == Kind::column);
  CHECK(local.splits[7].axis == 1);
  CHECK(local.splits[9].kind == Kind::row);
  CHECK(local.splits[0].kind == Kind::whole);
  CHECK(local.model->shapes()[9] == pmap::ensemble::Dims{64});  // Dense_1 reads its block of Dense_0's outputs

  // Convolutions the same way: Conv_0 on its output channels, Conv_1 on its input channels, through ReLU and
  // AvgPool; the dense layers whole.
  LayoutMap conv;
  conv.add("Conv_0/kernel", PartitionSpec::parse("None,None,None,model"));
  conv.add("Conv_0/bias", PartitionSpec::parse("model"));
  conv.add("Conv_1/kernel", PartitionSpec::parse("None,None,model,None"));
  const ShardingPlan conv_plan(*model, conv, {{"model", 2}});
  const auto conv_local = pmap::ensemble::local_model(*model, conv_plan);
  CHECK(conv_local.splits[0].kind == Kind::column);
  CHECK(conv_local.splits[3].kind == Kind::row);
  CHECK(conv_local.model->params_per_member() == conv_plan.local_params());
  // Nothing split: the model itself.
  const ShardingPlan whole(*model, LayoutMap{}, {{"model", 2}});
  CHECK(pmap::ensemble::local_model(*model, whole).model->params_per_member() == model->params_per_member());
}

TEST_CASE("runner: the model compiles into steps: fused ReLUs, split layers' blocks and their collectives") {
  using Step = pmap::ensemble::RunnerStep;
  using C = Step::Collective;
  // A step's fields in one line, to compare lists: layer, then r (fused ReLU), b (runs its block), f (bias on
  // the first device only), g (an all_gather in the layer's place), n (no input gradient), and the collective
  // after it with its axis.
  auto text = [](const std::vector<Step>& steps) {
    std::string out;
    for (const Step& s : steps) {
      out += (out.empty() ? "" : " ") + std::to_string(s.layer);
      if (s.fused_relu) out += "r";
      if (s.block) out += "b";
      if (s.bias_on_first) out += "f";
      if (s.gather) out += "g@" + std::to_string(s.axis);
      if (!s.input_grad) out += "n";
      if (s.after == C::psum_output) out += "+psum_out@" + std::to_string(s.axis);
      if (s.after == C::psum_input_grad) out += "+psum_dx@" + std::to_string(s.axis);
    }
    return out;
  };
  const auto& be = pmap::kernels::backend_for(pmap::DeviceKind::cpu);
  const pmap::Device cpu0 = pmap::local_devices(pmap::DeviceKind::cpu, 1)[0];
  // Layers: 0 Conv_0, 1 relu, 2 pool, 3 Conv_1, 4 relu, 5 pool, 6 flatten, 7 Dense_0, 8 relu, 9 Dense_1.
  // Forward: each conv/dense takes the ReLU after it. Backward: each pool runs through the ReLU before it;
  // Dense_0 has no ReLU fused backward (its ReLU comes after it), and Conv_0's input is the batch.
  const auto model = pmap::ensemble::flax_mnist_cnn();
  const pmap::ensemble::ModelRunner whole(*model, be, cpu0, 2, 8);
  CHECK(text(whole.forward_steps()) == "0r 2 3r 5 6 7r 9");
  CHECK(text(whole.backward_steps()) == "9 8 7 6 5r 3 2r 0n");
  // Megatron's pattern over "model" (axis 1 of data x model): Dense_0 column-parallel (its input gradient
  // psum-ed), Dense_1 row-parallel (no ReLU fused into a partial sum; its output psum-ed, the bias on the
  // first device only).
  const ShardingPlan plan(*model, megatron(), {{"data", 2}, {"model", 2}});
  const auto local = pmap::ensemble::local_model(*model, plan);
  const pmap::ensemble::ModelRunner split(*local.model, be, cpu0, 1, 8, 0,
                                          pmap::ensemble::RunnerSplit{local.splits, {"data", "model"}, "data"});
  CHECK(text(split.forward_steps()) == "0r 2 3r 5 6 7r 9f+psum_out@1");
  // The ReLU between them runs on its block of Dense_0's outputs.
  CHECK(text(split.backward_steps()) == "9 8b 7+psum_dx@1 6 5r 3 2r 0n");
  // Conv_0's outputs split and kept split through ReLU and pool into Conv_1 (row-parallel): Conv_1's ReLU
  // is not fused, its output psum-ed.
  LayoutMap conv;
  conv.add("Conv_0/kernel", PartitionSpec::parse("None,None,None,model"));
  conv.add("Conv_0/bias", PartitionSpec::parse("model"));
  conv.add("Conv_1/kernel", PartitionSpec::parse("None,None,model,None"));
  const ShardingPlan conv_plan(*model, conv, {{"model", 2}});
  const auto conv_local = pmap::ensemble::local_model(*model, conv_plan);
  const pmap::ensemble::ModelRunner conv_split(*conv_local.model, be, cpu0, 1, 8, 0,
                                               pmap::ensemble::RunnerSplit{conv_local.splits, {"model"}, ""});
  CHECK(text(conv_split.forward_steps()) == "0r 2b 3f+psum_out@0 4 5 6 7r 9");
  CHECK(text(conv_split.backward_steps()) == "9 8 7 6 5r 3 2r 0n");
  // Dense_0 column-parallel with its outputs gathered whole right after it (its output layout), Dense_1
  // whole: a gather layer (8) after Dense_0, which no longer fuses its ReLU (9). The gather is an all_gather
  // along the last axis; its backward takes its block, and Dense_0's input gradient is psum-ed.
  LayoutMap gathered;
  gathered.add("Dense_0/kernel", PartitionSpec::parse("None,model"));
  gathered.add("Dense_0/bias", PartitionSpec::parse("model"));
  gathered.add("Dense_0/output", PartitionSpec::parse("None,None"));
  const ShardingPlan gather_plan(*model, gathered, {{"model", 2}});
  const auto gather_local = pmap::ensemble::local_model(*model, gather_plan);
  const pmap::ensemble::ModelRunner gather_split(*gather_local.model, be, cpu0, 1, 8, 0,
                                                 pmap::ensemble::RunnerSplit{gather_local.splits, {"model"}, ""});
  CHECK(text(gather_split.forward_steps()) == "0r 2 3r 5 6 7 8bg@0 9 10");
  CHECK(text(gather_split.backward_steps()) == "10 9 8b 7+psum_dx@0 6 5r 3 2r 0n");
}

TEST_CASE("layout: layouts the layers cannot run are refused, naming the weight, its shape and its layout") {
  const auto model = pmap::ensemble::flax_mnist_cnn();
  auto error = [&](std::vector<std::pair<const char*, const char*>> entries) {
    LayoutMap m;
    for (const auto& [pattern, spec] : entries) m.add(pattern, PartitionSpec::parse(spec));
    return error_of([&] {
      const ShardingPlan plan(*model, m, {{"data", 2}, {"model", 2}});
      (void)pmap::ensemble::local_model(*model, plan);
    });
  };
  CHECK(error({{"Dense_1/kernel", "model,None"}}) ==
        "layout of Dense_1/kernel (shape (256, 10)): ('model', None): splits its input features over 'model', but "
        "its input arrives whole: a row-parallel layer must follow a column-parallel one");
  // Split features that an output layout keeps split, where a layer or the loss needs them whole.
  CHECK(error({{"Dense_0/kernel", "None,model"}, {"Dense_0/bias", "model"}, {"Dense_0/output", "data,model"}}) ==
        "layout of Dense_0/output keeps its features split over 'model', but Dense_1/kernel (shape (256, 10)), whole "
        "input needs them whole");
  CHECK(error({{"Dense_0/kernel", "None,model"}, {"Dense_1/kernel", "model,None"}}) ==
        "layout of Dense_0/bias (shape (256,)): (None,): a bias follows its kernel's output features: it must be "
        "('model',) as Dense_0/kernel is (None, 'model')");
  CHECK(error({{"Dense_0/kernel", "None,model"}, {"Dense_0/bias", "model"}, {"Dense_1/kernel", "model,None"},
               {"Dense_1/bias", "model"}}) ==
        "layout of Dense_1/bias (shape (10,)): ('model',): a bias follows its kernel's output features: it must be "
        "whole, () as Dense_1/kernel is ('model', None)");
  CHECK(error({{"Dense_1/kernel", "None,model"}, {"Dense_1/bias", "model"}, {"Dense_1/output", "None,model"}}) ==
        "layout of Dense_1/output keeps its features split over 'model', but the loss (the logits) needs them whole");
  CHECK(error({{"Conv_1/kernel", "None,None,None,model"}, {"Conv_1/bias", "model"},
               {"Conv_1/output", "None,None,None,model"}}) ==
        "layout of Conv_1/output keeps its features split over 'model', but layer 6 (flatten) needs them whole");
  // Output layouts the layers cannot give.
  CHECK(error({{"Dense_0/output", "None,model"}}) ==
        "layout of Dense_0/output: splits the features over 'model', but Dense_0/kernel is (None, None): its outputs "
        "come out whole");
  CHECK(error({{"Dense_0/kernel", "None,model"}, {"Dense_0/bias", "model"}, {"Dense_0/output", "model,None"}}) ==
        "layout of Dense_0/output (shape (batch, 256)): ('model', None) (from pattern 'Dense_0/output'): the batch "
        "dimension is split over 'data' or not at all, not over 'model'");
  CHECK(error({{"Dense_0/output", "None,None,None"}}).find("has 3 entries for a 2-dimensional output") !=
        std::string::npos);
  CHECK(error({{"Conv_0/output", "None,model,None,None"}}).find("only the last (feature) dimension of an output") !=
        std::string::npos);
  CHECK(error({{"Dense_0/output", "None,expert"}}).find("the mesh has no axis 'expert'") != std::string::npos);
  LayoutMap spatial;
  spatial.add("Conv_0/kernel", PartitionSpec::parse("model,None,None,None"));  // (3, 3, 1, 32) over 3 devices
  CHECK(error_of([&] { (void)pmap::ensemble::local_model(*model, ShardingPlan(*model, spatial, {{"model", 3}})); }) ==
        "layout of Conv_0/kernel (shape (3, 3, 1, 32)): ('model', None, None, None): only the input (2) and output "
        "(3) dimensions of a kernel can be split, not dimension 0");
  CHECK(error({{"Dense_0/kernel", "data,model"}}).find("splits both its input and its output features") !=
        std::string::npos);
  // A plan of another model (same names, other shapes), and a split that does not fit the runner's model.
  const auto small = pmap::ensemble::flax_mnist_cnn({12, 12, 1}, 10);
  const ShardingPlan other(*small, megatron(), {{"model", 2}});
  CHECK(error_of([&] { (void)pmap::ensemble::local_model(*model, other); }) ==
        "local_model: the plan was made for another model");
  const auto& be = pmap::kernels::backend_for(pmap::DeviceKind::cpu);
  CHECK(error_of([&] {
          pmap::ensemble::ModelRunner(*model, be, pmap::Device{}, 1, 4, 0,
                                      pmap::ensemble::RunnerSplit{{pmap::ensemble::LayerSplit{}}, {"model"}, ""});
        }) == "ModelRunner: the split has 1 layers, the model 10");
  CHECK(error_of([] { (void)pmap::ensemble::relu()->with_features(3); }) == "relu: has no output features to split");
}

namespace {

// Logits and full-model gradients of one member on one device, for x and dlogits.
struct Pass {
  std::vector<float> logits, grads;
  std::uint64_t collectives = 0;  // entered by the device in one forward and backward
};

Pass one_device(const pmap::ensemble::Sequential& model, const std::vector<float>& params, const std::vector<float>& x,
                const std::vector<float>& dlogits, int batch) {
  const auto& be = pmap::kernels::backend_for(pmap::DeviceKind::cpu);
  pmap::ensemble::ModelRunner runner(model, be, pmap::Device{}, 1, batch);
  const float* l = runner.forward(x.data(), batch, params.data());
  Pass out{std::vector<float>(l, l + batch * 10), std::vector<float>(params.size()), 0};
  runner.backward(x.data(), params.data(), dlogits.data(), out.grads.data());
  return out;
}

// The same member split over a 1-D mesh of `devices` CPU devices under `layouts`: every device's logits, and
// the gradients put back together from the devices' blocks (and, for the whole weights, device 0's).
std::vector<Pass> split_run(const pmap::ensemble::Sequential& model, const LayoutMap& layouts, int devices,
                            const std::vector<float>& params, const std::vector<float>& x,
                            const std::vector<float>& dlogits, int batch) {
  const ShardingPlan plan(model, layouts, {{"model", devices}});
  const auto local = pmap::ensemble::local_model(model, plan);
  const pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "model");
  const auto& be = pmap::kernels::backend_for(pmap::DeviceKind::cpu);
  std::vector<std::vector<float>> block(static_cast<std::size_t>(devices)), grads(block.size());
  std::vector<std::unique_ptr<pmap::ensemble::ModelRunner>> runners;
  for (int d = 0; d < devices; ++d) {
    block[static_cast<std::size_t>(d)].resize(static_cast<std::size_t>(plan.local_params()));
    grads[static_cast<std::size_t>(d)].resize(block[0].size());
    const int coords[1] = {d};
    plan.shard(params, coords, block[static_cast<std::size_t>(d)]);
    pmap::ensemble::RunnerSplit split{local.splits, {"model"}, ""};
    runners.push_back(std::make_unique<pmap::ensemble::ModelRunner>(*local.model, be, mesh.local_devices()[d], 1,
                                                                     batch, 0, std::move(split)));
  }
  std::vector<std::uint64_t> collectives(block.size());
  auto logits = pmap::pmap([&] {
    const auto d = static_cast<std::size_t>(pmap::axis_index("model"));
    const float* l = runners[d]->forward(x.data(), batch, block[d].data());
    std::vector<float> out(l, l + batch * 10);
    runners[d]->backward(x.data(), block[d].data(), dlogits.data(), grads[d].data());
    collectives[d] = pmap::collectives_entered();
    return out;
  }, mesh)();
  std::vector<Pass> out;
  for (int d = 0; d < devices; ++d) {
    std::vector<float> full(params.size(), 0.0f);
    for (int e = devices; e-- > 0;) {  // device 0 last: its whole weights' gradients stay
      const int coords[1] = {e};
      plan.unshard(grads[static_cast<std::size_t>(e)], coords, full);
    }
    out.push_back({std::move(logits[static_cast<std::size_t>(d)]), std::move(full),
                   collectives[static_cast<std::size_t>(d)]});
  }
  return out;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST_CASE("layout: column- then row-parallel layers over 2 and 4 devices compute what one device does") {
  const auto model = pmap::ensemble::flax_mnist_cnn({12, 12, 1}, 10);
  const int batch = 6;
  std::vector<float> params(static_cast<std::size_t>(model->params_per_member()));
  const std::vector<pmap::Key> keys{pmap::key(11)};
  model->init(keys, params);
  for (const auto& t : model->tensors())  // biases start at zero: make them count
    if (t.is_bias)
      pmap::normal(pmap::key(14 + static_cast<std::uint32_t>(t.offset)),
                   std::span<float>(params.data() + t.offset, static_cast<std::size_t>(t.size)));
  std::vector<float> x(static_cast<std::size_t>(batch * 144)), dlogits(static_cast<std::size_t>(batch * 10));
  pmap::uniform(pmap::key(12), x);
  pmap::normal(pmap::key(13), dlogits);
  const Pass ref = one_device(*model, params, x, dlogits, batch);
  LayoutMap conv = megatron();  // and the convolutions split too
  conv.add("Conv_0/kernel", PartitionSpec::parse("None,None,None,model"));
  conv.add("Conv_0/bias", PartitionSpec::parse("model"));
  conv.add("Conv_1/kernel", PartitionSpec::parse("None,None,model,None"));
  const LayoutMap dense = megatron(), none;
  // Gathered features: Dense_0 column-parallel with Dense_1 whole (gathered after the ReLU, where Dense_1
  // needs them, or right after Dense_0 by its output layout); Conv_1 column-parallel, gathered for Flatten.
  LayoutMap gather_late, gather_early, gather_conv;
  for (LayoutMap* m : {&gather_late, &gather_early}) {
    m->add("Dense_0/kernel", PartitionSpec::parse("None,model"));
    m->add("Dense_0/bias", PartitionSpec::parse("model"));
  }
  gather_early.add("Dense_0/output", PartitionSpec::parse("('data', None)"));
  LayoutMap keras = megatron();  // the Keras example's d2/output: whole already (Dense_1 row-parallel)
  keras.add("Dense_1/output", PartitionSpec::parse("data,None"));
  gather_conv.add("Conv_1/kernel", PartitionSpec::parse("None,None,None,model"));
  gather_conv.add("Conv_1/bias", PartitionSpec::parse("model"));
  // The collectives each layout needs, and no more: dense, a psum after Dense_1's forward and one after
  // Dense_0's backward; conv adds Conv_1's forward psum (Conv_0, the first layer, has no input gradient);
  // a gather is one psum in the forward, and the column-parallel layer's backward one more.
  const std::pair<const LayoutMap*, std::uint64_t> cases[] = {
      {&dense, 2}, {&conv, 3}, {&none, 0}, {&keras, 2}, {&gather_late, 2}, {&gather_early, 2}, {&gather_conv, 2}};
  for (const auto& [layouts, collectives] : cases)
    for (int devices : {2, 4}) {
      CAPTURE(devices);
      CAPTURE(collectives);
      const auto runs = split_run(*model, *layouts, devices, params, x, dlogits, batch);
      for (const Pass& r : runs) {
        CHECK(r.logits == runs[0].logits);  // the psum gives every device the same bits
        CHECK(max_diff(r.logits, ref.logits) <= 1e-5f * max_abs(ref.logits));
        CHECK(r.collectives == collectives);
      }
      CHECK(max_diff(runs[0].grads, ref.grads) <= 1e-5f * max_abs(ref.grads));
    }
}

}  // namespace PMAPCC_TEST_FILE
