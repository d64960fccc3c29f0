// The ONNX exporter (ensemble/onnx) at the level of the file: what it writes, read back with the ONNX
// protobuf classes and checked by libonnx's checker. That the numbers are right is checked by running the
// files in ONNX Runtime against pmapcc's predictions (tests/onnx/run_onnx_tests.sh).
#ifdef PMAPCC_HAVE_ONNX
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <pmap/error.h>
#include <pmap/random.h>

#include <pmapcc/ensemble/model.h>
#include <pmapcc/ensemble/onnx/export.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;

namespace {

// Every layer kind the exporter knows, on 8x8 images: Rescaling (twice), a 2x2 "same" Conv2D (its odd padding
// pixel after), BatchNorm with both gamma and beta, ReLU, pooling, a strided "valid" Conv2D without bias,
// Flatten, Dense, BatchNorm over features (beta only), Dropout, Dense; then a second model ending in global
// average pooling.
std::unique_ptr<pe::Sequential> every_layer() {
  std::vector<std::unique_ptr<pe::Layer>> l;
  l.push_back(pe::rescaling(2.0f, -1.0f));
  l.push_back(pe::rescaling(0.5f));  // twice: its tensors' names must not clash
  l.push_back(pe::conv2d("Conv_0", 3, pe::Conv2dOptions{2}));
  l.push_back(pe::batch_norm("BatchNorm_0"));
  l.push_back(pe::relu());
  l.push_back(pe::avg_pool(2));
  l.push_back(pe::conv2d("Conv_1", 4, pe::Conv2dOptions{3, 1, pmap::kernels::Padding::valid, false}));
  l.push_back(pe::flatten());
  l.push_back(pe::dense("Dense_0", 5));
  l.push_back(pe::batch_norm("BatchNorm_1", pe::BatchNormOptions{0.99f, 1e-3f, true, false}));
  l.push_back(pe::dropout("Dropout_0", 0.5f));
  l.push_back(pe::dense("Dense_1", 3));
  return std::make_unique<pe::Sequential>(pe::Dims{8, 8, 1}, std::move(l), "every-layer");
}

struct Trained {
  std::unique_ptr<pe::Sequential> model;
  std::vector<float> params, state;
  int members;
};

Trained trained(std::unique_ptr<pe::Sequential> model, int members) {
  Trained t{std::move(model), {}, {}, members};
  t.params.resize(static_cast<std::size_t>(members * t.model->params_per_member()));
  const auto keys = pmap::split(pmap::key(7), members);
  t.model->init(keys, t.params);
  t.state = t.model->init_state(members);
  for (std::size_t i = 0; i < t.state.size(); ++i) t.state[i] += 0.01f * static_cast<float>(i % 7);  // not 0/1
  return t;
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

std::map<std::string, std::vector<std::int64_t>> int_attributes(const onnx::NodeProto& n) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const auto& a : n.attribute()) out[a.name()] = {a.ints().begin(), a.ints().end()};
  return out;
}

struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("pmapcc_onnx_" + std::to_string(std::rand()) + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE("onnx export: the ensemble graph holds each member, their mean and the class, checker-valid") {
  const Trained t = trained(every_layer(), 2);
  const TempDir dir;
  const auto file = dir.path / "e.onnx";
  pe::onnx::export_ensemble({*t.model, t.params, t.state, t.members}, file, {{{"model", "every-layer"}}, "doc"});
  const onnx::ModelProto m = load(file);
  CHECK(m.opset_import(0).version() == 17);
  CHECK(m.metadata_props(0).key() == "model");
  CHECK(m.graph().doc_string() == "doc");
  REQUIRE(m.graph().input_size() == 1);
  CHECK(m.graph().input(0).name() == "images");
  const auto& dims = m.graph().input(0).type().tensor_type().shape().dim();
  CHECK(dims[0].dim_param() == "N");
  CHECK(dims[1].dim_value() == 8);
  CHECK(dims[3].dim_value() == 1);
  REQUIRE(m.graph().output_size() == 2);
  CHECK(m.graph().output(0).name() == "probabilities");
  CHECK(m.graph().output(1).name() == "class");
  CHECK(m.graph().output(1).type().tensor_type().elem_type() == onnx::TensorProto::INT64);
  std::map<std::string, int> ops;
  for (const auto& n : m.graph().node()) ops[n.op_type()]++;
  CHECK(ops["Conv"] == 4);  // 2 per member
  CHECK(ops["BatchNormalization"] == 4);
  CHECK(ops["Softmax"] == 2);
  CHECK(ops["Mean"] == 1);
  CHECK(ops["ArgMax"] == 1);
  CHECK(ops.count("Dropout") == 0);  // the identity in inference
  // Member 1's first kernel, (KH, KW, Cin, Cout) = (2, 2, 1, 3) in pmapcc, is ONNX's (Cout, Cin, KH, KW).
  const pe::TensorSlot& k = t.model->tensors()[0];
  REQUIRE(k.name == "Conv_0/kernel");
  const float* mine = t.params.data() + k.offset * 2 + k.size;  // member 1 of 2
  const onnx::TensorProto& w = initializer(m, "member_1/Conv_0/kernel");
  CHECK(std::vector<std::int64_t>(w.dims().begin(), w.dims().end()) == std::vector<std::int64_t>{3, 1, 2, 2});
  const std::vector<float> onnx_w = values(w);
  for (int co = 0; co < 3; ++co)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 2; ++x)
        CHECK(onnx_w[static_cast<std::size_t>((co * 2 + y) * 2 + x)] == mine[(y * 2 + x) * 3 + co]);
  // BatchNorm_1 has no gamma: ones; its moving statistics are member 1's state.
  CHECK(values(initializer(m, "member_1/BatchNorm_1/gamma")) == std::vector<float>(5, 1.0f));
  const pe::TensorSlot& mean = t.model->state_layout().tensors[2];
  REQUIRE(mean.name == "BatchNorm_1/moving_mean");
  CHECK(values(initializer(m, "member_1/BatchNorm_1/moving_mean")) ==
        std::vector<float>(t.state.begin() + mean.offset * 2 + mean.size,
                           t.state.begin() + mean.offset * 2 + 2 * mean.size));
  // The convolutions' padding: 2x2 "same" puts its one padding pixel after (bottom, right), as TensorFlow;
  // "valid" none.
  for (const auto& n : m.graph().node()) {
    const auto pads = int_attributes(n)["pads"];
    if (n.name().rfind("member_0/Conv_0/conv", 0) == 0) CHECK(pads == std::vector<std::int64_t>{0, 0, 1, 1});
    if (n.name().rfind("member_0/Conv_1/conv", 0) == 0) CHECK(pads == std::vector<std::int64_t>{0, 0, 0, 0});
  }
}

TEST_CASE("onnx export: a member alone gives its logits and probabilities") {
  std::vector<std::unique_ptr<pe::Layer>> l;
  l.push_back(pe::conv2d("Conv_0", 4, pe::Conv2dOptions{3, 2}));
  l.push_back(pe::relu());
  l.push_back(pe::global_avg_pool());
  l.push_back(pe::dense("Dense_0", 3));
  const Trained t = trained(std::make_unique<pe::Sequential>(pe::Dims{6, 6, 2}, std::move(l), "gap"), 3);
  const TempDir dir;
  pe::onnx::export_member({*t.model, t.params, t.state, t.members}, 2, dir.path / "m.onnx");
  const onnx::ModelProto m = load(dir.path / "m.onnx");
  REQUIRE(m.graph().output_size() == 2);
  CHECK(m.graph().output(0).name() == "logits");
  CHECK(m.graph().output(1).name() == "probabilities");
  // Only member 2's weights: one kernel and one bias per layer with weights.
  CHECK(m.graph().initializer_size() == 4);
  const pe::TensorSlot& bias = t.model->tensors()[3];
  REQUIRE(bias.name == "Dense_0/bias");
  CHECK(values(initializer(m, "Dense_0/bias")) ==
        std::vector<float>(t.params.begin() + bias.offset * 3 + 2 * bias.size,
                           t.params.begin() + bias.offset * 3 + 3 * bias.size));
}

TEST_CASE("onnx export: what cannot be exported is refused, naming it, and nothing is written") {
  const Trained t = trained(every_layer(), 2);
  const TempDir dir;
  const auto file = dir.path / "x.onnx";
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const pmap::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // A model-parallel device's local model has a GatherFeatures layer.
  std::vector<std::unique_ptr<pe::Layer>> l;
  l.push_back(pe::dense("Dense_0", 2));
  l.push_back(pe::gather_features(2));
  const pe::Sequential local(pe::Dims{4}, std::move(l), "local");
  CHECK(message([&] { pe::onnx::check_exportable(local); }).find("GatherFeatures") != std::string::npos);
  // Variables of another member count.
  CHECK(message([&] {
          pe::onnx::export_ensemble({*t.model, t.params, t.state, 3}, file);
        }).find("3 members of every-layer need") != std::string::npos);
  CHECK(message([&] { pe::onnx::export_member({*t.model, t.params, t.state, 2}, 2, file); }) ==
        "onnx export: member 2 is not one of the 2 members");
  // A directory that does not exist: IoError naming the path.
  CHECK(message([&] {
          pe::onnx::export_ensemble({*t.model, t.params, t.state, 2}, dir.path / "none" / "x.onnx");
        }).find((dir.path / "none" / "x.onnx").string()) != std::string::npos);
  CHECK(std::filesystem::is_empty(dir.path));
}

}  // namespace PMAPCC_TEST_FILE
#endif  // PMAPCC_HAVE_ONNX
