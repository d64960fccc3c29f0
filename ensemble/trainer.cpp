// Trainer: configuration checks, member initialization, placement and the epoch loop (evaluation:
// ensemble/evaluation.cpp).
#include <pmapcc/ensemble/trainer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <span>
#include <tuple>

#include <pmap/distributed.h>
#include <pmap/error.h>

#include <pmapcc/ensemble/member_layout.h>
#include <pmapcc/ensemble/run_checks.h>
#include <pmapcc/kernels/cpu_backend.h>

namespace pmap::ensemble {
namespace {

// What a member's key is folded with for its random stream (Dropout): "drop".
constexpr std::uint32_t kDropoutStream = 0x64726f70;
// What the data key is folded with to draw the validation set: "vali" (the epochs fold in 0, 1, 2, ...).
constexpr std::uint32_t kValidationStream = 0x76616c69;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The model, checked against the data: it takes the images whole and gives one output per class.
std::unique_ptr<Sequential> checked_model(std::unique_ptr<Sequential> model, const Dataset& data) {
  if (model == nullptr) throw ValueError("Trainer: no model");
  const Dims images{data.rows, data.cols, 1};
  if (model->input_shape() != images)
    throw ValueError("--model " + model->name() + " takes " + shape_str(model->input_shape()) +
                     " inputs; the data's images are " + shape_str(images));
  if (product(model->output_shape()) != data.num_classes)
    throw ValueError("--model " + model->name() + " gives " + std::to_string(product(model->output_shape())) +
                     " outputs; the data has " + std::to_string(data.num_classes) + " classes");
  return model;
}

// The training set the run trains on: `train`, or its part left by holding out a validation set (config's
// validation_split), drawn with the data key; the two parts are written to held_train and validation.
const Dataset& held_out(const TrainConfig& c, const Dataset& train, Dataset& held_train, Dataset& validation) {
  if (c.validation_split == 0) return train;
  if (!(c.validation_split > 0 && c.validation_split < 1))
    throw ValueError("--validation-split must be in [0, 1), got " + io::dump_json(c.validation_split));
  const Key data_key = split(key(c.seed), 2)[1];
  std::tie(held_train, validation) = split_validation(train, c.validation_split, fold_in(data_key, kValidationStream));
  return held_train;
}

// Member g's values of every tensor of `layout`, copied between two buffers stacked over `members` members.
void copy_member(const TensorLayout& layout, std::int64_t members, int g, const std::vector<float>& from,
                 std::vector<float>& to) {
  for (const auto& t : layout.tensors) {
    const auto at = static_cast<std::ptrdiff_t>(t.offset * members + g * t.size);
    std::copy_n(from.begin() + at, t.size, to.begin() + at);
  }
}

// Clipping with split weights: which of the local model's tensors are blocks, and the mesh axes a psum of
// their sums of squares runs over. Weights split only over the mesh's model axis (the plan refuses the
// others, which hold other examples or members), so every split tensor's axes are the same and one psum
// completes them all.
void set_norm_split(const ShardingPlan& plan, UpdateOptions& u) {
  std::vector<std::string> axes;
  for (const ShardedTensor& t : plan.tensors()) {
    bool split = false;
    for (int a : t.axis_of_dim) {
      if (a < 0) continue;
      split = true;
      const std::string& name = plan.mesh_axes()[static_cast<std::size_t>(a)].name;
      if (std::find(axes.begin(), axes.end(), name) == axes.end()) axes.push_back(name);
    }
    u.split_tensors.push_back(split);
  }
  u.split_axes = AxisNames(std::move(axes));
}

}  // namespace

int Trainer::member_group() const { return work_.empty() ? 0 : work_.front()->runner.group(); }

Trainer::Trainer(TrainConfig config, const Dataset& train, const Dataset& test)
    : Trainer(config, make_model(config.model, {train.rows, train.cols, 1}, train.num_classes), train, test) {}

Trainer::Trainer(TrainConfig config, std::unique_ptr<Sequential> model, const Dataset& train, const Dataset& test)
    : config_(std::move(config)), train_(held_out(config_, train, held_train_, validation_)), test_(test),
      model_(checked_model(std::move(model), train)),
      mesh_(build_mesh(config_)) {
  config_.model = model_->name();
  config_.architecture = model_->architecture();
  const int devices = mesh_.size(), along = mesh_.axes()[0].size;  // along the mode's axis
  config_.devices = devices;
  config_.mesh_axis = along;
  config_.mesh_model = devices / along;
  config_.processes = 1;
  for (const Device& d : mesh_.devices()) config_.processes = std::max(config_.processes, d.process + 1);
  if (config_.members == 0) config_.members = config_.mode == Mode::ensemble ? along : 1;
  config_.check(along, train_, test);
  if (config_.mode != Mode::ensemble && config_.batch_size % along != 0)
    throw ValueError("--batch-size " + std::to_string(config_.batch_size) + " does not split evenly over the " +
                     std::to_string(along) + " devices of 'data': the runner (ensemble::Trainer) needs equal " +
                     "blocks; train::Trainer, the program's, takes any batch size");
  if (!config_.dropout.empty() &&
      std::none_of(model_->layers().begin(), model_->layers().end(), [](const auto& l) { return l->random(); }))
    throw ValueError("--dropout sets the rate of the model's Dropout layers, and " + model_->name() + " has none");
  optimizer_ = make_optimizer(config_.optimizer);
  placement_ = std::make_unique<Placement>(config_, *model_, mesh_);
  check_memory(config_, along, plan() ? plan()->local_params() : model_->params_per_member(),
               2 + static_cast<int>(optimizer_->slots().size()));
  if (config_.member_group < 0 || config_.member_group > members_per_device())
    throw ValueError("member group " + std::to_string(config_.member_group) + " is outside 0.." +
                     std::to_string(members_per_device()) + " (the members per device; 0: default)");
  auto keys = split(key(config_.seed), 2);
  init_key_ = keys[0];
  data_key_ = keys[1];
  options_.optimizer = optimizer_.get();
  options_.update.schedule = schedule_params();
  options_.update.clip_norm = config_.optimizer.clip_norm;
  if (plan() != nullptr && config_.optimizer.clip_norm > 0) set_norm_split(*plan(), options_.update);
  options_.data_parallel = config_.mode != Mode::ensemble;  // model parallel: data parallel over "data" too
  options_.axis = mesh_.axes()[0].name;
  options_.total_members = total_members();
  options_.member_dropout = !config_.dropout.empty();
  if (config_.report_every == 0) config_.report_every = config_.backend == DeviceKind::cpu ? 1 : 16;
  make_device_work();
  if (config_.processes > 1) check_processes_agree(mesh_, config_.to_json(), train_, test_);
  init_members();
  if (config_.patience > 0) stopping_.assign(static_cast<std::size_t>(total_members()), MemberStopping{});
}

void Trainer::make_device_work() {
  const kernels::Backend& backend =
      config_.cuda_kernels_on_host ? kernels::cuda_backend_on_host() : kernels::backend_for(config_.backend);
  const Dataset& train = train_;
  // Activations for one training step's rows per device; evaluation runs its batches through them in pieces.
  const int rows = options_.data_parallel ? config_.batch_size / mesh_.axes()[0].size : config_.batch_size;
  const int eval_batch = std::min<int>(config_.eval_batch, static_cast<int>(test_.count));
  std::vector<DeviceWork*> ptrs;
  std::vector<TrainState> states;
  RunnerSplit runner_split;  // split weights: each layer's collectives over the mesh's axes
  if (plan())
    runner_split = RunnerSplit{placement_->local().splits, {mesh_.axes()[0].name, mesh_.axes()[1].name}, ""};
  // Data and model parallel: the global batch is spread over the first axis (BatchNorm's statistics).
  if (options_.data_parallel) runner_split.batch_axis = mesh_.axes()[0].name;
  const auto member_keys = split(init_key_, total_members());
  for (const Device& d : mesh_.local_devices()) {
    // This device's first member: the first along the mode's axis (data and model parallel: the one model).
    const int first = placement_->first_member(ptrs.size());
    work_.push_back(std::make_unique<DeviceWork>(placement_->device_model(), backend, d, members_per_device(), rows,
                                                 eval_batch, config_.member_group, log_rows(),
                                                 OptimizerWork(config_.optimizer, members_per_device(), first, d),
                                                 config_.graphs, runner_split, config_.precision));
    ptrs.push_back(work_.back().get());
    // Each member's random stream (Dropout): a key folded from its initialization key.
    std::vector<std::uint32_t> keys;
    for (int j = 0; j < members_per_device(); ++j) {
      const Key k = fold_in(member_keys[static_cast<std::size_t>(first + j)], kDropoutStream);
      keys.insert(keys.end(), {k.k0, k.k1});
    }
    work_.back()->train.keys.copy_from_host(keys.data(), keys.size() * sizeof(std::uint32_t));
    if (!config_.dropout.empty()) {  // each member's own rate, or the one rate
      std::vector<float> rates;
      for (int j = 0; j < members_per_device(); ++j)
        rates.push_back(config_.dropout[config_.dropout.size() == 1 ? 0 : static_cast<std::size_t>(first + j)]);
      work_.back()->train.dropout_rates.copy_from_host(rates.data(), rates.size() * sizeof(float));
    }
    const Shape s{members_per_device() * placement_->device_model().params_per_member()};
    states.push_back(make_train_state(*optimizer_, Array(s, DType::f32, d),
                                      members_per_device() * model_->state_per_member()));
  }
  work_ptrs_ = Sharded<DeviceWork*>(std::move(ptrs));
  states_ = Sharded<TrainState>(std::move(states));
  // The batches reach the devices through the runtime's feeds: replicated (ensemble) or sharded over the
  // first axis (data and model parallel; replicated over "model"), double-buffered so that the next
  // batch's copy overlaps the step.
  auto prototype = [&](int n) {
    return Batch{Array(Shape{n, train.rows, train.cols, 1}, DType::f32), Array(Shape{n}, DType::i32)};
  };
  train_feed_ = std::make_unique<Feed<Batch>>(
      mesh_, prototype(config_.batch_size),
      options_.data_parallel ? FeedLayout::sharded(options_.axis) : FeedLayout::replicated());
  evaluator_ = std::make_unique<Evaluator>(mesh_, test_, eval_batch, members_per_device(), total_members());
  if (validation_.count > 0)
    validator_ = std::make_unique<Evaluator>(mesh_, validation_,
                                             std::min<int>(eval_batch, static_cast<int>(validation_.count)),
                                             members_per_device(), total_members());
  // Handles and workspaces the steps use are created now, on the devices' threads: steps allocate nothing.
  pmap::pmap([](DeviceWork* w) { w->backend.prepare(); }, mesh_)(work_ptrs_);
}

Trainer::~Trainer() = default;

int Trainer::log_rows() const { return std::max(1, std::min(config_.report_every, steps_per_epoch())); }

int Trainer::steps_per_epoch() const { return static_cast<int>(ensemble::steps_per_epoch(train_.count, config_.batch_size)); }

kernels::ScheduleParams Trainer::schedule_params() {
  Schedule& s = config_.optimizer.schedule;
  if (s.kind == kernels::ScheduleKind::cosine && s.decay_steps == 0) {
    const std::int64_t run = static_cast<std::int64_t>(config_.epochs) * steps_per_epoch();
    if (config_.epochs > 0 && run - s.warmup_steps < 1)
      throw ValueError("--lr-schedule " + s.str() + ": --warmup-steps " + std::to_string(s.warmup_steps) +
                       " leaves none of the run's " + std::to_string(run) + " steps (--epochs " +
                       std::to_string(config_.epochs) + " x " + std::to_string(steps_per_epoch()) +
                       ") for the decay");
    s.decay_steps = std::max<std::int64_t>(1, run - s.warmup_steps);
  }
  return s.params();
}

void Trainer::init_members() {
  // Data and model parallel: one model (member 0's key) on every replica. Split weights: each device takes
  // its blocks of the whole initial weights, so the start does not depend on the mesh.
  const auto keys = split(init_key_, total_members());
  std::vector<float> all(static_cast<std::size_t>(total_members() * model_->params_per_member()));
  model_->init(keys, all);
  restore(all, model_->init_state(total_members()), zero_optimizer_state(), 0);
}

std::map<std::string, std::vector<float>> Trainer::zero_optimizer_state() const {
  std::map<std::string, std::vector<float>> zeros;
  for (const std::string& slot : optimizer_->slots())
    zeros[slot].assign(static_cast<std::size_t>(total_members() * model_->params_per_member()), 0.0f);
  return zeros;
}

void Trainer::fill_train_batch(const std::vector<std::uint32_t>& order, std::int64_t begin) {
  // Data parallel over several processes: each process fills only its devices' rows of the batch (the other
  // rows are never read here).
  const auto [first, count] = placement_->own_rows(config_.batch_size);
  Feed<Batch>& feed = *train_feed_;
  const Dataset& data = train_;
  Batch& host = feed.next();
  std::span<const std::uint32_t> idx(order.data() + begin + first, static_cast<std::size_t>(count));
  const auto example = static_cast<std::size_t>(data.image_size());
  ensemble::gather_batch(data, idx, host.images.data<float>() + static_cast<std::size_t>(first) * example,
                         host.labels.data<std::int32_t>() + first);
  feed.push();
}

namespace {

// The per-step log of every device along the mesh's first axis, stacked (devices, rows, members), on the
// host.
struct LogOnHost {
  std::vector<float> loss;
  std::vector<std::int32_t> correct;
  std::int64_t bad_labels = 0;
};

LogOnHost to_host(const TrainLog& gathered) {
  LogOnHost h{gathered.loss.to_vector<float>(), gathered.correct.to_vector<std::int32_t>(), 0};
  for (std::int32_t b : gathered.bad_labels.to_vector<std::int32_t>()) h.bad_labels += b;
  return h;
}

}  // namespace

namespace {

// The running sums of an epoch, fed by the gathered logs: the steps are added in one order (step, device,
// member) whichever process or report interval, so every process holds the same bits.
struct EpochSums {
  std::size_t devices = 1, per_device = 1, log_rows = 1;  // the gathered log's shape
  double divisor = 1;      // ensemble: all members; data parallel: the devices' blocks
  double loss_sum = 0;     // sum over the steps of the step's mean loss
  double correct = 0;
  int added = 0;           // steps added so far
};

// Adds the steps up to `through` (0-based) from `log`, calling on_step(step, its loss, the running mean,
// the examples classified right so far) for each.
template <class OnStep> void add_steps(const LogOnHost& log, int through, EpochSums& e, const OnStep& on_step) {
  for (; e.added <= through; ++e.added) {
    const auto r = static_cast<std::size_t>(e.added) % e.log_rows;
    double step_loss = 0;
    for (std::size_t d = 0; d < e.devices; ++d)
      for (std::size_t j = 0; j < e.per_device; ++j) {
        step_loss += log.loss[(d * e.log_rows + r) * e.per_device + j];
        e.correct += log.correct[(d * e.log_rows + r) * e.per_device + j];
      }
    e.loss_sum += step_loss / e.divisor;
    on_step(e.added + 1, step_loss / e.divisor, e.loss_sum / (e.added + 1), e.correct);
  }
}

}  // namespace

EpochMetrics Trainer::run_epoch(const StepCallback& on_step, const std::function<void()>& on_evaluate) {
  EpochMetrics m;
  m.epoch = epochs_done_ + 1;
  const auto order = permutation(fold_in(data_key_, static_cast<std::uint32_t>(epochs_done_)),
                                 static_cast<std::uint32_t>(train_.count));
  const int steps = steps_per_epoch();
  // Every report_every steps (and at the end of the epoch) the devices' per-step logs are all-gathered
  // over the mesh, so that every process sums the same values and the processes of a mesh that spans
  // several stay in step.
  const Device first_local = mesh_.local_devices()[0];
  auto step_fn = pmap::pmap([first_local](TrainState& s, DeviceWork* w, const Batch& b, const StepOptions& o,
                                          bool report) {
    train_step(s, *w, b, o);
    if (!report) return LogOnHost{};
    const TrainLog all = all_gather(w->train.log, o.axis);  // (devices, rows, members)
    w->train.log_fill = 0;
    return current_device() == first_local ? to_host(all) : LogOnHost{};
  }, mesh_);
  // The log is gathered over the first axis (devices along "model" log the same).
  const int along = mesh_.axes()[0].size;
  EpochSums sums{static_cast<std::size_t>(along), static_cast<std::size_t>(members_per_device()),
                 static_cast<std::size_t>(log_rows()),
                 static_cast<double>(options_.data_parallel ? along : total_members())};
  const auto t0 = Clock::now();
  auto report_step = [&](int step, double loss, double running_loss, double correct) {
    if (!on_step) return;
    const double secs = seconds_since(t0), images = static_cast<double>(total_members()) * config_.batch_size * step;
    on_step(StepReport{step, steps, loss, running_loss, correct / images, secs > 0 ? images / secs : 0.0});
  };
  if (steps > 0) fill_train_batch(order, 0);
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps)  // the next batch's copy overlaps this step
      fill_train_batch(order, static_cast<std::int64_t>(s + 1) * config_.batch_size);
    const bool report = (s + 1) % config_.report_every == 0 || s + 1 == steps;
    auto res = step_fn(states_, work_ptrs_, train_feed_->pop(), options_, report);
    if (!report) continue;
    check_labels(res[0].bad_labels, "training");
    add_steps(res[0], s, sums, report_step);
  }
  m.seconds = seconds_since(t0);
  const double seen = static_cast<double>(steps) * config_.batch_size;
  m.train_loss = steps > 0 ? sums.loss_sum / steps : 0.0;
  m.train_accuracy = steps > 0 ? sums.correct / (seen * total_members()) : 0.0;
  m.model_images_per_second = m.seconds > 0 ? total_members() * seen / m.seconds : 0.0;
  ++epochs_done_;
  restore_best(stopped_members());  // what stopped members learned in this epoch is discarded
  if (on_evaluate) on_evaluate();
  const auto t1 = Clock::now();
  if (validator_ != nullptr) {
    validator_->run(states_, work_ptrs_, options_, m, nullptr);
    m.evaluated_on = "validation";
  } else {
    evaluate(m);
  }
  m.eval_seconds = seconds_since(t1);
  history_.push_back(m);
  update_early_stopping(m);
  return m;
}

bool Trainer::all_stopped() const {
  return !stopping_.empty() &&
         std::all_of(stopping_.begin(), stopping_.end(), [](const MemberStopping& s) { return s.stopped_epoch > 0; });
}

std::vector<int> Trainer::stopped_members() const {
  std::vector<int> out;
  for (std::size_t g = 0; g < stopping_.size(); ++g)
    if (stopping_[g].stopped_epoch > 0) out.push_back(static_cast<int>(g));
  return out;
}

void Trainer::update_early_stopping(const EpochMetrics& m) {
  if (stopping_.empty()) return;
  std::vector<int> improved, stopped_now;
  for (std::size_t g = 0; g < stopping_.size(); ++g) {
    MemberStopping& s = stopping_[g];
    if (s.stopped_epoch > 0) continue;
    const double nll = m.member_calibration.at(g).nll;
    // A NaN never improves on a number (a diverged member stops after `patience` epochs).
    if (s.best_epoch == 0 || nll < s.best_nll || (std::isnan(s.best_nll) && !std::isnan(nll))) {
      s.best_epoch = m.epoch;
      s.best_nll = nll;
      s.wait = 0;
      improved.push_back(static_cast<int>(g));
    } else if (++s.wait >= config_.patience) {
      s.stopped_epoch = m.epoch;
      stopped_now.push_back(static_cast<int>(g));
    }
  }
  if (!improved.empty()) {  // keep the improved members' parameters and state (collective: every process)
    const std::vector<float> params = stacked("params"), state = stacked("state");
    if (best_params_.empty()) {
      best_params_ = params;
      best_state_ = state;
    }
    for (int g : improved) {
      copy_member(model_->params_layout(), total_members(), g, params, best_params_);
      copy_member(model_->state_layout(), total_members(), g, state, best_state_);
    }
  }
  if (epochs_done_ >= config_.epochs || all_stopped()) {  // the run is over: every member at its best
    std::vector<int> all(stopping_.size());
    for (std::size_t g = 0; g < all.size(); ++g) all[g] = static_cast<int>(g);
    restore_best(all);
  } else {
    restore_best(stopped_now);
  }
}

void Trainer::restore_best(const std::vector<int>& which) {
  if (which.empty() || best_params_.empty()) return;
  std::vector<float> params = stacked("params"), state = stacked("state");
  std::map<std::string, std::vector<float>> opt;
  for (const std::string& slot : optimizer_->slots()) opt[slot] = stacked(slot);
  for (int g : which) {
    copy_member(model_->params_layout(), total_members(), g, best_params_, params);
    copy_member(model_->state_layout(), total_members(), g, best_state_, state);
  }
  restore(params, state, opt, step());
}

void Trainer::evaluate(EpochMetrics& m) { evaluator_->run(states_, work_ptrs_, options_, m, nullptr); }

EnsembleReport Trainer::evaluate_report(EpochMetrics& m) {
  EnsembleReport report;
  evaluator_->run(states_, work_ptrs_, options_, m, &report);
  return report;
}

std::int64_t Trainer::step() const { return states_[0].step.to_vector<std::int64_t>()[0]; }

bool Trainer::is_main_process() const { return mesh_.devices()[0].process == distributed::process_index(); }

std::vector<float> Trainer::params() const { return stacked("params"); }

std::vector<float> Trainer::model_state() const { return stacked("state"); }

std::vector<float> Trainer::optimizer_state(const std::string& slot) const {
  const auto& slots = optimizer_->slots();
  if (slot == "params" || slot == "state" || std::find(slots.begin(), slots.end(), slot) == slots.end()) {
    std::string names;
    for (const auto& s : slots) names += (names.empty() ? "" : ", ") + s;
    throw ValueError("optimizer_state: " + optimizer_->name() + " has no slot '" + slot + "' (its slots: " + names + ")");
  }
  return stacked(slot);
}

}  // namespace pmap::ensemble
