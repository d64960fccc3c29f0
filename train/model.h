// Model: what the Trainer trains, a model written as module code (nn/) behind one type. A model is two
// functions over one member's variables: init(key, device) -> (parameters, model state) and apply(parameters,
// model state, x, call) -> (logits, new model state), Flax's init and apply(..., mutable=["batch_stats"]).
// Write them with typed structs of nn/'s modules and make_model turns them into a Model (the variables
// named by the structs' paths: "Conv_0/kernel", "BatchNorm_0/moving_mean"); apply is differentiated by grad
// and batched over stacked members by vmap, like any function of pmap::ops.
//
//   struct P { nn::DenseParams Dense_0; };  PMAPCC_TREE(P, Dense_0)
//   const nn::Dense dense{.features = 10};
//   train::Model m = train::make_model<P>("linear", {28, 28, 1}, 10,
//       [](Key k, const Device& d) { return std::pair{P{dense.init(fold_in(k, 0), 784, d)}, train::NoState{}}; },
//       [](const P& p, const train::NoState& s, const Array& x, const train::Call&) {
//         return std::pair{dense(p.Dense_0, ops::reshape(x, {x.dim(0), 784})), s};
//       });
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/random.h>

#include <pmapcc/core/ops.h>
#include <pmapcc/nn/normalization.h>
#include <pmapcc/nn/parallel.h>
#include <pmapcc/train/variables.h>

namespace pmap::train {

using NoState = std::tuple<>;  // the model state of a model without any (a tree without leaves)

// What one apply is asked for: training (batch statistics, dropout) or inference, the dropout masks' source
// (nn::Rng; read only in training), and the mesh axes BatchNorm's batch statistics are taken over besides the
// device's rows (data parallel: the batch's axis, so the statistics are the global batch's).
struct Call {
  bool train = false;
  nn::Rng rng;
  AxisNames batch_axis;
  // Training: the member's dropout rate (one f32 value on the device) for the model's Dropout layers, in place
  // of their own (a hyper-parameter ensemble's; pass it as nn::DropoutCall::rate); null: their own rates.
  const Array* dropout_rate = nullptr;
  // Training over batch_axis: the examples of every device's batch together, when they differ in size (a
  // data-parallel batch that does not split evenly); 0 when they are equal. A model must pass it to each
  // nn::BatchNormCall::batch_examples (its BatchNorm's statistics are otherwise wrong on such batches, without
  // an error), of a BatchNorm whose input's first dimension is the examples.
  std::int64_t batch_examples = 0;
  // Tensor parallelism: the layout the parameters are split by (each device holds its blocks) and the layers'
  // output layouts, for the model's nn::TensorParallel (nn/parallel.h); null: nothing split.
  const nn::Sharding* sharding = nullptr;
};

class Model {
 public:
  using Init = std::function<std::pair<Variables, Variables>(Key, const Device&)>;
  using Apply =
      std::function<std::pair<Array, Variables>(const Variables&, const Variables&, const Array&, const Call&)>;

  // `input` the per-example shape (H, W, C), `classes` the logits' last dimension; the names of the
  // parameters and of the model state in model order (what summaries and checkpoints list); how many
  // nn::Dropout layers apply runs, each of which it must give Call::dropout_rate (nn::DropoutCall::rate):
  // 0 declares none, and TrainStep then refuses per-member dropout rates (a model that runs Dropout without
  // passing the rate on would ignore them).
  Model(std::string name, Shape input, int classes, std::vector<std::string> param_names,
        std::vector<std::string> state_names, Init init, Apply apply, int dropout_layers = 0);

  const std::string& name() const { return name_; }
  const Shape& input_shape() const { return input_; }
  int classes() const { return classes_; }
  const std::vector<std::string>& param_names() const { return param_names_; }
  const std::vector<std::string>& state_names() const { return state_names_; }
  int dropout_layers() const { return dropout_layers_; }

  // One member's (parameters, model state) from its key, on `device`. ValueError when init's tensors are not
  // the names the model was made with.
  std::pair<Variables, Variables> init(Key key, const Device& device = {}) const;
  // Logits (N, classes) of x (N, input...) and the new model state (the given one in inference).
  std::pair<Array, Variables> apply(const Variables& params, const Variables& state, const Array& x,
                                    const Call& call) const;
  // Keras's model.summary() table: one row per nn/ module call of one inference apply on one image (on the
  // host): its name (the prefix of the tensors it read, "Conv_0", several joined by '+'; the kind for a
  // module that read none of the model's, "dropout"), what it is, its output shape (None, ...) and how many
  // elements those tensors hold; then the totals (the model state is the non-trainable part). The tensors
  // no module read (ones the model uses with ops directly) get a row per prefix, "not read by a module".
  // Ops between modules (pooling, reshapes) have no row.
  std::string summary() const;
  // What checkpoints record of the model, to refuse one of another model under the same name: its input shape
  // "(28, 28, 1)", then one "name=description" per row of summary() ("Conv_0=Conv2D(32, 3x3, relu)").
  std::vector<std::string> architecture() const;

 private:
  struct Rows;
  Rows summary_rows() const;
  std::string name_;
  Shape input_;
  int classes_;
  std::vector<std::string> param_names_, state_names_;
  Init init_;
  Apply apply_;
  int dropout_layers_ = 0;
};

// One row of a summary table: "name (description)", the output shape "(None, ...)", the parameter count.
struct SummaryRow {
  std::string layer;
  std::string output;
  std::int64_t params = 0;
};
// Keras's model.summary() layout: 'Model: "name"', the rows in a box, then the total, trainable and
// non-trainable (`fixed`) counts with their f32 sizes.
std::string summary_table(const std::string& model, const std::vector<SummaryRow>& rows, std::int64_t trainable,
                          std::int64_t fixed);

// A Model from typed module code: init(key, device) -> std::pair<P, S>, apply(p, s, x, call) -> std::pair<Array,
// S>, P and S PMAPCC_TREE structs of fixed Array fields (S NoState for a model without state; Model::init
// refuses a struct whose leaves are not the ones a default-constructed one names). dropout_layers: how many
// nn::Dropout layers apply runs with Call::dropout_rate (Model's constructor).
template <class P, class S = NoState, class InitFn, class ApplyFn>
Model make_model(std::string name, Shape input, int classes, InitFn init, ApplyFn apply, int dropout_layers = 0) {
  return Model(
      std::move(name), std::move(input), classes, variable_names<P>(), variable_names<S>(),
      [init](Key key, const Device& d) {
        auto [p, s] = init(key, d);
        return std::pair{to_variables(std::move(p)), to_variables(std::move(s))};
      },
      [apply](const Variables& p, const Variables& s, const Array& x, const Call& call) {
        auto [y, next] = apply(from_variables<P>(p, "parameters"), from_variables<S>(s, "model state"), x, call);
        Variables state = to_variables(std::move(next));
        for (auto& entry : state)  // a leaf handed back as it came (inference) is a view of the caller's
          if (entry.second.valid() && !entry.second.owns_data()) entry.second = ops::copy(entry.second);
        return std::pair{std::move(y), std::move(state)};
      },
      dropout_layers);
}

// The Flax MNIST CNN ("flax-cnn"): Conv(32, 3x3, SAME) ReLU AvgPool(2) Conv(64, 3x3, SAME) ReLU AvgPool(2)
// Flatten Dense(256) ReLU Dense(classes); LeCun-normal kernels, zero biases. 824,458 parameters on (28, 28, 1).
// Tensor t (in the order Conv_0/kernel, Conv_0/bias, Conv_1/kernel, ...) is drawn from fold_in(key, t), as the
// program has always drawn it. Its Conv and Dense layers run as Call::sharding splits them (nn::TensorParallel).
Model flax_cnn(Shape input = {28, 28, 1}, int classes = 10);

// The Keras multi-GPU guides' convnet ("keras-convnet"): Conv2D(12, 3x3, no bias) BN ReLU, Conv2D(24, 6x6,
// stride 2, valid, no bias) BN ReLU, Conv2D(32, 6x6, stride 2) BN ReLU, GlobalAveragePooling2D, Dense(256)
// ReLU, Dropout(dropout), Dense(classes); BatchNorm center only, glorot_uniform kernels. 49,242 parameters
// and 136 moving statistics on (28, 28, 1). Images come scaled to [0, 1], so the guides' Rescaling is left out.
// Its Conv and Dense layers run as Call::sharding splits them (nn::TensorParallel); the BatchNorms take whole
// features (a split convolution's are gathered first) and their weights whole; Dropout's masks are the unsplit
// model's.
Model keras_convnet(Shape input = {28, 28, 1}, int classes = 10, float dropout = 0.5f);

// The models the program builds by name (--model): "flax-cnn", "keras-convnet"; ValueError naming `what`
// (the caller's option) for another name.
std::vector<std::string> model_names();
Model model_by_name(const std::string& name, Shape input, int classes, const char* what = "model");

}  // namespace pmap::train
