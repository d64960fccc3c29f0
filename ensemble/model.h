// Sequential: a stack of layers, the layout of its variables shared by every member, and the models the
// program knows (flax_mnist_cnn, keras_convnet). A member's variables have two roles, each with its own
// TensorLayout: parameters (trained by the optimizer, whose state slots take the same layout) and model
// state (BatchNorm's moving statistics). The variables of M members in one role live in one flat f32
// buffer, tensor by tensor, each tensor's members stacked: [Conv_0/kernel (M,3,3,1,32), Conv_0/bias (M,32),
// ...]. So replicate, pmean of gradients, the optimizer and checkpoints are each one call over one buffer,
// and a checkpoint tensor is a contiguous (M, ...) block. TensorLayout is the one place that layout is kept.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <pmap/random.h>

#include <pmapcc/ensemble/layers.h>

namespace pmap::ensemble {

// Where one parameter tensor lives in a buffer for M members: elements [offset*M, (offset+size)*M).
struct TensorSlot {
  std::string name;      // "Conv_0/kernel"
  Dims shape;            // per member
  std::int64_t offset;   // per-member offset: the tensor starts at offset * M
  std::int64_t size;     // elements per member
  std::int64_t fan_in;
  bool is_bias;
  int layer;
  int index_in_layer;
  std::int64_t fan_out = 0;
  Init init = Init::automatic;
};

// The tensors of one role, in model order, and the floats one member has of them.
struct TensorLayout {
  std::vector<TensorSlot> tensors;
  std::int64_t per_member = 0;
};

class Sequential {
 public:
  // The layers in order on inputs of shape `input` (per example, (H, W, C) or (F)); `name` is what the
  // summary, metrics and checkpoints call the model. ShapeError naming the layer when one does not fit
  // its input. Every member reads the one input batch: ValueError when a layer before the first one with
  // parameters does not keep that batch one (Layer::keeps_shared: Rescaling and Flatten do), when the first
  // layer with parameters cannot read it (Layer::reads_shared: Conv2D and Dense can), or when no layer has
  // parameters.
  Sequential(Dims input, std::vector<std::unique_ptr<Layer>> layers, std::string name = "sequential");

  const std::string& name() const { return name_; }
  const Dims& input_shape() const { return input_; }
  const Dims& output_shape() const { return shapes_.back(); }
  // shapes()[i] is layer i's input shape; shapes()[layers] the output.
  const std::vector<Dims>& shapes() const { return shapes_; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  const std::vector<TensorSlot>& tensors() const { return params_.tensors; }
  std::int64_t params_per_member() const { return params_.per_member; }
  const TensorLayout& params_layout() const { return params_; }
  // Model state: "<layer>/moving_mean", ...; empty for a model without such layers.
  const TensorLayout& state_layout() const { return state_; }
  std::int64_t state_per_member() const { return state_.per_member; }
  // Keras's model.summary() table: each layer's name (description), output shape (None, ...) and
  // parameters per member, then the total, trainable and non-trainable counts.
  std::string summary() const;
  // What identifies what the model computes: the input shape, then every layer's name and description,
  // e.g. {"(28, 28, 1)", "Conv_0=Conv2D(32, 3x3)", "relu=ReLU", ...}. Checkpoints record it, and a resumed
  // run must have the same.
  std::vector<std::string> architecture() const;

  // Initial parameters of keys.size() members into `params` (host, keys.size() * params_per_member()), each
  // tensor by its Init (layers.h; automatic: kernels LeCun-normal as Flax's lecun_normal, biases zero).
  // Member m's tensor t is drawn from fold_in(keys[m], t), so a member's parameters depend only on its key.
  void init(std::span<const Key> keys, std::span<float> params) const;
  // Initial model state of `members` members (members * state_per_member()): its Init's constants.
  std::vector<float> init_state(std::int64_t members) const;

 private:
  std::string name_;
  Dims input_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Dims> shapes_;
  TensorLayout params_;
  TensorLayout state_;
};

// The Flax MNIST CNN: Conv(32,3x3,SAME) ReLU AvgPool(2) Conv(64,3x3,SAME) ReLU AvgPool(2) Flatten
// Dense(256) ReLU Dense(10), on (28, 28, 1) inputs: 824,458 parameters. Its name is "flax-cnn".
std::unique_ptr<Sequential> flax_mnist_cnn(Dims input = {28, 28, 1}, int classes = 10);

// The Keras multi-GPU guides' convnet ("keras-convnet"): Conv2D(12, 3x3, no bias) BN ReLU, Conv2D(24, 6x6,
// stride 2, valid, no bias) BN ReLU, Conv2D(32, 6x6, stride 2) BN ReLU, GlobalAveragePooling2D, Dense(256)
// ReLU, Dropout(0.5), Dense(10); BatchNorm with center only (scale=False), glorot_uniform kernels. 49,242
// trainable parameters and 136 moving statistics on (28, 28, 1) inputs. The guides' first layer,
// Rescaling(1 / 255), is left out: the program's images are already scaled to [0, 1] (ensemble/data.h); a
// model for raw pixels puts rescaling(1 / 255.f) first.
std::unique_ptr<Sequential> keras_convnet(Dims input = {28, 28, 1}, int classes = 10);

// The models the program can build by name (--model): "flax-cnn", "keras-convnet". A new one is a factory and a line in the
// registry of model.cpp.
std::vector<std::string> model_names();
// The training recipe a model comes with, which the program uses where its flags leave it open: flax-cnn
// the Flax example's (SGD, momentum 0.9, lr 0.1, batch 128), keras-convnet the Keras guides' (Adam 1e-3,
// batch 64). ValueError naming --model for an unknown name.
struct ModelRecipe {
  std::string optimizer;
  int batch_size;
};
ModelRecipe model_recipe(const std::string& name);
// The model `name` for images of shape `input` and `classes` classes; ValueError naming --model for an
// unknown name.
std::unique_ptr<Sequential> make_model(const std::string& name, Dims input, int classes);

}  // namespace pmap::ensemble
