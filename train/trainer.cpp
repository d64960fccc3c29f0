// Trainer: the options' checks, the members' placement and the epoch loop over the TrainStep.
#include <pmapcc/train/trainer.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pmap/collectives.h>
#include <pmap/error.h>
#include <pmap/pmap.h>
#include <pmapcc/core/batching.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string option(const char* name) { return std::string("train::Trainer: options.") + name; }

// The mesh's first axis (the members' or the batch's), the mesh checked.
std::string axis_of(const Mesh& mesh) {
  if (mesh.axes().size() > 2)
    throw ValueError("train::Trainer: the mesh " + mesh.str() + " has " + std::to_string(mesh.axes().size()) +
                     " axes; the Trainer runs an ensemble or data parallel over the first and splits parameters over " +
                     "a second (options.sharding)");
  return mesh.axes()[0].name;
}

// options.sharding against the mesh: a layout needs a second axis, names only the mesh's axes after the first (an
// output's examples: the first, in data parallel), each axis once.
void check_sharding(const nn::Sharding& sharding, const Mesh& mesh, bool data_parallel) {
  if (sharding.empty()) return;
  const std::string first = mesh.axes()[0].name;
  if (mesh.axes().size() < 2)
    throw ValueError(option("sharding") + " splits parameters, but the mesh " + mesh.str() + " has one axis: " +
                     "tensor parallelism needs a second axis (the ensemble's or the batch's, then the model's)");
  auto check = [&](const std::string& path, const P& spec, const char* field) {
    const bool output = std::string_view(field) == "outputs";  // an output's first dimension is the examples
    const std::string about = option("sharding.") + field + " '" + path + "' is " + spec.str() + ": ";
    std::vector<std::string> seen;
    for (std::size_t d = 0; d < spec.size(); ++d)
      for (const std::string& a : spec.dims()[d].names()) {
        if (std::find(seen.begin(), seen.end(), a) != seen.end())
          throw ValueError(about + "axis '" + a + "' is named twice");
        seen.push_back(a);
        if (output && d == 0) {
          if (a != first || !data_parallel)
            throw ValueError(about + "the examples are split over the batch's axis" +
                             (data_parallel ? " '" + first + "'" : std::string(" (data parallel)")) +
                             " or not at all");
          continue;
        }
        if (a == first)
          throw ValueError(about + "the mesh's first axis '" + first + "' holds the members or the batch; split over '" +
                           mesh.axes()[1].name + "'");
        bool found = false;
        for (const AxisSpec& axis : mesh.axes()) found = found || axis.name == a;
        if (!found)
          throw ValueError(about + "the mesh " + mesh.str() + " has no axis '" + a + "'");
      }
  };
  for (const auto& [path, spec] : sharding.params.by_path()) check(path, spec, "params");
  for (const auto& [path, spec] : sharding.outputs.by_path()) {
    if (!path.ends_with("/output"))
      throw ValueError(option("sharding.outputs") + " names '" + path + "'; an output layout is '<layer>/output'");
    check(path, spec, "outputs");
  }
}

// While it lives, options.cpu_backend computes the calling thread's ops (nothing without one). Every pmap
// body of the Trainer that computes opens one: the scope is the thread's.
std::optional<ops::detail::ScopedBackend> backend_scope(const kernels::Backend* backend) {
  if (backend == nullptr) return std::nullopt;
  return std::optional<ops::detail::ScopedBackend>(std::in_place, *backend);
}

// The per-member values [first, first + count) of a hyper-parameter list (empty stays empty).
std::vector<float> part(const std::vector<float>& v, std::size_t first, std::size_t count) {
  if (v.empty()) return v;
  return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(first),
                            v.begin() + static_cast<std::ptrdiff_t>(first + count));
}

// A view of a's first `rows` rows, in place (a batch's real rows: an evaluation's last batch, a data-parallel
// block that the batch's padding ends).
Array first_rows(const Array& a, std::int64_t rows) {
  Shape shape = a.shape();
  shape[0] = rows;
  return Array::borrow(const_cast<void*>(a.raw_data()), std::move(shape), a.dtype(), a.device());
}

// A call's batches on a feed: what it pushed and has not popped when it ends early (a step or a callback
// raised) is taken off, so that the next call starts on an empty feed.
class FeedUse {
 public:
  explicit FeedUse(Feed<Batch>& feed) : feed_(feed) {}
  FeedUse(const FeedUse&) = delete;
  FeedUse& operator=(const FeedUse&) = delete;
  ~FeedUse() {
    for (; pending_ > 0; --pending_) feed_.pop();
  }
  Batch& next() { return feed_.next(); }
  void push() {
    feed_.push();
    ++pending_;
  }
  const Sharded<Batch>& pop() {
    const Sharded<Batch>& b = feed_.pop();
    --pending_;
    return b;
  }

 private:
  Feed<Batch>& feed_;
  int pending_ = 0;
};

}  // namespace

Trainer::Trainer(Model model, Optimizer optimizer, Mesh mesh, TrainerOptions options, Loss loss)
    : step_(std::move(model), std::move(optimizer), std::move(loss),
            StepOptions{.axis = axis_of(mesh), .data_parallel = options.data_parallel,
                        .member_batch = options.member_batch, .precision = options.precision,
                        .sharding = options.sharding, .graphs = options.graphs}),
      mesh_(std::move(mesh)), options_(std::move(options)) {
  along_ = mesh_.axes()[0].size;
  const int devices = along_;  // the devices the members or the batch are spread over
  const TrainerOptions& o = options_;
  check_sharding(o.sharding, mesh_, o.data_parallel);
  if (o.data_parallel && o.members != 1)
    throw ValueError(option("members") + " is " + std::to_string(o.members) +
                     "; data parallel trains one model (members 1)");
  if (!o.data_parallel && (o.members < 1 || o.members % devices != 0))
    throw ValueError(option("members") + " is " + std::to_string(o.members) + "; it must be a positive multiple of " +
                     "the mesh's " + std::to_string(devices) + " devices" +
                     (mesh_.axes().size() > 1 ? " along '" + mesh_.axes()[0].name + "'" : std::string()));
  if (o.batch_size < 1)
    throw ValueError(option("batch_size") + " is " + std::to_string(o.batch_size) + "; it must be positive");
  if (o.data_parallel && o.batch_size < devices)
    throw ValueError(option("batch_size") + " is " + std::to_string(o.batch_size) + "; data parallel needs at " +
                     "least one example per device (the mesh has " + std::to_string(devices) + ")");
  if (o.data_parallel && !o.sharding.empty() && o.batch_size % devices != 0)
    throw ValueError(option("batch_size") + " is " + std::to_string(o.batch_size) + "; with options.sharding it must " +
                     "split evenly over the " + std::to_string(devices) + " devices of '" + mesh_.axes()[0].name +
                     "' (the collectives over '" + mesh_.axes().back().name + "' take one shape on every device)");
  if (o.eval_batch < 1)
    throw ValueError(option("eval_batch") + " is " + std::to_string(o.eval_batch) + "; it must be positive");
  if (o.report_every < 0)
    throw ValueError(option("report_every") + " is " + std::to_string(o.report_every) + "; 0 (automatic) or more");
  check_hyperparams(o.hyperparams, static_cast<std::size_t>(o.members), option("hyperparams."));
  if (o.cpu_backend != nullptr) {
    if (o.cpu_backend->kind() != DeviceKind::cpu)
      throw ValueError(option("cpu_backend") + " is " + o.cpu_backend->name() +
                       ", which does not compute on host memory; it must compute for CPU devices");
    for (const Device& d : mesh_.devices())
      if (d.kind != DeviceKind::cpu)
        throw ValueError(option("cpu_backend") + " computes for CPU devices, and the mesh " + mesh_.str() +
                         " holds " + d.str());
  }
  if (options_.report_every == 0)
    options_.report_every = mesh_.local_devices()[0].kind == DeviceKind::cpu ? 1 : 16;
  per_device_ = o.data_parallel ? 1 : o.members / devices;

  const auto root = split(key(o.seed), 2);
  data_key_ = root[1];
  const auto keys = split(root[0], static_cast<std::uint32_t>(o.members));
  const std::string axis = step_.options().axis;
  states_ = pmap::pmap([&](int) {
    const auto scope = backend_scope(o.cpu_backend);
    const auto first = o.data_parallel ? std::size_t{0} : static_cast<std::size_t>(axis_index(axis) * per_device_);
    const auto n = static_cast<std::size_t>(per_device_);
    const MemberHyperparams& h = o.hyperparams;
    const MemberHyperparams mine{part(h.learning_rate, first, n), part(h.weight_decay, first, n),
                                 part(h.dropout_rate, first, n)};
    return step_.init(std::span(keys).subspan(first, n), current_device(), mine);
  }, mesh_)(0);
  if (!o.sharding.empty()) {  // the layers' layout errors now, from one inference, rather than at the first step
    const Shape& shape = step_.model().input_shape();
    pmap::pmap([&](const TrainState& s) {
      const auto scope = backend_scope(o.cpu_backend);
      (void)step_.logits(s, Array(Shape{1, shape[0], shape[1], shape[2]}, DType::f32, current_device()));
    }, mesh_)(states_);
  }
  const Shape& in = step_.model().input_shape();
  // Data parallel, a batch that does not split evenly: every device's block padded to the largest.
  const std::int64_t rows = o.data_parallel ? block_rows() * devices : o.batch_size;
  feed_ = std::make_unique<Feed<Batch>>(
      mesh_, Batch{Array(Shape{rows, in[0], in[1], in[2]}, DType::f32), Array(Shape{rows}, DType::i32)},
      o.data_parallel ? FeedLayout::sharded({axis}) : FeedLayout::replicated());
}

Trainer::~Trainer() = default;

std::int64_t Trainer::block_rows() const {
  const std::int64_t devices = along_;
  return (options_.batch_size + devices - 1) / devices;
}

BatchRows Trainer::rows_of(int device) const {
  if (!options_.data_parallel) return {0, options_.batch_size};
  const std::int64_t devices = along_, even = options_.batch_size / devices,
                     extra = options_.batch_size % devices;
  return {device * even + std::min<std::int64_t>(device, extra), options_.batch_size};
}

std::int64_t Trainer::count_of(int device) const {
  if (!options_.data_parallel) return options_.batch_size;
  return rows_of(device + 1).offset - rows_of(device).offset;  // the next block starts where this one ends
}

void Trainer::check_data(const Dataset& data, const char* where) const {
  const Model& m = step_.model();
  const Shape& in = m.input_shape();
  const std::string fn = std::string("train::Trainer::") + where;
  if (data.rows != in[0] || data.cols != in[1] || in[2] != 1)
    throw ValueError(fn + ": the data's images are (" + std::to_string(data.rows) + ", " + std::to_string(data.cols) +
                     "); model '" + m.name() + "' takes (" + std::to_string(in[0]) + ", " + std::to_string(in[1]) +
                     ", " + std::to_string(in[2]) + ")");
  if (data.count < 1 || data.labels.size() != static_cast<std::size_t>(data.count) ||
      data.images.size() != static_cast<std::size_t>(data.count * data.image_size()))
    throw ValueError(fn + ": the data has " + std::to_string(data.count) + " examples, " +
                     std::to_string(data.labels.size()) + " labels and " + std::to_string(data.images.size()) +
                     " pixels; it needs at least one example, its labels and its pixels");
  // A label outside the classes would be read out of range on a GPU, where a kernel cannot raise.
  const auto bad = std::find_if(data.labels.begin(), data.labels.end(),
                                [&](std::uint8_t l) { return l >= m.classes(); });
  if (bad != data.labels.end())
    throw ValueError(fn + ": label " + std::to_string(*bad) + " of example " +
                     std::to_string(bad - data.labels.begin()) + " is not below the " + std::to_string(m.classes()) +
                     " classes of model '" + m.name() + "'");
}

EpochReport Trainer::run_epoch(const Dataset& data, const StepCallback& on_step) {
  check_data(data, "run_epoch");
  const int batch = options_.batch_size;
  if (data.count < batch)
    throw ValueError("train::Trainer::run_epoch: the data has " + std::to_string(data.count) +
                     " examples, fewer than one batch (options.batch_size " + std::to_string(batch) + ")");

  const auto order = permutation(fold_in(data_key_, static_cast<std::uint32_t>(epochs_done_)),
                                 static_cast<std::uint32_t>(data.count));
  const int steps = static_cast<int>(steps_per_epoch(data.count, batch));
  FeedUse feed(*feed_);
  // Data parallel: device d's examples, rows_of(d), at the start of its block of block_rows(), the rest zeros.
  const int blocks = options_.data_parallel ? along_ : 1;
  const std::int64_t block = options_.data_parallel ? block_rows() : batch;
  const auto image_size = static_cast<std::size_t>(data.image_size());
  auto fill = [&](int s) {
    Batch& host = feed.next();
    for (int d = 0; d < blocks; ++d) {
      const auto first = static_cast<std::size_t>(d * block), count = static_cast<std::size_t>(count_of(d));
      float* images = host.images.data<float>() + first * image_size;
      std::int32_t* labels = host.labels.data<std::int32_t>() + first;
      const std::size_t from = static_cast<std::size_t>(s) * batch + static_cast<std::size_t>(rows_of(d).offset);
      gather_batch(data, std::span(order).subspan(from, count), images, labels);
      const std::size_t pad = static_cast<std::size_t>(block) - count;
      std::fill_n(images + count * image_size, pad * image_size, 0.0f);
      std::fill_n(labels + count, pad, 0);
    }
    feed.push();
  };
  const std::string axis = step_.options().axis;
  auto run = pmap::pmap([this, &axis](TrainState& s, const Batch& b) {
    const auto scope = backend_scope(options_.cpu_backend);
    if (!options_.data_parallel) return step_(s, b.images, b.labels);
    const int d = axis_index(AxisNames{axis});
    const std::int64_t n = count_of(d);
    return step_(s, first_rows(b.images, n), first_rows(b.labels, n), rows_of(d));
  }, mesh_);
  // The pending steps' metrics, gathered over the axis at a report point: (devices, members) per step. The
  // steps are summed in one order (step, device, member) whichever the processes, so every process holds the
  // same bits.
  auto gather = pmap::pmap([axis](const std::vector<StepMetrics>& pending) {
    std::vector<StepMetrics> out;
    for (const StepMetrics& p : pending) out.push_back({all_gather(p.loss, {axis}), all_gather(p.correct, {axis})});
    return out;
  }, mesh_);
  std::vector<std::vector<StepMetrics>> pending(static_cast<std::size_t>(mesh_.local_size()));
  const double members = options_.members;
  const double replicas = options_.data_parallel ? 1 : members;  // the member losses a step's loss averages
  double loss_sum = 0, correct = 0;
  const auto t0 = Clock::now();
  EpochReport r{.epoch = epochs_done_ + 1, .steps = steps};
  int reported = 0;
  if (steps > 0) fill(0);
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) fill(s + 1);  // the next batch's copy overlaps this step
    Sharded<StepMetrics> metrics = run(states_, feed.pop());
    for (std::size_t d = 0; d < pending.size(); ++d) pending[d].push_back(std::move(metrics[d]));
    if ((s + 1) % options_.report_every != 0 && s + 1 != steps) continue;
    const auto all = gather(Sharded<std::vector<StepMetrics>>(std::exchange(
        pending, std::vector<std::vector<StepMetrics>>(static_cast<std::size_t>(mesh_.local_size())))));
    for (const StepMetrics& g : all[0]) {
      const auto loss = g.loss.to_vector<float>();
      const auto hits = g.correct.to_vector<std::int32_t>();
      // Data parallel: every device holds the global batch's numbers; the first one's count.
      const std::size_t rows = options_.data_parallel ? 1 : loss.size();
      double step_loss = 0;
      for (std::size_t i = 0; i < rows; ++i) {
        step_loss += loss[i];
        correct += hits[i];
      }
      step_loss /= replicas;
      loss_sum += step_loss;
      ++reported;
      if (on_step) {
        const double secs = seconds_since(t0), images = members * batch * reported;
        on_step(StepReport{reported, steps, step_loss, loss_sum / reported, correct / images,
                           secs > 0 ? images / secs : 0.0});
      }
    }
  }
  r.seconds = seconds_since(t0);
  const double seen = static_cast<double>(steps) * batch * members;
  r.train_loss = steps > 0 ? loss_sum / steps : 0.0;
  r.train_accuracy = steps > 0 ? correct / seen : 0.0;
  r.images_per_second = r.seconds > 0 ? seen / r.seconds : 0.0;
  ++epochs_done_;
  return r;
}

namespace {

// One evaluation batch's sums, all-gathered: each member's calibration sums (devices, members, slots), the
// ensemble's (1, slots) and, for a size curve, the first k members' (1, slots) each.
struct EvalSums {
  Array members;
  Array ensemble;
  std::vector<Array> curve;
  std::vector<Array> predictions;  // the ensemble's predicted, probability, entropy (rows); the votes (M, rows)
};
PMAPCC_TREE(EvalSums, members, ensemble, curve, predictions)

// The calibration sums of the ensembles of the first k members of probs (M, rows, K), k = 1..M: their
// probabilities summed in member order as floats, divided by k.
std::vector<Array> size_curve_sums(const Array& probs, const Array& labels) {
  const std::int64_t rows = probs.dim(1), classes = probs.dim(2);
  std::vector<Array> out;
  Array running;
  for (std::int64_t m = 0; m < probs.dim(0); ++m) {
    const Array member = core::member_view(probs, m);
    running = m == 0 ? member.copy() : ops::eager::add(running, member);
    const Array mean = ops::eager::divide(running, Array::scalar(static_cast<float>(m + 1), probs.device()));
    out.push_back(ops::eager::calibration_sums(ops::eager::reshape(mean, {1, rows, classes}), labels));
  }
  return out;
}

template <class T> void append(std::vector<T>& out, const std::vector<T>& more) {
  out.insert(out.end(), more.begin(), more.end());
}

// sums[i] += batch[offset + i] for each of sums's elements.
void add_to(std::vector<double>& sums, const std::vector<double>& batch, std::size_t offset = 0) {
  for (std::size_t i = 0; i < sums.size(); ++i) sums[i] += batch[offset + i];
}

}  // namespace

Evaluation Trainer::evaluate(const Dataset& data, const EvaluateOptions& options) {
  check_data(data, "evaluate");
  const Shape& in = step_.model().input_shape();
  const int eval_batch = options_.eval_batch;
  if (eval_feed_ == nullptr)
    eval_feed_ = std::make_unique<Feed<Batch>>(
        mesh_, Batch{Array(Shape{eval_batch, in[0], in[1], in[2]}, DType::f32), Array(Shape{eval_batch}, DType::i32)},
        FeedLayout::replicated());
  const std::string axis = step_.options().axis;
  const bool dp = options_.data_parallel;
  const int members = options_.members;
  const Device first_local = mesh_.local_devices()[0];
  auto run = pmap::pmap([&](const TrainState& s, const Batch& b, std::int64_t rows) {
    const auto scope = backend_scope(options_.cpu_backend);
    // The batch's first `rows` rows (the last batch may have fewer), viewed in place.
    const Array x = first_rows(b.images, rows), y = first_rows(b.labels, rows);
    const Array probs = ops::eager::softmax(step_.logits(s, x));  // (members, rows, K)
    Array sum = ops::eager::sum_members(probs);                    // in member order, as floats
    if (!dp) {  // over every member of the mesh (data parallel: the one model)
      psum_inplace(sum, {axis});
      sum = ops::eager::divide(sum, Array::scalar(static_cast<float>(members), sum.device()));
    }
    const Array mean = ops::eager::reshape(sum, {1, rows, sum.dim(1)});
    Array member_sums = ops::eager::calibration_sums(probs, y);
    EvalSums out{dp ? std::move(member_sums) : all_gather(member_sums, {axis}), ops::eager::calibration_sums(mean, y),
                 {}, {}};
    if (!options.size_curve && !options.predictions) return out;
    // Every member's probabilities (members, rows, K), member g at row g: gathered by every device (a
    // collective), read by the first of this process's, whose results the host reads.
    const Array gathered = dp ? Array() : all_gather(probs, {axis}, true);
    if (current_device() != first_local) return out;
    const Array& all = dp ? probs : gathered;
    if (options.size_curve) out.curve = size_curve_sums(all, y);
    if (options.predictions) {
      auto [predicted, probability, entropy] = ops::eager::predictions(mean);
      out.predictions.push_back(ops::eager::reshape(predicted, {rows}));
      out.predictions.push_back(ops::eager::reshape(probability, {rows}));
      out.predictions.push_back(ops::eager::reshape(entropy, {rows}));
      out.predictions.push_back(ops::eager::argmax(all));
    }
    return out;
  }, mesh_);
  const std::size_t slots = kernels::kCalibrationSlots;
  std::vector<std::vector<double>> member(static_cast<std::size_t>(members), std::vector<double>(slots, 0.0));
  std::vector<double> ensemble(slots, 0.0);
  std::vector<std::vector<double>> curve(options.size_curve ? member.size() : 0, std::vector<double>(slots, 0.0));
  Predictions predictions;
  if (options.predictions) predictions.votes.resize(member.size());
  FeedUse feed(*eval_feed_);
  auto fill = [&](std::int64_t begin) {
    const auto n = std::min<std::int64_t>(eval_batch, data.count - begin);
    std::vector<std::uint32_t> idx(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) idx[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(begin + i);
    Batch& host = feed.next();
    gather_batch(data, idx, host.images.data<float>(), host.labels.data<std::int32_t>());
    feed.push();
  };
  fill(0);
  for (std::int64_t begin = 0; begin < data.count; begin += eval_batch) {
    if (begin + eval_batch < data.count) fill(begin + eval_batch);  // the next batch's copy overlaps this one
    const auto res = run(states_, feed.pop(), std::min<std::int64_t>(eval_batch, data.count - begin));
    const auto m = res[0].members.to_vector<double>();  // (devices, members, slots), member g at row g
    for (std::size_t g = 0; g < member.size(); ++g)
      add_to(member[g], m, g * slots);
    add_to(ensemble, res[0].ensemble.to_vector<double>());
    for (std::size_t k = 0; k < curve.size(); ++k) add_to(curve[k], res[0].curve[k].to_vector<double>());
    if (options.predictions) {
      const std::vector<Array>& p = res[0].predictions;
      const auto rows = static_cast<std::size_t>(p[0].size());
      const auto first = data.labels.begin() + static_cast<std::ptrdiff_t>(begin);
      predictions.label.insert(predictions.label.end(), first, first + static_cast<std::ptrdiff_t>(rows));
      append(predictions.predicted, p[0].to_vector<std::int32_t>());
      append(predictions.probability, p[1].to_vector<float>());
      append(predictions.entropy, p[2].to_vector<float>());
      const auto votes = p[3].to_vector<std::int32_t>();  // (members, rows)
      for (std::size_t g = 0; g < predictions.votes.size(); ++g)
        predictions.votes[g].insert(predictions.votes[g].end(), votes.begin() + static_cast<std::ptrdiff_t>(g * rows),
                                    votes.begin() + static_cast<std::ptrdiff_t>((g + 1) * rows));
    }
  }
  Evaluation e{.examples = data.count};
  for (const auto& sums : member) {
    e.member_accuracy.push_back(accuracy_from_sums(sums));
    e.member_calibration.push_back(calibration_from_sums(sums));
    e.loss += e.member_calibration.back().nll / members;
  }
  e.ensemble_accuracy = accuracy_from_sums(ensemble);
  e.ensemble_calibration = calibration_from_sums(ensemble);
  for (std::size_t k = 0; k < curve.size(); ++k)
    e.size_curve.push_back({static_cast<int>(k + 1), accuracy_from_sums(curve[k]), calibration_from_sums(curve[k])});
  e.predictions = std::move(predictions);
  return e;
}

bool Trainer::shared_leaf(const std::string& name) const {
  if (!step_.optimizer().elementwise()) return false;
  for (const std::string& p : step_.model().param_names())
    if (name.size() > p.size() && name.ends_with(p) && name[name.size() - p.size() - 1] == '/') return false;
  return true;
}

AxisNames Trainer::all_axes() const {
  std::vector<std::string> names;
  for (const AxisSpec& a : mesh_.axes()) names.push_back(a.name);
  return AxisNames(names);
}

P Trainer::spec_of(Variables TrainState::*role, const std::string& name) const {
  const auto& specs = options_.sharding.params.by_path();
  if (specs.empty() || (role != &TrainState::params && role != &TrainState::opt)) return P();
  // The parameter: the leaf itself, or the one an optimizer leaf ("trace/Dense_0/kernel") is of, the longest of
  // the model's names it ends with after a '/' (so "Block_0/Dense_0/kernel" is not "Dense_0/kernel").
  const std::string* param = nullptr;
  for (const std::string& p : step_.model().param_names()) {
    const bool of = role == &TrainState::params
                        ? name == p
                        : name.size() > p.size() && name.ends_with(p) && name[name.size() - p.size() - 1] == '/';
    if (of && (param == nullptr || p.size() > param->size())) param = &p;
  }
  if (param == nullptr) return P();
  const auto it = specs.find(*param);
  return it == specs.end() ? P() : it->second;
}

Variables Trainer::gathered(Variables TrainState::*role) const {
  const std::string axis = step_.options().axis;
  const bool dp = options_.data_parallel, opt = role == &TrainState::opt;
  auto all = pmap::pmap([&](const TrainState& s) {
    Variables out;
    for (const auto& [name, a] : s.*role) {
      if (opt && shared_leaf(name)) {
        out.emplace(name, a.copy());
        continue;
      }
      // A split leaf's blocks first (dimension d of a member is d + 1 of the stacked leaf), then the members.
      const P spec = spec_of(role, name);
      Array whole;
      for (std::size_t d = 0; d < spec.size(); ++d)
        if (!spec.dims()[d].empty())
          whole = all_gather(whole.valid() ? whole : a, spec.dims()[d], static_cast<int>(d + 1), true);
      const Array& member_rows = whole.valid() ? whole : a;
      out.emplace(name, dp ? member_rows.copy() : all_gather(member_rows, {axis}, true));
    }
    return out;
  }, mesh_)(states_);
  Variables host;
  for (const auto& [name, a] : all[0]) host.emplace(name, a.to(Device{}));
  return host;
}

void Trainer::put(Variables TrainState::*role, const Variables& host) {
  const std::string axis = step_.options().axis;
  const auto n = static_cast<std::int64_t>(per_device_);
  const bool opt = role == &TrainState::opt;
  pmap::pmap([&](TrainState& s) {
    const std::int64_t row = options_.data_parallel ? 0 : axis_index(axis) * n;
    for (auto& [name, a] : s.*role) {
      const Array& all = host.at(name);
      if (opt && shared_leaf(name)) {
        a.copy_from(all);
        continue;
      }
      Array rows = all.slice_rows(row, row + n, Device{});
      const P spec = spec_of(role, name);
      if (!spec.replicated()) rows = detail::block_of(name, rows, spec, 1);  // this device's block of a split leaf
      a.copy_from(rows);
    }
  }, mesh_)(states_);
}

void Trainer::set_members(const Variables& params, const Variables& state, const std::vector<int>& members) {
  const std::string fn = "train::Trainer::set_members: ";
  for (const int g : members)
    if (g < 0 || g >= options_.members)
      throw ValueError(fn + "member " + std::to_string(g) + " is not among the " + std::to_string(options_.members) +
                       " members");
  // Both roles checked and patched on the host before either reaches the devices.
  Variables all[2] = {gathered(&TrainState::params), gathered(&TrainState::state)};
  const Variables* given[2] = {&params, &state};
  const char* what[2] = {"params", "state"};
  for (int r = 0; r < 2; ++r) {
    for (auto& [name, a] : all[r]) {
      const auto it = given[r]->find(name);
      if (it == given[r]->end()) throw ValueError(fn + what[r] + " has no tensor '" + name + "'");
      const Array& from = it->second;
      if (from.shape() != a.shape() || from.dtype() != a.dtype())
        throw ValueError(fn + what[r] + " tensor '" + name + "' is " + from.signature() + "; it must be " +
                         a.signature());
      if (from.device().kind != DeviceKind::cpu)
        throw ValueError(fn + what[r] + " tensor '" + name + "' is on " + from.device().str() +
                         "; it must be on the host");
      const std::size_t row = a.nbytes() / static_cast<std::size_t>(a.dim(0));
      for (const int g : members)
        std::memcpy(static_cast<std::byte*>(a.raw_data()) + row * static_cast<std::size_t>(g),
                    static_cast<const std::byte*>(from.raw_data()) + row * static_cast<std::size_t>(g), row);
    }
    if (given[r]->size() != all[r].size()) throw ValueError(fn + what[r] + " has tensors the model does not");
  }
  put(&TrainState::params, all[0]);
  put(&TrainState::state, all[1]);
}

Variables Trainer::params() const { return gathered(&TrainState::params); }
Variables Trainer::model_state() const { return gathered(&TrainState::state); }
Variables Trainer::optimizer_state() const { return gathered(&TrainState::opt); }

std::int64_t Trainer::step() const { return states_[0].step.to_vector<std::int64_t>()[0]; }

}  // namespace pmap::train
