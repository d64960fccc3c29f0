// ModelRunner: buffer planning (in-place layers share buffers; gradients ping-pong between two
// buffers), and the layer-by-layer forward and backward.
#include <pmapcc/ensemble/runner.h>

#include <algorithm>

#include <pmap/error.h>

namespace pmap::ensemble {

ModelRunner::ModelRunner(const Sequential& model, const kernels::Backend& backend, Device device, int members,
                         int max_batch, int group)
    : model_(model), backend_(backend), device_(device), members_(members), group_(group == 0 ? members : group),
      max_batch_(max_batch) {
  if (backend.kind() != device.kind)
    throw ValueError("ModelRunner: the " + backend.name() + " backend cannot run on " + device.str());
  if (members < 1 || max_batch < 1)
    throw ValueError("ModelRunner: members and max_batch must be >= 1 (got " + std::to_string(members) + ", " +
                     std::to_string(max_batch) + ")");
  if (group_ < 1 || group_ > members)
    throw ValueError("ModelRunner: a group of " + std::to_string(group) + " members is outside 1.." +
                     std::to_string(members) + " (0: all)");
  const std::size_t n_layers = model.layers().size();
  const auto& shapes = model.shapes();
  auto elems = [&](std::size_t i) { return group_ * static_cast<std::int64_t>(max_batch_) * product(shapes[i]); };
  act_.assign(n_layers + 1, nullptr);
  for (std::size_t i = 0; i < n_layers; ++i) {
    if (model.layers()[i]->in_place() && i > 0) {
      act_[i + 1] = act_[i];
      continue;
    }
    storage_.emplace_back(Shape{elems(i + 1)}, DType::f32, device_);
    act_[i + 1] = storage_.back().data<float>();
  }
  const auto& layers = model.layers();
  relu_forward_.assign(n_layers, false);
  relu_backward_.assign(n_layers, false);
  for (std::size_t i = 0; i + 1 < n_layers; ++i)
    relu_forward_[i] = layers[i]->fuses_relu_forward() && layers[i + 1]->is_relu();
  for (std::size_t i = 2; i < n_layers; ++i)
    relu_backward_[i] = layers[i]->fuses_relu_backward() && layers[i - 1]->is_relu() && layers[i - 1]->in_place();
  layer_tensors_.resize(n_layers);
  for (const auto& t : model.tensors()) {
    auto& list = layer_tensors_[static_cast<std::size_t>(t.layer)];
    list.push_back(&t);
    if (list.size() > kMaxLayerTensors)
      throw ValueError("ModelRunner: layer " + layers[static_cast<std::size_t>(t.layer)]->name() + " has more than " +
                       std::to_string(kMaxLayerTensors) + " parameter tensors");
  }
  // Gradient buffers: the input gradients of non-in-place layers alternate between two buffers, each sized
  // for the largest gradient it holds (grad_[L] only anchors the alternation: the caller's dlogits is read
  // directly; grad_[0] is never computed); an in-place layer's input gradient shares its output gradient's;
  // a backward through a ReLU writes over the activation (kOverActivation).
  constexpr int kOverActivation = 2;
  std::vector<int> side(n_layers + 1, 0);
  std::int64_t size[2] = {1, 1};
  for (std::size_t i = n_layers; i-- > 1;) {
    if (relu_backward_[i]) {
      side[i] = kOverActivation;
    } else if (layers[i]->in_place()) {
      side[i] = side[i + 1];
    } else {
      side[i] = side[i + 1] == 0 ? 1 : 0;
    }
    if (side[i] != kOverActivation) size[side[i]] = std::max(size[side[i]], elems(i));
  }
  float* buffer[2];
  for (int k = 0; k < 2; ++k) {
    storage_.emplace_back(Shape{size[k]}, DType::f32, device_);
    buffer[k] = storage_.back().data<float>();
  }
  grad_.assign(n_layers + 1, nullptr);
  for (std::size_t i = 1; i <= n_layers; ++i) grad_[i] = side[i] == kOverActivation ? act_[i] : buffer[side[i]];
  std::size_t ws = 0;
  for (std::size_t i = 0; i < n_layers; ++i)
    ws = std::max(ws, model.layers()[i]->workspace_bytes(backend_, call(i, max_batch_, group_)));
  workspace_ = Array(Shape{static_cast<std::int64_t>(ws)}, DType::u8, device_);
}

LayerCall ModelRunner::call(std::size_t layer, int batch, int members) const {
  return LayerCall{members, batch, model_.shapes()[layer], layer == 0};
}

template <class P>
auto ModelRunner::tensors_of(std::size_t layer, P* base) const -> std::array<P*, kMaxLayerTensors> {
  std::array<P*, kMaxLayerTensors> out{};
  std::size_t k = 0;
  for (const TensorSlot* t : layer_tensors_[layer]) out[k++] = base + t->offset * members_ + first_ * t->size;
  return out;
}

const float* ModelRunner::forward(const float* x, int batch, const float* params, int first, int count) {
  if (batch < 1 || batch > max_batch_)
    throw ShapeError("ModelRunner::forward: batch " + std::to_string(batch) + " is outside 1.." +
                     std::to_string(max_batch_));
  if (first < 0 || count < 1 || count > group_ || first > members_ - count)
    throw ShapeError("ModelRunner::forward: members [" + std::to_string(first) + ", " + std::to_string(first + count) +
                     ") are not a group of at most " + std::to_string(group_) + " of the " +
                     std::to_string(members_) + " members");
  batch_ = batch, first_ = first, count_ = count, params_ = params;
  act_[0] = const_cast<float*>(x);  // read only: layer 0 never runs in place
  for (std::size_t i = 0; i < model_.layers().size(); ++i) {
    if (i > 0 && relu_forward_[i - 1]) continue;  // applied by layer i - 1
    const auto p = tensors_of(i, params);
    LayerCall c = call(i, batch, count_);
    c.relu = relu_forward_[i];
    model_.layers()[i]->forward(backend_, c, p.data(), act_[i], act_[i + 1], workspace_.raw_data());
  }
  return act_.back();
}

void ModelRunner::backward(const float* x, const float* params, const float* dlogits, float* grads) {
  if (batch_ == 0 || act_[0] != x || params_ != params)
    throw Error("ModelRunner::backward: needs the forward of the same batch and parameters first");
  const std::size_t n_layers = model_.layers().size();
  const float* dy = dlogits;
  for (std::size_t i = n_layers; i-- > 0;) {
    if (i + 1 < n_layers && relu_backward_[i + 1]) continue;  // the ReLU that layer i + 1 ran through
    float* dx = i == 0 ? nullptr : grad_[i];
    if (relu_backward_[i]) {
      model_.layers()[i]->backward_through_relu(backend_, call(i, batch_, count_), act_[i], dy, dx);
      dy = dx;
      continue;
    }
    const auto p = tensors_of(i, params);
    const auto g = tensors_of(i, grads);
    model_.layers()[i]->backward(backend_, call(i, batch_, count_), p.data(), act_[i], act_[i + 1], dy, dx, g.data(),
                                 workspace_.raw_data());
    dy = dx;
  }
}

}  // namespace pmap::ensemble
