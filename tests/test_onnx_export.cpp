// The ONNX exporter (export/onnx) at the level of the file: what it writes from the traced program, read back
// with the ONNX protobuf classes and checked by libonnx's checker, and what it refuses. That the numbers are
// right is checked in ONNX Runtime (tests/onnx/run_onnx_tests.sh): the program's models against pmapcc's
// predictions, and this file's "zoo" (every primitive with an emitter) against pmapcc's logits, which this file
// writes where PMAPCC_ONNX_ZOO_DIR says.
#ifdef PMAPCC_HAVE_ONNX
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <pmap/error.h>
#include <pmap/pmap.h>
#include <pmap/random.h>

#include <pmapcc/core/ops.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/export/onnx/export.h>
#include <pmapcc/io/json.h>
#include <pmapcc/nn/layer_norm.h>
#include <pmapcc/train/model.h>

#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace ops = pmap::ops;
namespace px = pmap::onnx;
using pmap::Array;
using pmap::train::Variables;

namespace {

Array uniform_array(std::uint32_t seed, pmap::Shape shape, float lo = -1.0f, float hi = 1.0f) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<std::size_t>(n));
  pmap::uniform(pmap::key(seed), v, lo, hi);
  return Array::from_host(v, std::move(shape));
}

onnx::ModelProto load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  onnx::ModelProto m;
  REQUIRE(m.ParseFromIstream(&in));
  onnx::checker::check_model(m);  // throws onnx::checker::ValidationError
  return m;
}

const onnx::TensorProto& initializer(const onnx::ModelProto& m, const std::string& name) {
  for (const auto& t : m.graph().initializer())
    if (t.name() == name) return t;
  FAIL("no initializer " << name);
  throw 0;
}

std::vector<float> values(const onnx::TensorProto& t) {
  std::vector<float> v(t.raw_data().size() / sizeof(float));
  std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  return v;
}

// Member m of `model` as the exporter takes it: "params/..." and "state/..." (the moving statistics moved off
// 0 and 1, so they show).
Variables member(const pmap::train::Model& model, std::uint32_t m) {
  auto [params, state] = model.init(pmap::fold_in(pmap::key(7), m));
  Variables out;
  for (auto& [name, t] : params) out.emplace("params/" + name, std::move(t));
  std::uint32_t seed = 100 * m;
  for (auto& [name, t] : state)
    out.emplace("state/" + name, ops::add(t, uniform_array(++seed, t.shape(), 0.01f, 0.1f)));
  return out;
}

// Every primitive with an emitter, on images (N, 6, 6, 2): logits (N, 10).
Array zoo(const Variables& v, const Array& images) {
  auto at = [&](const char* name) -> const Array& { return v.at(name); };
  const std::int64_t n = images.dim(0);
  const Array c1 = ops::conv2d(images, at("conv1/kernel"), at("conv1/bias"), {.same = true, .relu = true});
  const auto bn = ops::batch_norm(c1, at("bn/gamma"), at("bn/beta"), at("bn/mean"), at("bn/variance"),
                                  {.train = false, .relu = true});
  const Array bn2 = ops::batch_norm(c1, Array(), at("bn/beta"), at("bn/mean"), at("bn/variance"), {.train = false}).y;
  const Array pooled = ops::max_pool(ops::add(bn.y, bn2), {.window_h = 3, .window_w = 3, .stride_h = 2, .stride_w = 2,
                                                           .same = true});  // (N, 3, 3, 4)
  const Array c2 = ops::conv2d(pooled, at("conv2/kernel"), Array(), {.same = true});                   // (N, 3, 3, 3)
  const Array c3 = ops::conv2d(c1, at("conv3/kernel"), Array(), {.stride_h = 2, .stride_w = 2, .same = false});
  const Array avg = ops::avg_pool(c2, 2, 2, 1, 1);                                                  // (N, 2, 2, 3)
  const Array flat = ops::reshape(ops::transpose(avg, {0, 3, 1, 2}), {n, 12});
  const Array part = ops::slice(flat, {0, 2}, {n, 10});                                                // (N, 8)
  const Array grown = ops::exp(ops::scale(part, 0.5f, -0.25f));
  const Array joined = ops::concatenate({&part, &grown}, 1);                                           // (N, 16)
  const Array one = ops::scale(ops::abs(joined), 1.0f, 1.0f);
  Array h = ops::add(ops::tanh(joined), ops::sigmoid(ops::negative(joined)));
  h = ops::add(h, ops::divide(ops::square(joined), one));
  h = ops::subtract(h, ops::multiply(ops::sqrt(one), ops::log(one)));
  h = ops::add(ops::maximum(h, joined), ops::minimum(h, ops::relu(joined)));
  h = ops::subtract(h, ops::broadcast_to(ops::mean(h, {1}, true), {n, 16}));
  h = ops::add(h, ops::scale(ops::broadcast_to(ops::max(h, {-1}, true), {n, 16}), 0.1f));
  h = ops::subtract(h, ops::mean_rows(h));                       // over the examples
  h = ops::add(h, ops::scale(ops::sum_rows(joined), 0.01f));
  h = ops::gelu(ops::stop_gradient(ops::sum(h, {})));  // a sum over no axis is a copy
  const Array gap = ops::global_avg_pool(c2);                      // (N, 3)
  const Array corners = ops::reshape(ops::sum(c3, {1, 2}), {n, 2});  // (N, 2)
  const Array side = ops::concatenate({&gap, &corners}, 1);       // (N, 5)
  Array logits = ops::add(ops::matmul(h, at("w")), ops::matmul(h, at("w_t"), false, true));
  logits = ops::add(logits, ops::linear(h, at("dense/kernel"), at("dense/bias"), true));
  logits = ops::add(logits, ops::linear(side, at("side/kernel"), at("side/bias")));
  logits = ops::add(logits, ops::scale(ops::softmax(logits), 2.0f));
  logits = ops::add(logits, ops::log_softmax(logits));
  // One element of the whole batch, by a one-element (1,) constant: the product keeps the scalar's shape.
  const Array small = Array::from_host(std::vector<float>{0.001f}, {1});
  return ops::add(logits, ops::multiply(ops::mean(ops::sum(c3)), small));
}

// A residual network (the resnet_ensemble example's kind, smaller) on images (N, 8, 8, 2): a stem, a block that
// adds its input to two convolutions, a block whose skip is a strided 1x1 projection, global average pooling and
// a Dense layer: logits (N, 10).
Array resnet(const Variables& v, const Array& x) {
  auto conv = [&](const Array& in, const std::string& name, int stride, bool relu) {
    return ops::conv2d(in, v.at(name + "/kernel"), v.at(name + "/bias"),
                       {.stride_h = stride, .stride_w = stride, .same = true, .relu = relu});
  };
  const Array stem = conv(x, "stem", 1, true);                                      // (N, 8, 8, 4)
  const Array b1 = ops::relu(ops::add(conv(conv(stem, "block1_a", 1, true), "block1_b", 1, false), stem));
  const Array skip = conv(b1, "project", 2, false);                                 // (N, 4, 4, 8)
  const Array b2 = ops::relu(ops::add(conv(conv(b1, "block2_a", 2, true), "block2_b", 1, false), skip));
  return ops::linear(ops::global_avg_pool(b2), v.at("head/kernel"), v.at("head/bias"));
}

// A layer a user adds, nn::LayerNorm (of ops alone, with no emitter of its own), between two Dense layers, on
// images (N, 6, 6, 2): logits (N, 10).
Array normed(const Variables& v, const Array& x) {
  const Array h = ops::linear(ops::reshape(x, {x.dim(0), 72}), v.at("in/kernel"), v.at("in/bias"), true);  // (N, 16)
  const pmap::nn::LayerNorm norm{.epsilon = 1e-3f};
  return ops::linear(norm({v.at("norm/scale").copy(), v.at("norm/bias").copy()}, h), v.at("out/kernel"),
                     v.at("out/bias"));
}

Variables normed_variables() {
  Variables v;
  v.emplace("in/kernel", uniform_array(300, {72, 16}, -0.3f, 0.3f));
  v.emplace("in/bias", uniform_array(301, {16}, -0.1f, 0.1f));
  v.emplace("norm/scale", uniform_array(302, {16}, 0.5f, 1.5f));
  v.emplace("norm/bias", uniform_array(303, {16}, -0.5f, 0.5f));
  v.emplace("out/kernel", uniform_array(304, {16, 10}, -0.5f, 0.5f));
  v.emplace("out/bias", uniform_array(305, {10}, -0.1f, 0.1f));
  return v;
}

Variables resnet_variables() {
  Variables v;
  std::uint32_t seed = 200;
  auto layer = [&](const std::string& name, pmap::Shape kernel) {
    const std::int64_t out = kernel.back();
    v.emplace(name + "/kernel", uniform_array(seed++, std::move(kernel), -0.4f, 0.4f));
    v.emplace(name + "/bias", uniform_array(seed++, {out}, -0.1f, 0.1f));
  };
  layer("stem", {3, 3, 2, 4});
  layer("block1_a", {3, 3, 4, 4});
  layer("block1_b", {3, 3, 4, 4});
  layer("block2_a", {3, 3, 4, 8});
  layer("block2_b", {3, 3, 8, 8});
  layer("project", {1, 1, 4, 8});
  layer("head", {8, 10});
  return v;
}

// Writes `name`.onnx and `name`.json (the images and pmapcc's logits of them) into dir, for tests/onnx/ort_zoo.js.
void write_for_ort(const std::filesystem::path& dir, const std::string& name, const Array& images,
                   const Array& logits, bool per_example) {
  pmap::io::Json doc = pmap::io::Json::object();
  doc["shape"] = std::vector<std::int64_t>(images.shape().begin(), images.shape().end());
  doc["images"] = images.to_vector<float>();
  doc["logits"] = logits.to_vector<float>();
  doc["per_example"] = per_example;
  std::ofstream(dir / (name + ".json")) << pmap::io::dump_json(doc);
}

Variables zoo_variables() {
  Variables v;
  std::uint32_t seed = 1;
  auto add = [&](const char* name, pmap::Shape shape, float lo = -0.5f, float hi = 0.5f) {
    v.emplace(name, uniform_array(seed++, std::move(shape), lo, hi));
  };
  add("conv1/kernel", {3, 3, 2, 4});
  add("conv1/bias", {4});
  add("bn/gamma", {4}, 0.5f, 1.5f);
  add("bn/beta", {4});
  add("bn/mean", {4});
  add("bn/variance", {4}, 0.5f, 2.0f);
  add("conv2/kernel", {2, 2, 4, 3});
  add("conv3/kernel", {3, 3, 4, 2});
  add("w", {16, 10});
  add("w_t", {10, 16});
  add("dense/kernel", {16, 10});
  add("dense/bias", {10});
  add("side/kernel", {5, 10});
  add("side/bias", {10});
  return v;
}

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const pmap::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("onnx export: an ensemble of a traced model holds each member, their mean and the class, checker-valid") {
  const pmap::train::Model model = pmap::train::keras_convnet();
  std::vector<Variables> members;
  members.push_back(member(model, 0));
  members.push_back(member(model, 1));
  const auto dir = pmap::testing::scratch_dir("pmapcc_onnx_export");
  const auto file = dir / "e.onnx";
  px::export_ensemble(px::network_of(model), members, file, {{{"model", "keras-convnet"}}, "doc"});
  const onnx::ModelProto m = load(file);
  CHECK(m.opset_import(0).version() == 17);
  CHECK(m.metadata_props(0).key() == "model");
  CHECK(m.graph().name() == "keras-convnet-ensemble-of-2");
  CHECK(m.graph().doc_string() == "doc");
  REQUIRE(m.graph().input_size() == 1);
  CHECK(m.graph().input(0).name() == "images");
  const auto& dims = m.graph().input(0).type().tensor_type().shape().dim();
  CHECK(dims[0].dim_param() == "N");
  CHECK(dims[1].dim_value() == 28);
  CHECK(dims[3].dim_value() == 1);
  REQUIRE(m.graph().output_size() == 2);
  CHECK(m.graph().output(0).name() == "probabilities");
  CHECK(m.graph().output(1).name() == "class");
  CHECK(m.graph().output(1).type().tensor_type().elem_type() == onnx::TensorProto::INT64);
  std::map<std::string, int> ops_used;
  std::set<std::string> initializers;
  for (const auto& t : m.graph().initializer()) initializers.insert(t.name());
  int image_transposes = 0;  // transposes of values (not of weights)
  for (const auto& n : m.graph().node()) {
    ops_used[n.op_type()]++;
    if (n.op_type() == "Transpose" && !initializers.contains(n.input(0))) ++image_transposes;
  }
  CHECK(ops_used["Conv"] == 6);  // 3 per member
  CHECK(ops_used["BatchNormalization"] == 6);
  CHECK(ops_used["Softmax"] == 2);
  CHECK(ops_used["Mean"] == 1);
  CHECK(ops_used["ArgMax"] == 1);
  CHECK(ops_used.count("Dropout") == 0);  // the identity in inference
  // The convolutions, BatchNorms and pooling run channels first end to end: per member, one transpose of the
  // images in and one out before the Dense layers' reshape.
  CHECK(image_transposes == 4);
  // The initializers are each member's tensors, as they are.
  for (int k = 0; k < 2; ++k) {
    for (const auto& [name, t] : members[static_cast<std::size_t>(k)]) {
      const onnx::TensorProto& init = initializer(m, "member_" + std::to_string(k) + "/" + name);
      CHECK(std::vector<std::int64_t>(init.dims().begin(), init.dims().end()) ==
            std::vector<std::int64_t>(t.shape().begin(), t.shape().end()));
      CHECK(values(init) == t.to_vector<float>());
    }
  }
  // Conv_0: 3x3 "same" on 28x28, a pixel on each side; Conv_1: 6x6 stride 2 "valid", none; the last: 6x6 stride 2
  // "same" on 12x12, 4 pixels, split 2 before and 2 after as Keras splits them.
  std::vector<std::vector<std::int64_t>> pads;
  for (const auto& n : m.graph().node())
    if (n.op_type() == "Conv" && n.name().starts_with("member_0/"))
      for (const auto& a : n.attribute())
        if (a.name() == "pads") pads.emplace_back(a.ints().begin(), a.ints().end());
  CHECK(pads == std::vector<std::vector<std::int64_t>>{{1, 1, 1, 1}, {0, 0, 0, 0}, {2, 2, 2, 2}});
  std::vector<std::string> files;  // the file alone: no temp file left behind
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path().filename().string());
  CHECK(files == std::vector<std::string>{"e.onnx"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("onnx export: a member alone gives its logits and probabilities, its variables named as the model's") {
  const pmap::train::Model model = pmap::train::flax_cnn({12, 12, 1}, 3);
  const Variables one = member(model, 2);
  const auto dir = pmap::testing::scratch_dir("pmapcc_onnx_member");
  px::export_member(px::network_of(model), one, dir / "m.onnx");
  const onnx::ModelProto m = load(dir / "m.onnx");
  CHECK(m.graph().name() == "flax-cnn-member");
  REQUIRE(m.graph().output_size() == 2);
  CHECK(m.graph().output(0).name() == "logits");
  CHECK(m.graph().output(0).type().tensor_type().shape().dim(1).dim_value() == 3);
  CHECK(m.graph().output(1).name() == "probabilities");
  CHECK(values(initializer(m, "params/Dense_1/bias")) == one.at("params/Dense_1/bias").to_vector<float>());
  std::filesystem::remove_all(dir);
}

TEST_CASE("onnx export: members_of splits stacked tensors into members, refusing ones that do not fit") {
  const pmap::train::Model model = pmap::train::flax_cnn({12, 12, 1}, 3);
  Variables params, state;
  for (const std::string& name : model.param_names()) {
    const Variables a = member(model, 0), b = member(model, 1);
    const Array& x = a.at("params/" + name);
    const Array& y = b.at("params/" + name);
    params.emplace(name, ops::concatenate({&x, &y}, 0).reshape([&] {
      pmap::Shape s{2};
      s.insert(s.end(), x.shape().begin(), x.shape().end());
      return s;
    }()));
  }
  const std::vector<Variables> split = px::members_of(model, params, state);
  REQUIRE(split.size() == 2);
  CHECK(split[1].at("params/Conv_0/kernel").to_vector<float>() ==
        member(model, 1).at("params/Conv_0/kernel").to_vector<float>());
  CHECK(split[0].at("params/Dense_1/bias").shape() == pmap::Shape{3});
  Array bias = std::move(params.at("Dense_1/bias"));
  params.erase("Dense_1/bias");
  CHECK(message([&] { px::members_of(model, params, state); }) ==
        "onnx export: 7 params tensors given, model flax-cnn has 8");
  params.emplace("Dense_1/bias", ops::slice(bias, {0, 0}, {1, 3}));  // one member's rows
  CHECK(message([&] { px::members_of(model, params, state); })
            .ends_with("'Dense_1/bias' is f32(1, 3), 'Conv_0/kernel' holds 2 members"));
  // A Network from a model reads params/ and state/ only.
  Variables other = member(model, 0);
  other.emplace("extra/x", uniform_array(61, {1}));
  CHECK(message([&] { px::export_member(px::network_of(model), other, "unused.onnx"); }) ==
        "onnx export: variable 'extra/x' is neither params/... nor state/...");
}

TEST_CASE("onnx export: the zoo of every primitive's emitter, a residual network and a LayerNorm one, checker-valid "
          "(and in ORT)") {
  const Variables v = zoo_variables();
  const px::Network net{"zoo", {6, 6, 2}, zoo};
  const char* where = std::getenv("PMAPCC_ONNX_ZOO_DIR");
  const auto dir = where != nullptr ? std::filesystem::path(where) : pmap::testing::scratch_dir("pmapcc_onnx_zoo");
  px::export_member(net, v, dir / "zoo.onnx");
  const onnx::ModelProto m = load(dir / "zoo.onnx");
  std::set<std::string> used;
  for (const auto& n : m.graph().node()) used.insert(n.op_type());
  for (const char* op : {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "Transpose", "Reshape", "Slice", "Exp",
                         "Concat", "Abs", "Tanh", "Sigmoid", "Neg", "Div", "Mul", "Sqrt", "Log", "Max", "Min", "Relu",
                         "ReduceMean", "ReduceMax", "ReduceSum", "Expand", "MatMul", "Add", "Sub", "Softmax",
                         "LogSoftmax"}) {
    CAPTURE(op);
    CHECK(used.contains(op));
  }
  // pmapcc's logits of 5 images, for ONNX Runtime to match.
  const Array images = uniform_array(99, {5, 6, 6, 2}, 0.0f, 1.0f);
  const Array logits = zoo(v, images);
  REQUIRE(logits.shape() == pmap::Shape{5, 10});
  if (where != nullptr) write_for_ort(dir, "zoo", images, logits, false);  // it centres over the examples

  // A residual network exports as any other.
  const Variables r = resnet_variables();
  px::export_member(px::Network{"resnet", {8, 8, 2}, resnet}, r, dir / "resnet.onnx");
  const onnx::ModelProto res = load(dir / "resnet.onnx");
  int convs = 0, adds = 0;
  for (const auto& n : res.graph().node()) {
    convs += n.op_type() == "Conv";
    adds += n.op_type() == "Add";
  }
  CHECK(convs == 6);
  CHECK(adds == 3);  // two skips and the Dense layer's bias
  const Array res_images = uniform_array(98, {4, 8, 8, 2}, 0.0f, 1.0f);
  // So does a layer a user added of ops: nn::LayerNorm, as the ops it is made of.
  const Variables nv = normed_variables();
  px::export_member(px::Network{"normed", {6, 6, 2}, normed}, nv, dir / "normed.onnx");
  std::set<std::string> normed_ops;
  const onnx::ModelProto normed_model = load(dir / "normed.onnx");
  for (const auto& n : normed_model.graph().node()) normed_ops.insert(n.op_type());
  for (const char* op : {"ReduceMean", "Expand", "Sub", "Mul", "Sqrt", "Div"}) {  // LayerNorm's part
    CAPTURE(op);
    CHECK(normed_ops.contains(op));
  }
  if (where != nullptr) {
    write_for_ort(dir, "resnet", res_images, resnet(r, res_images), true);
    write_for_ort(dir, "normed", images, normed(nv, images), true);
  } else {
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("onnx export: what has no ONNX form is refused, naming the primitive, and nothing is written") {
  const auto dir = pmap::testing::scratch_dir("pmapcc_onnx_refused");
  const auto file = dir / "x.onnx";
  Variables z = zoo_variables();
  z.emplace("w72", uniform_array(50, {72, 10}));
  auto net = [](px::LogitsFunction f) { return px::Network{"f", {6, 6, 2}, std::move(f)}; };
  auto dense = [](const Variables& v, const Array& x) {  // a valid network: (N, 72) @ (72, 10) + (10)
    return ops::linear(ops::reshape(x, {x.dim(0), 72}), v.at("w72"), v.at("dense/bias"));
  };
  CHECK(message([&] { px::export_member(net(dense), z, file); }) == "no error");
  std::filesystem::remove(file);
  // Training mode: BatchNorm's batch statistics, dropout.
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              return ops::batch_norm(dense(v, x), Array(), Array(), v.at("dense/bias"),
                                                     v.at("dense/bias"), {.train = true}).y;
                            }),
                            z, file);
        }) == "onnx export: the member: batch_norm in training mode has no ONNX form: export the inference function "
              "(train::Call{.train = false})");
  const Array key = Array::from_host(std::vector<std::uint32_t>{1, 2}, {2});
  const Array step = Array::from_host(std::vector<std::int64_t>{0}, {1});
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              return ops::dropout(dense(v, x), key, step, {.rate = 0.5f});
                            }),
                            z, file);
        }) == "onnx export: the member: dropout runs in training only: export the inference function "
              "(train::Call{.train = false})");
  // A value repeated over the examples (the batch's size would be built into the graph).
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              return ops::add(dense(v, x), ops::broadcast_to(v.at("dense/bias"), {x.dim(0), 10}));
                            }),
                            z, file);
        }).find("broadcast_to to (2, 10) repeats a value over the examples") != std::string::npos);
  // A constant of the batch's size.
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              const auto count = static_cast<std::size_t>(x.dim(0) * 10);
                              const Array ones = Array::from_host(std::vector<float>(count, 1.0f), {x.dim(0), 10});
                              return ops::add(dense(v, x), ones);
                            }),
                            z, file);
        }).find("a constant of f32(2, 10) (f32(3, 10) for 3 examples) depends on the number of examples") !=
        std::string::npos);
  // Other primitives for other batch sizes.
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              return x.dim(0) == 2 ? ops::relu(dense(v, x)) : dense(v, x);
                            }),
                            z, file);
        }).find("applies other primitives to 2 examples than to 3") != std::string::npos);
  // Logits that are not (N, classes).
  CHECK(message([&] {
          px::export_member(net([](const Variables&, const Array& x) { return ops::sum(x, {1}); }), z, file);
        }).starts_with("onnx export: the member: the logits must be (N, classes) f32 of the N images, got "
                       "f32(2, 6, 2)"));
  // A collective inside pmap.
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "d");
  CHECK(message([&] {
          pmap::pmap([&](int) {
            px::export_member(net([&](const Variables& v, const Array& x) { return dense(v, pmap::psum(x, "d")); }), z,
                              file);
            return Array::scalar(0.0f);
          }, mesh)(0);
        }).find("psum is a collective, which has no ONNX form") != std::string::npos);
  // What would be right for 2 and 3 examples only: an attribute or a constant of the batch's size, a reshape that
  // splits the examples, a slice of some of them, an image op whose image size follows them.
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              return ops::scale(dense(v, x), 1.0f / static_cast<float>(x.dim(0)));
                            }),
                            z, file);
        }) == "onnx export: the member: scale's factor is 0.5 for 2 examples and 0.333333343 for 3; the exported "
              "graph must be one for any number of examples");
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              const float n = static_cast<float>(x.dim(0));
                              return ops::multiply(dense(v, x), Array::from_host(std::vector<float>{n}, {1}));
                            }),
                            z, file);
        }).starts_with("onnx export: the member: a constant of f32(1,) (f32(1,) for 3 examples) depends on the number "
                       "of examples"));
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              const std::int64_t n = x.dim(0);
                              const Array split = ops::reshape(ops::reshape(x, {n, 72}), {n, n, 72 / n});
                              return dense(v, ops::reshape(split, {n, 6, 6, 2}));
                            }),
                            z, file);
        }).find("reshape to (2, 2, 36) splits the examples over several axes") != std::string::npos);
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              const Array y = dense(v, x);
                              const Array first = ops::slice(y, {0, 0}, {1, 10});
                              const Array rest = ops::slice(y, {1, 0}, {x.dim(0), 10});
                              return ops::concatenate({&first, &rest}, 0);
                            }),
                            z, file);
        }).find("slice of part of the examples") != std::string::npos);
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              const std::int64_t n = x.dim(0);
                              const Array tall = ops::reshape(x, {1, 6 * n, 6, 2});  // the examples stacked as rows
                              const Array pooled = ops::avg_pool(tall, 1, 1, 1, 1);
                              return dense(v, ops::reshape(pooled, {n, 6, 6, 2}));
                            }),
                            z, file);
        }).find("avg_pool of images whose axis 1 depends on the number of examples") != std::string::npos);
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              const Array flat = ops::reshape(x, {x.dim(0), 72});
                              const Array gram = ops::matmul(flat, flat, true);  // (72, 72): over the examples
                              return ops::linear(ops::matmul(flat, gram), v.at("w72"), v.at("dense/bias"));
                            }),
                            z, file);
        }).find("matmul with transpose_a (a gradient's product) has no ONNX emitter") != std::string::npos);
  // Names the exporter makes never meet: a fused ReLU's tensor and a relu's value once took the same name.
  Variables one;
  one.emplace("k", uniform_array(60, {1, 1, 1, 2}));
  const px::Network relus{"relus", {1, 1, 1}, [](const Variables& v, const Array& x) {
                            const Array c = ops::conv2d(x, v.at("k"), Array(), {.relu = true});
                            return ops::reshape(ops::relu(c), {x.dim(0), 2});
                          }};
  px::export_member(relus, one, file);
  CHECK_NOTHROW(load(file));  // the checker: every name assigned once
  std::filesystem::remove(file);
  // Members that disagree, and what the exporter is given that it cannot use.
  std::vector<Variables> two;
  two.push_back(zoo_variables());
  two.back().emplace("w72", uniform_array(50, {72, 10}));
  two.push_back(zoo_variables());
  two.back().emplace("w72", uniform_array(51, {72, 5}));
  two.back().erase("dense/bias");
  two.back().emplace("dense/bias", uniform_array(52, {5}));
  CHECK(message([&] { px::export_ensemble(net(dense), two, file); }) ==
        "onnx export: member 1 gives 5 classes, member 0 10");
  CHECK(message([&] { px::export_ensemble(net(dense), {}, file); }) ==
        "onnx export: needs at least one member, got none");
  CHECK(message([&] { px::export_member(px::Network{"none", {6, 6, 2}, {}}, z, file); }) ==
        "onnx export: network 'none' has no logits function");
  Variables odd = zoo_variables();
  odd.emplace("%w", uniform_array(53, {2}));
  CHECK(message([&] { px::export_member(net(dense), odd, file); })
            .find("variable '%w': a name must not be empty or start with '%'") != std::string::npos);
  // A vmapped call inside the function (over the 10 classes: over the examples, its member count would vary).
  CHECK(message([&] {
          px::export_member(net([&](const Variables& v, const Array& x) {
                              const Array by_class = ops::transpose(dense(v, x), {1, 0});
                              auto relu = pmap::vmap([](const Array& column) { return ops::relu(column); }, {0}, "c");
                              return ops::transpose(relu(by_class), {1, 0});
                            }),
                            z, file);
        }).find("vmap(relu) (a call batched over members by vmap) has no ONNX emitter") != std::string::npos);
  // Variables that are not f32.
  Variables bad = zoo_variables();
  bad.emplace("count", Array::from_host(std::vector<std::int32_t>{1}, {1}));
  CHECK(message([&] { px::export_member(px::Network{"zoo", {6, 6, 2}, zoo}, bad, file); }) ==
        "onnx export: the member's variable 'count' is i32(1,), not f32");
  CHECK(!std::filesystem::exists(file));
  // A directory that does not exist: IoError naming the path, nothing left behind.
  CHECK(message([&] { px::export_member(px::Network{"zoo", {6, 6, 2}, zoo}, z, dir / "none" / "x.onnx"); })
            .find((dir / "none" / "x.onnx").string()) != std::string::npos);
  CHECK(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

}  // namespace PMAPCC_TEST_FILE
#endif  // PMAPCC_HAVE_ONNX
