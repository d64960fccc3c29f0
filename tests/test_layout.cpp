// The program's --layout (examples/mnist_ensemble/config.h): PartitionSpec's text (read and printed as Keras and
// JAX print layouts, and its errors), LayoutMap's first full match, and the rules recipe_sharding refuses because
// they give no weight its layout. What a layout splits and the errors of the weights and the mesh are
// tests/test_program_recipe.cpp's; the split layers are tests/test_train_parallel.cpp's.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include <pmap/error.h>
#include <pmap/mesh.h>
#include <pmapcc/train/model.h>

#include "examples/mnist_ensemble/config.h"
#include "examples/mnist_ensemble/recipe.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

using pmap::ensemble::LayoutMap;
using pmap::ensemble::PartitionSpec;

namespace {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const pmap::Error& e) {
    return e.what();
  }
  return "(no error)";
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

TEST_CASE("layout: a --layout rule that gives no weight its layout is refused, a default rule may match nothing") {
  // --mode model-parallel on a 1x2 mesh; the layout of only the rules given (`must_match`: the user's --layout).
  // A user's rule that matches nothing, or whose weights an earlier rule takes, would be a silent no-op
  // (keras-hub#2827): refused, naming it and the model's weights. A default rule may match nothing in a model it
  // was not made for, and a rule for a layer's output gives that output its layout.
  const pmap::train::Model model = pmap::train::flax_cnn({12, 12, 1});
  auto rule_error = [&](std::vector<const char*> patterns, bool must_match) {
    pmap::ensemble::TrainConfig c;
    c.mode = pmap::ensemble::Mode::model_parallel;
    LayoutMap m;
    for (const char* p : patterns) m.add(p, PartitionSpec::parse("None,model"), must_match);
    c.layout = m;
    return error_of([&] { (void)pmap::ensemble::recipe_sharding(c, model, {{"data", 1}, {"model", 2}}); });
  };
  CHECK(rule_error({"Dense_9/kernel"}, true) ==
        "layout rule 'Dense_9/kernel=(None, 'model')' gives no weight of model 'flax-cnn' its layout: it matches "
        "none, or an earlier rule takes them (its weights: Conv_0/kernel, Conv_0/bias, Conv_1/kernel, Conv_1/bias, "
        "Dense_0/kernel, Dense_0/bias, Dense_1/kernel, Dense_1/bias; a layer's output is '<layer>/output')");
  CHECK(rule_error({"Dense_.*/kernel", "Dense_0/kernel"}, true).rfind("layout rule 'Dense_0/kernel=", 0) == 0);
  CHECK(rule_error({"Dense_9/kernel"}, false) == "(no error)");
  CHECK(rule_error({"Dense_1/output"}, true) == "(no error)");
  CHECK(rule_error({"Dense_.*/kernel"}, true) == "(no error)");
}

}  // namespace PMAPCC_TEST_FILE
