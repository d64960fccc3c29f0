// Trainer: the options' checks, the members' placement and the epoch loop over the TrainStep.
#include <pmapcc/train/trainer.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include <pmap/collectives.h>
#include <pmap/error.h>
#include <pmap/pmap.h>

namespace pmap::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string option(const char* name) { return std::string("train::Trainer: options.") + name; }

// The mesh's one axis, checked.
std::string axis_of(const Mesh& mesh) {
  if (mesh.axes().size() != 1)
    throw ValueError("train::Trainer: the mesh " + mesh.str() +
                     " has several axes; the Trainer runs an ensemble or data parallel over one");
  return mesh.axes()[0].name;
}

// The per-member values [first, first + count) of a hyper-parameter list (empty stays empty).
std::vector<float> part(const std::vector<float>& v, std::size_t first, std::size_t count) {
  if (v.empty()) return v;
  return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(first),
                            v.begin() + static_cast<std::ptrdiff_t>(first + count));
}

void check_hyper_count(const std::vector<float>& v, const char* name, int members) {
  if (!v.empty() && v.size() != static_cast<std::size_t>(members))
    throw ValueError(option("hyperparams.") + name + " has " + std::to_string(v.size()) + " values for " +
                     std::to_string(members) + " members; it needs one per member (or none)");
}

}  // namespace

Trainer::Trainer(Model model, Optimizer optimizer, Mesh mesh, TrainerOptions options, Loss loss)
    : step_(std::move(model), std::move(optimizer), std::move(loss),
            StepOptions{.axis = axis_of(mesh), .data_parallel = options.data_parallel,
                        .member_batch = options.member_batch, .precision = options.precision}),
      mesh_(std::move(mesh)), options_(std::move(options)) {
  const int devices = mesh_.size();
  const TrainerOptions& o = options_;
  if (o.data_parallel && o.members != 1)
    throw ValueError(option("members") + " is " + std::to_string(o.members) +
                     "; data parallel trains one model (members 1)");
  if (!o.data_parallel && (o.members < 1 || o.members % devices != 0))
    throw ValueError(option("members") + " is " + std::to_string(o.members) + "; it must be a positive multiple of " +
                     "the mesh's " + std::to_string(devices) + " devices");
  if (o.batch_size < 1 || (o.data_parallel && o.batch_size % devices != 0))
    throw ValueError(option("batch_size") + " is " + std::to_string(o.batch_size) + "; it must be positive" +
                     (o.data_parallel ? " and a multiple of the mesh's " + std::to_string(devices) + " devices" : ""));
  if (o.report_every < 0)
    throw ValueError(option("report_every") + " is " + std::to_string(o.report_every) + "; 0 (automatic) or more");
  check_hyper_count(o.hyperparams.learning_rate, "learning_rate", o.members);
  check_hyper_count(o.hyperparams.weight_decay, "weight_decay", o.members);
  check_hyper_count(o.hyperparams.dropout_rate, "dropout_rate", o.members);
  if (options_.report_every == 0)
    options_.report_every = mesh_.local_devices()[0].kind == DeviceKind::cpu ? 1 : 16;
  per_device_ = o.data_parallel ? 1 : o.members / devices;

  const auto root = split(key(o.seed), 2);
  data_key_ = root[1];
  const auto keys = split(root[0], static_cast<std::uint32_t>(o.members));
  const std::string axis = step_.options().axis;
  states_ = pmap::pmap([&](int) {
    const auto first = o.data_parallel ? std::size_t{0} : static_cast<std::size_t>(axis_index(axis) * per_device_);
    const auto n = static_cast<std::size_t>(per_device_);
    const MemberHyperparams& h = o.hyperparams;
    const MemberHyperparams mine{part(h.learning_rate, first, n), part(h.weight_decay, first, n),
                                 part(h.dropout_rate, first, n)};
    return step_.init(std::span(keys).subspan(first, n), current_device(), mine);
  }, mesh_)(0);
  const Shape& in = step_.model().input_shape();
  feed_ = std::make_unique<Feed<Batch>>(
      mesh_,
      Batch{Array(Shape{o.batch_size, in[0], in[1], in[2]}, DType::f32), Array(Shape{o.batch_size}, DType::i32)},
      o.data_parallel ? FeedLayout::sharded({axis}) : FeedLayout::replicated());
}

Trainer::~Trainer() = default;

EpochReport Trainer::run_epoch(const Dataset& data, const StepCallback& on_step) {
  const Model& m = step_.model();
  const Shape& in = m.input_shape();
  if (data.rows != in[0] || data.cols != in[1] || in[2] != 1)
    throw ValueError("train::Trainer::run_epoch: the data's images are (" + std::to_string(data.rows) + ", " +
                     std::to_string(data.cols) + "); model '" + m.name() + "' takes (" + std::to_string(in[0]) + ", " +
                     std::to_string(in[1]) + ", " + std::to_string(in[2]) + ")");
  const int batch = options_.batch_size;
  if (data.count < batch)
    throw ValueError("train::Trainer::run_epoch: the data has " + std::to_string(data.count) +
                     " examples, fewer than one batch (options.batch_size " + std::to_string(batch) + ")");
  // A label outside the classes would be read out of range on a GPU, where a kernel cannot raise.
  const auto bad = std::find_if(data.labels.begin(), data.labels.end(),
                                [&](std::uint8_t l) { return l >= m.classes(); });
  if (bad != data.labels.end())
    throw ValueError("train::Trainer::run_epoch: label " + std::to_string(*bad) + " of example " +
                     std::to_string(bad - data.labels.begin()) + " is not below model '" + m.name() + "''s " +
                     std::to_string(m.classes()) + " classes");

  const auto order = permutation(fold_in(data_key_, static_cast<std::uint32_t>(epochs_done_)),
                                 static_cast<std::uint32_t>(data.count));
  const int steps = static_cast<int>(steps_per_epoch(data.count, batch));
  auto fill = [&](int s) {
    Batch& host = feed_->next();
    gather_batch(data, std::span(order).subspan(static_cast<std::size_t>(s) * batch, static_cast<std::size_t>(batch)),
                 host.images.data<float>(), host.labels.data<std::int32_t>());
    feed_->push();
  };
  const std::string axis = step_.options().axis;
  auto run = pmap::pmap([this](TrainState& s, const Batch& b) { return step_(s, b.images, b.labels); }, mesh_, axis);
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
  const double replicas = options_.data_parallel ? 1 : members;  // the rows a step's mean loss is over
  double loss_sum = 0, correct = 0;
  const auto t0 = Clock::now();
  EpochReport r{.epoch = epochs_done_ + 1, .steps = steps};
  int reported = 0;
  if (steps > 0) fill(0);
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) fill(s + 1);  // the next batch's copy overlaps this step
    Sharded<StepMetrics> metrics = run(states_, feed_->pop());
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

Variables Trainer::gathered(Variables TrainState::*role) const {
  const std::string axis = step_.options().axis;
  const bool dp = options_.data_parallel;
  auto all = pmap::pmap([&](const TrainState& s) {
    Variables out;
    for (const auto& [name, a] : s.*role) out.emplace(name, dp ? a.copy() : all_gather(a, {axis}, true));
    return out;
  }, mesh_)(states_);
  Variables host;
  for (const auto& [name, a] : all[0]) host.emplace(name, a.to(Device{}));
  return host;
}

Variables Trainer::params() const { return gathered(&TrainState::params); }
Variables Trainer::model_state() const { return gathered(&TrainState::state); }

std::int64_t Trainer::step() const { return states_[0].step.to_vector<std::int64_t>()[0]; }

}  // namespace pmap::train
