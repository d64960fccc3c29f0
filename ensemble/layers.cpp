// The layer implementations: thin adapters from layer shapes to the kernels' parameter structs.
#include <pmapcc/ensemble/layers.h>

#include <pmap/error.h>
#include <pmap/array.h>

#include <utility>

namespace pmap::ensemble {

std::int64_t product(const Dims& d) {
  std::int64_t n = 1;
  for (auto v : d) n *= v;
  return n;
}

void Layer::backward_through_relu(const kernels::Backend&, const LayerCall&, const float*, const float*,
                                  float*) const {
  throw Error(name() + ": cannot run its backward through a ReLU");
}

std::unique_ptr<Layer> Layer::with_features(int) const {
  throw ValueError(name() + ": has no output features to split");
}

namespace {

int as_int(std::int64_t v) { return static_cast<int>(v); }

class Conv2D final : public Layer {
 public:
  Conv2D(std::string name, int features, Conv2dOptions o) : name_(std::move(name)), features_(features), o_(o) {
    if (features < 1 || o.kernel < 1 || o.stride < 1 || o.padding == kernels::Padding::explicit_pads)
      throw ValueError(name_ + ": Conv2D needs features, kernel and stride >= 1 and same or valid padding");
  }
  std::string name() const override { return name_; }
  std::string kind() const override { return "Conv2D"; }
  std::string describe() const override {
    const std::string k = std::to_string(o_.kernel);
    return "Conv2D(" + std::to_string(features_) + ", " + k + "x" + k +
           (o_.stride == 1 ? "" : ", stride " + std::to_string(o_.stride)) +
           (o_.padding == kernels::Padding::valid ? ", valid" : "") + (o_.use_bias ? "" : ", no bias") + ")";
  }
  Dims output_shape(const Dims& in) const override {
    check(in);
    kernels::Conv2dParams p = kparams(LayerCall{1, 1, in});
    try {
      const kernels::ConvGeometry g = kernels::conv2d_geometry(p);
      return {g.out_height, g.out_width, features_};
    } catch (const ValueError& e) {
      throw ShapeError(name_ + ": " + describe() + " on " + shape_str(in) + " inputs: " + e.what());
    }
  }
  std::vector<ParamSpec> params(const Dims& in) const override {
    check(in);
    const std::int64_t area = std::int64_t{o_.kernel} * o_.kernel;
    std::vector<ParamSpec> p{
        {"kernel", {o_.kernel, o_.kernel, in[2], features_}, area * in[2], false, area * features_, o_.kernel_init}};
    if (o_.use_bias) p.push_back({"bias", {features_}, 0, true});
    return p;
  }
  bool in_place() const override { return false; }
  bool reads_shared() const override { return true; }
  bool fuses_relu_forward() const override { return true; }
  std::size_t workspace_bytes(const kernels::Backend& be, const LayerCall& c) const override {
    return be.conv().conv2d_workspace_bytes(kparams(c));
  }
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const* p, const float* x, float* y,
               void* ws) const override {
    be.conv().conv2d_forward(kparams(c), x, p[0], o_.use_bias ? p[1] : nullptr, y, ws);
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const* p, const float* x, const float*,
                const float* dy, float* dx, float* const* dp, void* ws) const override {
    be.conv().conv2d_backward(kparams(c), x, p[0], dy, dx, dp[0], o_.use_bias ? dp[1] : nullptr, ws);
  }

 private:
  void check(const Dims& in) const {
    if (in.size() != 3) throw ShapeError(name_ + ": expects (H, W, C) inputs");
  }
  kernels::Conv2dParams kparams(const LayerCall& c) const {
    kernels::Conv2dParams p;
    p.members = c.members, p.batch = c.batch, p.height = as_int(c.input[0]), p.width = as_int(c.input[1]);
    p.in_channels = as_int(c.input[2]), p.out_channels = features_, p.kernel_h = p.kernel_w = o_.kernel;
    p.stride_h = p.stride_w = o_.stride, p.padding = o_.padding, p.shared_input = c.shared_input, p.relu = c.relu;
    p.precision = c.precision;
    return p;
  }
  std::string name_;
  int features_;
  Conv2dOptions o_;

 public:
  std::unique_ptr<Layer> clone() const override { return std::make_unique<Conv2D>(*this); }
  std::unique_ptr<Layer> with_features(int features) const override {
    return std::make_unique<Conv2D>(name_, features, o_);
  }
};

class Dense final : public Layer {
 public:
  Dense(std::string name, int features, Init init) : name_(std::move(name)), features_(features), init_(init) {
    if (features < 1) throw ValueError(name_ + ": Dense needs features >= 1, got " + std::to_string(features));
  }
  std::string name() const override { return name_; }
  std::string kind() const override { return "Dense"; }
  std::string describe() const override { return "Dense(" + std::to_string(features_) + ")"; }
  Dims output_shape(const Dims& in) const override {
    check(in);
    return {features_};
  }
  std::vector<ParamSpec> params(const Dims& in) const override {
    check(in);
    return {{"kernel", {in[0], features_}, in[0], false, features_, init_}, {"bias", {features_}, 0, true}};
  }
  bool in_place() const override { return false; }
  bool reads_shared() const override { return true; }
  bool fuses_relu_forward() const override { return true; }
  std::size_t workspace_bytes(const kernels::Backend& be, const LayerCall& c) const override {
    return be.dense().dense_workspace_bytes(kparams(c));
  }
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const* p, const float* x, float* y,
               void* ws) const override {
    be.dense().dense_forward(kparams(c), x, p[0], p[1], y, ws);
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const* p, const float* x, const float*,
                const float* dy, float* dx, float* const* dp, void* ws) const override {
    be.dense().dense_backward(kparams(c), x, p[0], dy, dx, dp[0], dp[1], ws);
  }

 private:
  void check(const Dims& in) const {
    if (in.size() != 1) throw ShapeError(name_ + ": expects flat (F) inputs; put a Flatten before it");
  }
  kernels::DenseParams kparams(const LayerCall& c) const {
    kernels::DenseParams p;
    p.members = c.members, p.batch = c.batch, p.in_features = as_int(c.input[0]), p.out_features = features_;
    p.shared_input = c.shared_input, p.relu = c.relu, p.precision = c.precision;
    return p;
  }
  std::string name_;
  int features_;
  Init init_;

 public:
  std::unique_ptr<Layer> clone() const override { return std::make_unique<Dense>(*this); }
  std::unique_ptr<Layer> with_features(int features) const override {
    return std::make_unique<Dense>(name_, features, init_);
  }
};

// Elementwise layers on (M, N, ...) tensors; in place.
class ReLU final : public Layer {
 public:
  std::string name() const override { return "relu"; }
  std::string kind() const override { return "ReLU"; }
  std::unique_ptr<Layer> clone() const override { return std::make_unique<ReLU>(); }
  bool keeps_feature_blocks(const Dims&) const override { return true; }
  Dims output_shape(const Dims& in) const override { return in; }
  std::vector<ParamSpec> params(const Dims&) const override { return {}; }
  bool in_place() const override { return true; }
  bool is_relu() const override { return true; }
  std::size_t workspace_bytes(const kernels::Backend&, const LayerCall&) const override { return 0; }
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float* x, float* y,
               void*) const override {
    be.layers().relu_forward(count(c), x, y);
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float*, const float* y,
                const float* dy, float* dx, float* const*, void*) const override {
    if (dx != nullptr) be.layers().relu_backward(count(c), y, dy, dx);
  }

 private:
  static std::size_t count(const LayerCall& c) {
    return static_cast<std::size_t>((c.shared_input ? 1 : c.members) * c.batch * product(c.input));
  }
};

// Average pooling over window x window blocks (window = stride, VALID), or with window 0 over the whole
// image: Keras's GlobalAveragePooling2D, (H, W, C) -> (C), as (M, N, 1, 1, C) is (M, N, C) in memory.
class AvgPool final : public Layer {
 public:
  explicit AvgPool(int window) : window_(window) {}
  std::string name() const override { return window_ == 0 ? "global_avg_pool" : "avg_pool"; }
  std::string kind() const override { return window_ == 0 ? "GlobalAveragePooling2D" : "AveragePooling2D"; }
  std::string describe() const override {
    return window_ == 0 ? kind() : "AveragePooling2D(" + std::to_string(window_) + ")";
  }
  std::unique_ptr<Layer> clone() const override { return std::make_unique<AvgPool>(window_); }
  bool keeps_feature_blocks(const Dims&) const override { return true; }  // per channel
  Dims output_shape(const Dims& in) const override {
    if (in.size() != 3) throw ShapeError(name() + ": expects (H, W, C) inputs, got " + shape_str(in));
    if (window_ == 0) return {in[2]};
    return {in[0] / window_, in[1] / window_, in[2]};
  }
  std::vector<ParamSpec> params(const Dims&) const override { return {}; }
  bool in_place() const override { return false; }
  std::size_t workspace_bytes(const kernels::Backend&, const LayerCall&) const override { return 0; }
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float* x, float* y,
               void*) const override {
    be.conv().avg_pool_forward(kparams(c), x, y);
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float*, const float*,
                const float* dy, float* dx, float* const*, void*) const override {
    if (dx != nullptr) be.conv().avg_pool_backward(kparams(c), dy, dx);
  }
  bool fuses_relu_backward() const override { return true; }
  void backward_through_relu(const kernels::Backend& be, const LayerCall& c, const float* r, const float* dy,
                             float* dx) const override {
    be.conv().avg_pool_relu_backward(kparams(c), r, dy, dx);
  }

 private:
  kernels::AvgPoolParams kparams(const LayerCall& c) const {
    if (c.shared_input) throw ShapeError(name() + ": cannot read the batch every member shares (a Conv2D or Dense must)");
    kernels::AvgPoolParams p;
    p.members = c.members, p.batch = c.batch, p.height = as_int(c.input[0]), p.width = as_int(c.input[1]);
    p.channels = as_int(c.input[2]);
    p.window_h = p.stride_h = window_ == 0 ? p.height : window_;
    p.window_w = p.stride_w = window_ == 0 ? p.width : window_;
    return p;
  }
  int window_;
};

// (H, W, C) seen as (H*W*C): the same memory, in Flax's reshape order.
class Flatten final : public Layer {
 public:
  std::string name() const override { return "flatten"; }
  std::string kind() const override { return "Flatten"; }
  std::unique_ptr<Layer> clone() const override { return std::make_unique<Flatten>(); }
  // (H, W, C) flattens channel blocks into strided, not contiguous, blocks of H*W*C.
  bool keeps_feature_blocks(const Dims& in) const override { return in.size() == 1; }
  bool keeps_shared() const override { return true; }  // a view of the same memory
  Dims output_shape(const Dims& in) const override { return {product(in)}; }
  std::vector<ParamSpec> params(const Dims&) const override { return {}; }
  bool in_place() const override { return true; }
  std::size_t workspace_bytes(const kernels::Backend&, const LayerCall&) const override { return 0; }
  // In place everywhere but as a model's first layer, whose input (the caller's batch) is never written.
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float* x, float* y,
               void*) const override {
    if (x != y) be.copy(y, x, bytes(c));
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float*, const float*,
                const float* dy, float* dx, float* const*, void*) const override {
    if (dx != nullptr && dx != dy) be.copy(dx, dy, bytes(c));
  }

 private:
  static std::size_t bytes(const LayerCall& c) {
    return static_cast<std::size_t>((c.shared_input ? 1 : c.members) * c.batch * product(c.input)) * sizeof(float);
  }
};

class GatherFeatures final : public Layer {
 public:
  explicit GatherFeatures(int parts) : parts_(parts) {}
  std::string name() const override { return "gather_features"; }
  std::string kind() const override { return "GatherFeatures"; }
  std::string describe() const override { return "GatherFeatures(" + std::to_string(parts_) + ")"; }
  std::unique_ptr<Layer> clone() const override { return std::make_unique<GatherFeatures>(parts_); }
  Dims output_shape(const Dims& in) const override {
    Dims out = in;
    out.back() *= parts_;
    return out;
  }
  std::vector<ParamSpec> params(const Dims&) const override { return {}; }
  bool in_place() const override { return false; }
  std::size_t workspace_bytes(const kernels::Backend&, const LayerCall&) const override { return 0; }
  // The whole features are every device's blocks: an all_gather, which ModelRunner runs in this layer's place
  // (RunnerStep::gather). On its own the layer has only its block: a copy of one part.
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float* x, float* y,
               void*) const override {
    if (parts_ != 1)
      throw Error("gather_features: the gather of " + std::to_string(parts_) +
                  " blocks is a collective over the model axis (ModelRunner runs it)");
    be.copy(y, x, static_cast<std::size_t>(c.members * c.batch * product(c.input)) * sizeof(float));
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float*, const float*,
                const float* dy, float* dx, float* const*, void*) const override {
    if (dx == nullptr) return;
    const auto [rows, block] = shape(c);
    for (std::size_t r = 0; r < rows; ++r)
      be.copy(dx + r * block, dy + (r * static_cast<std::size_t>(parts_) + static_cast<std::size_t>(c.block)) * block,
              block * sizeof(float));
  }

 private:
  // The rows (members x examples x the positions before the last dimension) and the block's features.
  std::pair<std::size_t, std::size_t> shape(const LayerCall& c) const {
    if (c.block < 0 || c.block >= parts_)
      throw ShapeError("gather_features: block " + std::to_string(c.block) + " of " + std::to_string(parts_));
    const auto block = static_cast<std::size_t>(c.input.back());
    return {static_cast<std::size_t>(c.members) * static_cast<std::size_t>(c.batch) *
                static_cast<std::size_t>(product(c.input)) / block,
            block};
  }
  int parts_;
};

}  // namespace

std::unique_ptr<Layer> conv2d(std::string name, int features, int kernel) {
  return std::make_unique<Conv2D>(std::move(name), features, Conv2dOptions{kernel});
}
std::unique_ptr<Layer> conv2d(std::string name, int features, Conv2dOptions options) {
  return std::make_unique<Conv2D>(std::move(name), features, options);
}
std::unique_ptr<Layer> dense(std::string name, int features, Init kernel_init) {
  return std::make_unique<Dense>(std::move(name), features, kernel_init);
}
std::unique_ptr<Layer> relu() { return std::make_unique<ReLU>(); }
std::unique_ptr<Layer> avg_pool(int window) {
  if (window < 1) throw ValueError("avg_pool: window must be >= 1, got " + std::to_string(window));
  return std::make_unique<AvgPool>(window);
}
std::unique_ptr<Layer> global_avg_pool() { return std::make_unique<AvgPool>(0); }
std::unique_ptr<Layer> flatten() { return std::make_unique<Flatten>(); }
std::unique_ptr<Layer> gather_features(int parts) {
  if (parts < 1) throw ValueError("gather_features: parts must be >= 1, got " + std::to_string(parts));
  return std::make_unique<GatherFeatures>(parts);
}

}  // namespace pmap::ensemble
