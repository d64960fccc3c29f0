// ModelRunner: buffer planning (in-place layers share buffers; gradients ping-pong between two
// buffers), the compilation of the passes into steps, and forward and backward as loops over the steps.
#include <pmapcc/ensemble/runner.h>

#include <algorithm>

#include <pmap/collectives.h>
#include <pmap/error.h>

namespace pmap::ensemble {

ModelRunner::ModelRunner(const Sequential& model, const kernels::Backend& backend, Device device, int members,
                         int max_batch, int group, RunnerSplit split, kernels::Precision precision)
    : model_(model), backend_(backend), device_(device), members_(members), group_(group == 0 ? members : group),
      max_batch_(max_batch), split_(std::move(split)), precision_(precision) {
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
  if (!split_.layers.empty() && split_.layers.size() != n_layers)
    throw ValueError("ModelRunner: the split has " + std::to_string(split_.layers.size()) + " layers, the model " +
                     std::to_string(n_layers));
  split_.layers.resize(n_layers);
  // The input batch is one for every member, and so is the output of the layers that keep it (Sequential
  // allows such layers only before its first parameterized one).
  shared_.assign(n_layers + 1, false);
  shared_[0] = true;
  for (std::size_t i = 0; i < n_layers; ++i)
    shared_[i + 1] = shared_[i] && model.layers()[i]->keeps_shared() && model.layers()[i]->params(shapes[i]).empty();
  auto elems = [&](std::size_t i) {
    return (shared_[i] ? 1 : group_) * static_cast<std::int64_t>(max_batch_) * product(shapes[i]);
  };
  act_.assign(n_layers + 1, nullptr);
  act_store_.assign(n_layers + 1, -1);
  for (std::size_t i = 0; i < n_layers; ++i) {
    if (model.layers()[i]->in_place() && i > 0) {
      act_[i + 1] = act_[i];
      act_store_[i + 1] = act_store_[i];
      continue;
    }
    storage_.emplace_back(Shape{elems(i + 1)}, DType::f32, device_);
    act_[i + 1] = storage_.back().data<float>();
    act_store_[i + 1] = static_cast<int>(storage_.size()) - 1;
  }
  const auto& layers = model.layers();
  // relu_forward[i]: layer i applies the ReLU i + 1 in its forward; relu_backward[i]: layer i's backward runs
  // through the ReLU i - 1, writing its input gradient over act_[i].
  std::vector<bool> relu_forward(n_layers, false), relu_backward(n_layers, false);
  std::int64_t zero_bias = 0;
  for (std::size_t i = 0; i + 1 < n_layers; ++i)  // a row-parallel layer's outputs are partial sums until the psum
    relu_forward[i] = layers[i]->fuses_relu_forward() && layers[i + 1]->is_relu() &&
                      split_.layers[i].kind != LayerSplit::Kind::row;
  for (std::size_t i = 0; i < n_layers; ++i)
    if (split_.layers[i].kind == LayerSplit::Kind::row)
      zero_bias = std::max(zero_bias, group_ * product(shapes[i + 1]));
  zero_bias_ = Array(Shape{zero_bias}, DType::f32, device_);  // zero-filled
  for (std::size_t i = 2; i < n_layers; ++i)
    relu_backward[i] = layers[i]->fuses_relu_backward() && layers[i - 1]->is_relu() && layers[i - 1]->in_place();
  layer_tensors_.resize(n_layers);
  layer_state_.resize(n_layers);
  for (auto [layout, lists] : {std::pair{&model.params_layout(), &layer_tensors_}, {&model.state_layout(), &layer_state_}})
    for (const auto& t : layout->tensors) {
      auto& list = (*lists)[static_cast<std::size_t>(t.layer)];
      list.push_back(&t);
      if (list.size() > kMaxLayerTensors)
        throw ValueError("ModelRunner: layer " + layers[static_cast<std::size_t>(t.layer)]->name() + " has more than " +
                         std::to_string(kMaxLayerTensors) + " tensors of one kind");
    }
  std::uint32_t streams = 0;
  stream_.assign(n_layers, 0);
  layer_buffers_.resize(n_layers);
  for (std::size_t i = 0; i < n_layers; ++i) {
    if (layers[i]->random()) stream_[i] = streams++, random_ = true;
    trains_differently_ = trains_differently_ || layers[i]->random() || !layer_state_[i].empty();
    for (const BufferSpec& b : layers[i]->buffers(call(i, max_batch_, group_)))
      layer_buffers_[i].emplace_back(Shape{b.count}, b.dtype, device_);
  }
  if (!split_.batch_axis.empty())
    context_.batch_sum = [axis = split_.batch_axis](Array& a) { psum_inplace(a, axis); };
  // Gradient buffers: the input gradients of non-in-place layers alternate between two buffers, each sized
  // for the largest gradient it holds (grad_[L] only anchors the alternation: the caller's dlogits is read
  // directly; grad_[0] is never computed); an in-place layer's input gradient shares its output gradient's;
  // a backward through a ReLU writes over the activation (kOverActivation).
  constexpr int kOverActivation = 2;
  std::vector<int> side(n_layers + 1, 0);
  std::int64_t size[2] = {1, 1};
  for (std::size_t i = n_layers; i-- > 1;) {
    if (relu_backward[i]) {
      side[i] = kOverActivation;
    } else if (layers[i]->in_place()) {
      side[i] = side[i + 1];
    } else {
      side[i] = side[i + 1] == 0 ? 1 : 0;
    }
    if (side[i] != kOverActivation) size[side[i]] = std::max(size[side[i]], elems(i));
  }
  float* buffer[2];
  int store[2];
  for (int k = 0; k < 2; ++k) {
    storage_.emplace_back(Shape{size[k]}, DType::f32, device_);
    buffer[k] = storage_.back().data<float>();
    store[k] = static_cast<int>(storage_.size()) - 1;
  }
  grad_.assign(n_layers + 1, nullptr);
  grad_store_.assign(n_layers + 1, -1);
  for (std::size_t i = 1; i <= n_layers; ++i) {
    grad_[i] = side[i] == kOverActivation ? act_[i] : buffer[side[i]];
    grad_store_[i] = side[i] == kOverActivation ? act_store_[i] : store[side[i]];
  }
  std::size_t ws = 0;
  for (std::size_t i = 0; i < n_layers; ++i)
    ws = std::max(ws, model.layers()[i]->workspace_bytes(backend_, call(i, max_batch_, group_)));
  workspace_ = Array(Shape{static_cast<std::int64_t>(ws)}, DType::u8, device_);
  compile(relu_forward, relu_backward);
}

void ModelRunner::compile(const std::vector<bool>& relu_forward, const std::vector<bool>& relu_backward) {
  using Kind = LayerSplit::Kind;
  const std::size_t n_layers = model_.layers().size();
  auto split_step = [&](std::size_t i) {
    RunnerStep s;
    s.layer = i;
    if (split_.layers[i].kind != Kind::whole) s.axis = split_.layers[i].axis;
    return s;
  };
  for (std::size_t i = 0; i < n_layers; ++i) {
    if (i > 0 && relu_forward[i - 1]) continue;  // applied by layer i - 1
    RunnerStep s = split_step(i);
    const Kind kind = split_.layers[i].kind;
    s.fused_relu = relu_forward[i];
    s.block = kind == Kind::blocks || kind == Kind::gather;
    s.bias_on_first = kind == Kind::row && !layer_tensors_[i].empty() && layer_tensors_[i].back()->is_bias;
    s.gather = kind == Kind::gather;
    if (kind == Kind::row) s.after = RunnerStep::Collective::psum_output;
    forward_steps_.push_back(s);
  }
  for (std::size_t i = n_layers; i-- > 0;) {
    if (i + 1 < n_layers && relu_backward[i + 1]) continue;  // the ReLU that layer i + 1 runs through
    if (shared_[i + 1]) break;  // this layer and those before it keep the shared batch: nothing to train
    RunnerStep s = split_step(i);
    const Kind kind = split_.layers[i].kind;
    s.input_grad = !shared_[i];
    s.fused_relu = relu_backward[i];
    s.block = !s.fused_relu && (kind == Kind::blocks || kind == Kind::gather);
    if (!s.fused_relu && s.input_grad && kind == Kind::column) s.after = RunnerStep::Collective::psum_input_grad;
    backward_steps_.push_back(s);
  }
}

const std::string& ModelRunner::axis_of(const RunnerStep& step) const {
  return split_.axes.at(static_cast<std::size_t>(step.axis));
}

LayerCall ModelRunner::call(std::size_t layer, int batch, int members) {
  LayerCall c{members, batch, model_.shapes()[layer], shared_[layer]};
  c.buffers = layer_buffers_.size() > layer ? layer_buffers_[layer].data() : nullptr;
  c.context = &context_;
  c.stream = stream_.size() > layer ? stream_[layer] : 0;
  c.precision = precision_;
  return c;
}

template <class P>
auto ModelRunner::tensors_of(const std::vector<const TensorSlot*>& list, P* base) const
    -> std::array<P*, kMaxLayerTensors> {
  std::array<P*, kMaxLayerTensors> out{};
  std::size_t k = 0;
  for (const TensorSlot* t : list) out[k++] = base + t->offset * members_ + first_ * t->size;
  return out;
}

std::array<float*, ModelRunner::kMaxLayerTensors> ModelRunner::state_of(std::size_t layer) {
  if (layer_state_[layer].empty()) return {};
  return tensors_of(layer_state_[layer], run_.state);
}

const float* ModelRunner::forward(const float* x, int batch, const float* params, int first, int count,
                                  const RunArgs& run) {
  if (batch < 1 || batch > max_batch_)
    throw ShapeError("ModelRunner::forward: batch " + std::to_string(batch) + " is outside 1.." +
                     std::to_string(max_batch_));
  if (first < 0 || count < 1 || count > group_ || first > members_ - count)
    throw ShapeError("ModelRunner::forward: members [" + std::to_string(first) + ", " + std::to_string(first + count) +
                     ") are not a group of at most " + std::to_string(group_) + " of the " +
                     std::to_string(members_) + " members");
  if (model_.state_per_member() > 0 && run.state == nullptr)
    throw ValueError("ModelRunner::forward: model " + model_.name() + " has state (RunArgs::state is null)");
  if (run.training && random_ && (run.keys == nullptr || run.step == nullptr))
    throw ValueError("ModelRunner::forward: training model " + model_.name() + " needs RunArgs::keys and step");
  batch_ = batch, first_ = first, count_ = count, params_ = params, run_ = run;
  context_.training = run.training;
  context_.keys = run.keys == nullptr ? nullptr : run.keys + 2 * static_cast<std::ptrdiff_t>(first);
  context_.step = run.step;
  context_.dropout_rates = run.dropout_rates == nullptr ? nullptr : run.dropout_rates + first;
  context_.example_offset = run.example_offset;
  context_.batch_devices = split_.batch_axis.empty() ? 1 : axis_size(split_.batch_axis);
  act_[0] = const_cast<float*>(x);  // read only: layer 0 never runs in place
  for (const RunnerStep& s : forward_steps_) {
    const std::size_t i = s.layer;
    auto p = tensors_of(layer_tensors_[i], params);
    const auto st = state_of(i);
    LayerCall c = call(i, batch, count_);
    c.relu = s.fused_relu;
    c.state = st.data();
    if (s.block) c.block = axis_index(axis_of(s));
    // The psum adds every device's partial outputs: the bias (the layer's last tensor) must count once.
    if (s.bias_on_first && axis_index(axis_of(s)) != 0) p[layer_tensors_[i].size() - 1] = zero_bias_.data<float>();
    if (s.gather) {
      gather_features(s);
      continue;
    }
    model_.layers()[i]->forward(backend_, c, p.data(), act_[i], act_[i + 1], workspace_.raw_data());
    if (s.after == RunnerStep::Collective::psum_output)
      psum_inplace(storage_[static_cast<std::size_t>(act_store_[i + 1])], axis_of(s));
  }
  return act_.back();
}

void ModelRunner::gather_features(const RunnerStep& s) {
  // The input (members, batch, ..., block) as rows of one block: gathered along the last axis, each row
  // holds every device's block in axis order, which is the layer's output.
  const Dims& in = model_.shapes()[s.layer];
  const std::int64_t block = in.back();
  const std::int64_t rows = std::int64_t{count_} * batch_ * product(in) / block;
  const Array x = Array::borrow(act_[s.layer], Shape{rows, block}, DType::f32, device_);
  const Array y = all_gather(x, axis_of(s), -1, /*tiled=*/true);
  backend_.copy(act_[s.layer + 1], y.raw_data(), y.nbytes());
}

void ModelRunner::backward(const float* x, const float* params, const float* dlogits, float* grads) {
  if (batch_ == 0 || act_[0] != x || params_ != params)
    throw Error("ModelRunner::backward: needs the forward of the same batch and parameters first");
  if (trains_differently_ && !run_.training)
    throw Error("ModelRunner::backward: model " + model_.name() + " needs a training forward first");
  const float* dy = dlogits;
  for (const RunnerStep& s : backward_steps_) {
    const std::size_t i = s.layer;
    float* dx = s.input_grad ? grad_[i] : nullptr;
    LayerCall c = call(i, batch_, count_);
    if (s.fused_relu) {
      model_.layers()[i]->backward_through_relu(backend_, c, act_[i], dy, dx);
    } else {
      const auto p = tensors_of(layer_tensors_[i], params);
      const auto g = tensors_of(layer_tensors_[i], grads);
      const auto st = state_of(i);
      c.state = st.data();
      if (s.block) c.block = axis_index(axis_of(s));
      model_.layers()[i]->backward(backend_, c, p.data(), act_[i], act_[i + 1], dy, dx, g.data(),
                                   workspace_.raw_data());
      if (s.after == RunnerStep::Collective::psum_input_grad)
        psum_inplace(storage_[static_cast<std::size_t>(grad_store_[i])], axis_of(s));
    }
    dy = dx;
  }
}

}  // namespace pmap::ensemble
