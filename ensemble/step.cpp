// train_step and eval_step: forward, loss, backward, [pmean of gradients], the optimizer's update; the ensemble's
// probability averaging across the mesh axis; the per-member metrics, all on the device.
#include <pmapcc/ensemble/step.h>

#include <pmap/collectives.h>
#include <pmap/error.h>

#include <algorithm>
#include <bit>

namespace pmap::ensemble {
namespace {

int classes_of(const Sequential& m) { return static_cast<int>(product(m.output_shape())); }

std::size_t xent_workspace_bytes(const kernels::Backend& be, int group, int rows, int classes) {
  return be.loss().softmax_cross_entropy_workspace_bytes(kernels::SoftmaxXentParams{group, rows, classes, true});
}

// Calibration sums of a piece's group of members, or of the ensemble over a whole eval batch.
std::size_t calibration_workspace_bytes(const kernels::Backend& be, int group, int rows, int eval_rows, int classes) {
  const kernels::MetricOps& metrics = be.metrics();
  return std::max(metrics.calibration_workspace_bytes(kernels::CalibrationParams{group, rows, classes}),
                  metrics.calibration_workspace_bytes(kernels::CalibrationParams{1, eval_rows, classes}));
}

constexpr std::int64_t kSlots = kernels::kCalibrationSlots;

// The rows of a batch on this device, checked against the buffers sized for them.
int rows_of(const Batch& b, const DeviceWork& work, const char* step) {
  const auto rows = b.images.ndim() == 0 ? 0 : b.images.shape()[0];
  const std::int64_t example = product(work.runner.model().input_shape());
  if (b.images.dtype() != DType::f32 || b.labels.dtype() != DType::i32 || b.labels.ndim() != 1 ||
      b.labels.shape()[0] != rows || rows * example != b.images.size())
    throw ShapeError(std::string(step) + ": the batch is " + b.images.str() + " images and " + b.labels.str() +
                     " labels; this model takes f32 (N, " + std::to_string(example) + " values) and i32 (N)");
  return static_cast<int>(rows);
}

void update(TrainState& state, DeviceWork& work, const StepOptions& opt) {
  optimizer_step(*opt.optimizer, opt.update, work.backend.optimizer(), work.runner.model(), work.optimizer, state,
                 work.train.grads.data<float>());
}

}  // namespace

int default_member_group(const Device& device, int members) { return device.is_cpu() ? 1 : members; }

namespace {

// Whether a training forward sums over the batch's devices (BatchNorm): a collective that meets the other
// devices on the host, so such a step is not captured.
bool syncs_batch(const Sequential& model) {
  return std::any_of(model.layers().begin(), model.layers().end(),
                     [](const auto& l) { return l->syncs_batch(); });
}

bool splits_any(const RunnerSplit& split) {
  return std::any_of(split.layers.begin(), split.layers.end(),
                     [](const LayerSplit& s) { return s.kind != LayerSplit::Kind::whole; });
}

}  // namespace

TrainWork::TrainWork(const kernels::Backend& be, Device device, int members, int group, int max_rows, int classes,
                     std::int64_t params_per_member, int log_rows)
    : grads(Shape{members * params_per_member}, DType::f32, device),
      keys(Shape{members, 2}, DType::u32, device),
      dropout_rates(Shape{members}, DType::f32, device),
      dlogits(Shape{group, max_rows, classes}, DType::f32, device),
      xent_ws(Shape{static_cast<std::int64_t>(xent_workspace_bytes(be, group, max_rows, classes))}, DType::u8, device),
      step_loss(Shape{members}, DType::f32, device),
      step_correct(Shape{members}, DType::i32, device),
      log{Array(Shape{log_rows, members}, DType::f32, device), Array(Shape{log_rows, members}, DType::i32, device),
          Array(Shape{1}, DType::i32, device)} {
  if (log_rows < 1) throw ValueError("TrainWork: log_rows must be >= 1, got " + std::to_string(log_rows));
}

EvalWork::EvalWork(const kernels::Backend& be, Device device, int members, int group, int max_rows,
                   int max_eval_batch, int classes)
    : piece_probs(Shape{group, max_rows, classes}, DType::f32, device),
      piece_loss(Shape{members}, DType::f32, device),
      piece_correct(Shape{members}, DType::i32, device),
      xent_ws(Shape{static_cast<std::int64_t>(xent_workspace_bytes(be, group, max_rows, classes))}, DType::u8, device),
      loss_sum(Shape{members}, DType::f64, device),
      hits(Shape{members}, DType::i32, device),
      mean_probs(Shape{max_eval_batch, classes}, DType::f32, device),
      member_probs(Shape{members, max_eval_batch, classes}, DType::f32, device),
      calibration_ws(
          Shape{static_cast<std::int64_t>(calibration_workspace_bytes(be, group, max_rows, max_eval_batch, classes))},
          DType::u8, device),
      bad_labels(Shape{1}, DType::i32, device),
      result{Array(Shape{members}, DType::f32, device), Array(Shape{members}, DType::i32, device),
             Array(Shape{1}, DType::i32, device), Array(Shape{members + 1, kSlots}, DType::f64, device)} {}

DeviceWork::DeviceWork(const Sequential& model, const kernels::Backend& be, Device device, int members, int max_rows,
                       int max_eval_batch, int member_group, int log_rows, OptimizerWork opt, bool graphs,
                       RunnerSplit split, kernels::Precision precision)
    : backend(be),
      runner(model, be, device, members, max_rows,
             member_group == 0 ? default_member_group(device, members) : member_group, split, precision),
      optimizer(std::move(opt)),
      train(be, device, members, runner.group(), max_rows, classes_of(model), model.params_per_member(), log_rows),
      eval(be, device, members, runner.group(), max_rows, max_eval_batch, classes_of(model)),
      graphs_(graphs && !splits_any(split) && !(syncs_batch(model) && !split.batch_axis.empty())),
      update_graphs_(graphs) {
  if (optimizer.base_lr.size() != members || optimizer.base_lr.device() != device)
    throw ValueError("DeviceWork: the optimizer's scalars are for " + std::to_string(optimizer.base_lr.size()) +
                     " members on " + optimizer.base_lr.device().str() + ", not " + std::to_string(members) + " on " +
                     device.str());
}

kernels::StepGraph& DeviceWork::step_graph(const std::string& key) {
  auto& g = step_graphs_[key];
  if (g == nullptr) g = std::make_unique<kernels::StepGraph>(backend, graphs_);
  return *g;
}

kernels::StepGraph& DeviceWork::update_graph(const std::string& key) {
  auto& g = update_graph_map_[key];
  if (g == nullptr) g = std::make_unique<kernels::StepGraph>(backend, update_graphs_);
  return *g;
}

namespace {

// train_step's graph key: what its captured work reads by pointer or by value besides `work`'s own buffers
// (review F4). Doubles by their bits, pointers by address.
std::string graph_key(const TrainState& state, const Batch& batch, int rows, const StepOptions& opt) {
  std::string key;
  auto word = [&](std::uint64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  auto pointer = [&](const void* p) { word(reinterpret_cast<std::uintptr_t>(p)); };
  auto real = [&](double v) { word(std::bit_cast<std::uint64_t>(v)); };
  pointer(batch.images.raw_data());
  pointer(batch.labels.raw_data());
  word(static_cast<std::uint64_t>(rows));
  pointer(state.params.raw_data());
  pointer(state.state.raw_data());
  pointer(state.step.raw_data());
  for (const auto& [name, slot] : state.opt) {
    key += name;
    pointer(slot.raw_data());
  }
  pointer(opt.optimizer);
  word((opt.data_parallel ? 1u : 0u) | (opt.member_dropout ? 2u : 0u));
  key += opt.axis;
  key += '\0';
  const kernels::ScheduleParams& sp = opt.update.schedule;
  word(static_cast<std::uint64_t>(sp.kind));
  word(static_cast<std::uint64_t>(sp.warmup_steps));
  word(static_cast<std::uint64_t>(sp.decay_steps));
  real(sp.decay_rate);
  word(sp.staircase ? 1 : 0);
  real(sp.alpha);
  word(static_cast<std::uint64_t>(sp.boundaries_count));
  for (int i = 0; i < sp.boundaries_count; ++i) {
    word(static_cast<std::uint64_t>(sp.boundaries[i]));
    real(sp.values[i]);
  }
  real(opt.update.clip_norm);
  for (bool b : opt.update.split_tensors) key += b ? '1' : '0';
  key += '\0';
  key += opt.update.split_axes.str();
  return key;
}

}  // namespace

void train_step(TrainState& state, DeviceWork& work, const Batch& batch, const StepOptions& opt) {
  const kernels::Backend& be = work.backend;
  TrainWork& t = work.train;
  const int rows = rows_of(batch, work, "train_step");
  if (opt.optimizer == nullptr) throw ValueError("train_step: StepOptions::optimizer is not set");
  if (t.log_fill >= t.log.loss.shape()[0])
    throw Error("train_step: " + std::to_string(t.log_fill) + " steps since the last report fill the log");
  const int members = work.runner.members(), group = work.runner.group();
  const int classes = classes_of(work.runner.model());
  const float* images = batch.images.data<float>();
  const std::int32_t* labels = batch.labels.data<std::int32_t>();
  const float* params = state.params.data<float>();
  // Data parallel: this device's rows are the global batch's block at its index along the axis.
  const RunArgs run{state.state.data<float>(),
                    true,
                    t.keys.data<std::uint32_t>(),
                    state.step.data<std::int64_t>(),
                    opt.data_parallel ? std::int64_t{axis_index(opt.axis)} * rows : 0,
                    opt.member_dropout ? t.dropout_rates.data<float>() : nullptr};
  // Forward, loss and backward of each group of members, then (ensemble) the update: one graph.
  // Only a backend that records graphs needs the key (CPU backends run every step eagerly).
  const std::string key = be.captures() ? graph_key(state, batch, rows, opt) : std::string();
  work.step_graph(key).run([&] {
    for (int first = 0; first < members; first += group) {
      const int count = std::min(group, members - first);
      const float* logits = work.runner.forward(images, rows, params, first, count, run);
      be.loss().softmax_cross_entropy(kernels::SoftmaxXentParams{count, rows, classes, true}, logits, labels,
                                      t.step_loss.data<float>() + first, t.dlogits.data<float>(), nullptr,
                                      t.step_correct.data<std::int32_t>() + first,
                                      t.log.bad_labels.data<std::int32_t>(), t.xent_ws.raw_data());
      work.runner.backward(images, params, t.dlogits.data<float>(), t.grads.data<float>());
    }
    if (!opt.data_parallel) update(state, work, opt);
  });
  if (opt.data_parallel) {  // the collective meets the other devices on the host: outside the graphs
    pmean_inplace(t.grads, opt.axis);
    // Clipping with split weights psums its sums of squares inside the update: then the update runs eagerly.
    if (opt.update.meets_devices()) {
      update(state, work, opt);
    } else {
      work.update_graph(key).run([&] { update(state, work, opt); });
    }
  }
  const auto row = static_cast<std::size_t>(t.log_fill++) * static_cast<std::size_t>(members);
  be.copy(t.log.loss.data<float>() + row, t.step_loss.raw_data(), t.step_loss.nbytes());
  be.copy(t.log.correct.data<std::int32_t>() + row, t.step_correct.raw_data(), t.step_correct.nbytes());
}

namespace {

// A (members, rows, K) f32 buffer seen member by member: at(m, r) is member m's row r.
struct MemberRows {
  float* base;
  std::size_t rows;
  std::size_t classes;
  float* at(int member, int row) const {
    return base + (static_cast<std::size_t>(member) * rows + static_cast<std::size_t>(row)) * classes;
  }
};

MemberRows member_rows(Array& a) {
  return {a.data<float>(), static_cast<std::size_t>(a.shape()[1]), static_cast<std::size_t>(a.shape()[2])};
}

}  // namespace

void eval_step(const TrainState& state, DeviceWork& work, const Batch& batch, int rows, const StepOptions& opt,
               bool keep) {
  const kernels::Backend& be = work.backend;
  const kernels::MetricOps& metrics = be.metrics();
  EvalWork& e = work.eval;
  const int capacity = rows_of(batch, work, "eval_step");
  const int eval_rows = static_cast<int>(e.mean_probs.shape()[0]);
  if (rows < 1 || rows > capacity || rows > eval_rows)
    throw ShapeError("eval_step: " + std::to_string(rows) + " rows of a batch of " + std::to_string(capacity) +
                     " (eval buffers for " + std::to_string(eval_rows) + ")");
  const int members = work.runner.members(), group = work.runner.group(), piece_max = work.runner.max_batch();
  const int k = static_cast<int>(e.mean_probs.shape()[1]);
  const std::int64_t example = product(work.runner.model().input_shape());
  const float* params = state.params.data<float>();
  // Inference: the model state is read, never written.
  const RunArgs run{const_cast<float*>(state.state.data<float>())};
  float* mean = e.mean_probs.data<float>();
  const MemberRows kept = member_rows(e.member_probs);
  be.fill_zero(e.loss_sum.raw_data(), e.loss_sum.nbytes());
  be.fill_zero(e.hits.raw_data(), e.hits.nbytes());
  be.fill_zero(e.result.ensemble_correct.raw_data(), e.result.ensemble_correct.nbytes());
  be.fill_zero(e.result.calibration.raw_data(), e.result.calibration.nbytes());
  double* calibration = e.result.calibration.data<double>();
  // Each piece of rows through each group of members: its mean loss and hits added to the members' sums,
  // its probabilities added (in member order) to the rows' sum over this device's members.
  for (int first = 0; first < rows; first += piece_max) {
    const int n = std::min(piece_max, rows - first);
    const std::int32_t* labels = batch.labels.data<std::int32_t>() + first;
    for (int m0 = 0; m0 < members; m0 += group) {
      const int count = std::min(group, members - m0);
      const float* logits =
          work.runner.forward(batch.images.data<float>() + first * example, n, params, m0, count, run);
      float* piece = e.piece_probs.data<float>();  // (count, n, K)
      float* piece_loss = e.piece_loss.data<float>() + m0;
      std::int32_t* piece_correct = e.piece_correct.data<std::int32_t>() + m0;
      be.loss().softmax_cross_entropy(kernels::SoftmaxXentParams{count, n, k, true}, logits, labels, piece_loss,
                                      nullptr, piece, piece_correct, e.bad_labels.data<std::int32_t>(),
                                      e.xent_ws.raw_data());
      metrics.accumulate_metrics(count, piece_loss, piece_correct, n, e.loss_sum.data<double>() + m0,
                                 e.hits.data<std::int32_t>() + m0);
      metrics.sum_members(count, static_cast<std::size_t>(n) * k, piece, mean + static_cast<std::size_t>(first) * k,
                          m0 > 0);
      metrics.calibration_sums(kernels::CalibrationParams{count, n, k}, piece, labels, calibration + m0 * kSlots,
                               e.calibration_ws.raw_data());
      for (int j = 0; keep && j < count; ++j)  // member m0 + j's rows [first, first + n)
        be.copy(kept.at(m0 + j, first), piece + static_cast<std::size_t>(j) * n * k,
                static_cast<std::size_t>(n) * k * sizeof(float));
    }
  }
  metrics.mean_from_sums(members, e.loss_sum.data<double>(), rows, e.result.loss.data<float>());
  be.copy(e.result.correct.raw_data(), e.hits.raw_data(), e.hits.nbytes());
  if (!opt.data_parallel) {
    // The sum over this device's members, summed over the devices (device order), over all members.
    psum_inplace(e.mean_probs, opt.axis);  // whole buffer: its shape is fixed, rows past `rows` are ignored
    metrics.divide(static_cast<std::size_t>(rows) * k, mean, static_cast<float>(opt.total_members));
  }
  metrics.argmax_hits(rows, k, mean, batch.labels.data<std::int32_t>(),
                      e.result.ensemble_correct.data<std::int32_t>());
  metrics.calibration_sums(kernels::CalibrationParams{1, rows, k}, mean, batch.labels.data<std::int32_t>(),
                           calibration + members * kSlots, e.calibration_ws.raw_data());
}

ReportWork::ReportWork(const EvalWork& eval, int members)
    : total_members(members),
      running(eval.mean_probs.shape(), DType::f32, eval.mean_probs.device()),
      mean(eval.mean_probs.shape(), DType::f32, eval.mean_probs.device()),
      result{Array(Shape{members, kSlots}, DType::f64, eval.mean_probs.device()),
             Array(Shape{eval.mean_probs.shape()[0]}, DType::i32, eval.mean_probs.device()),
             Array(Shape{eval.mean_probs.shape()[0]}, DType::f32, eval.mean_probs.device()),
             Array(Shape{eval.mean_probs.shape()[0]}, DType::f32, eval.mean_probs.device()),
             Array(Shape{members, eval.mean_probs.shape()[0]}, DType::i32, eval.mean_probs.device())} {}

void report_step(DeviceWork& work, ReportWork& report, const Batch& batch, int rows, const StepOptions& opt) {
  const kernels::Backend& be = work.backend;
  const kernels::MetricOps& metrics = be.metrics();
  EvalWork& e = work.eval;
  const auto eval_rows = static_cast<std::size_t>(e.mean_probs.shape()[0]);
  const int k = static_cast<int>(e.mean_probs.shape()[1]);
  const std::size_t n = static_cast<std::size_t>(rows) * k;
  const std::int32_t* labels = batch.labels.data<std::int32_t>();
  // Every member's probabilities, member-major over the mesh: device d's member j is member d * per + j.
  // (Data parallel: every device holds the one model; the first block is it.)
  Array all = all_gather(e.member_probs, opt.axis, /*tiled=*/true);  // (devices * per, eval, K)
  const MemberRows probs = member_rows(all);
  ReportResult& r = report.result;
  be.fill_zero(r.curve.raw_data(), r.curve.nbytes());
  for (int m = 0; m < report.total_members; ++m) {
    metrics.sum_members(1, n, probs.at(m, 0), report.running.data<float>(), m > 0);
    be.copy(report.mean.raw_data(), report.running.raw_data(), n * sizeof(float));
    metrics.divide(n, report.mean.data<float>(), static_cast<float>(m + 1));
    metrics.calibration_sums(kernels::CalibrationParams{1, rows, k}, report.mean.data<float>(), labels,
                             r.curve.data<double>() + m * kSlots, e.calibration_ws.raw_data());
    metrics.predictions(rows, k, probs.at(m, 0), r.votes.data<std::int32_t>() + m * eval_rows, nullptr, nullptr);
  }
  metrics.predictions(rows, k, e.mean_probs.data<float>(), r.predicted.data<std::int32_t>(),
                      r.probability.data<float>(), r.entropy.data<float>());
}

}  // namespace pmap::ensemble
