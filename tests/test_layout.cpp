// Layouts for model parallelism (ensemble/layout.h): PartitionSpec text, LayoutMap's first full match,
// and the ShardingPlan's checks and block copies on the reference CNN.
#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/ensemble/layout.h>

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
LayoutMap megatron() {
  LayoutMap m;
  m.add("Dense_0/kernel", PartitionSpec::parse("None,model"));
  m.add("Dense_0/bias", PartitionSpec::parse("model"));
  m.add("Dense_1/kernel", PartitionSpec::parse("model,None"));
  return m;
}

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

TEST_CASE("layout: LayoutMap takes the first pattern that matches the whole name; others are replicated") {
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
