// Trainer: configuration checks, member initialization, the epoch loop and evaluation.
#include "ensemble/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>

#include <pmap/distributed.h>
#include <pmap/error.h>

namespace pmap::ensemble {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Mesh build_mesh(const TrainConfig& c) {
  // Under mpirun/srun (distributed::initialize() called), the mesh spans every process's devices.
  const int local_n = c.devices > 0 ? c.devices : -1;
  auto devices = distributed::process_count() > 1 ? distributed::global_devices(c.backend, local_n)
                                                  : local_devices(c.backend, local_n);
  MeshOptions options;
  options.pin_threads = c.pin_threads;
  return Mesh(std::move(devices), c.mode == Mode::ensemble ? "ensemble" : "data", options);
}

void check_config(const TrainConfig& c, int devices, const Dataset& train, const Dataset& test) {
  auto bad = [](const std::string& m) { throw ValueError(m); };
  if (c.epochs < 0) bad("--epochs must be >= 0, got " + std::to_string(c.epochs));
  if (c.batch_size < 1) bad("--batch-size must be >= 1, got " + std::to_string(c.batch_size));
  if (!(c.learning_rate > 0) || !std::isfinite(c.learning_rate))
    bad("--lr must be a positive number, got " + std::to_string(c.learning_rate));
  if (!(c.momentum >= 0 && c.momentum < 1)) bad("--momentum must be in [0, 1), got " + std::to_string(c.momentum));
  if (c.eval_batch < 1) bad("eval batch must be >= 1");
  if (c.mode == Mode::ensemble && c.members % devices != 0)
    bad("--members " + std::to_string(c.members) + " is not a multiple of --devices " + std::to_string(devices) +
        ": every device runs the same number of members");
  if (c.mode == Mode::data_parallel && c.members != 1)
    bad("--mode data-parallel trains one model replicated over the devices: --members must be 1, got " +
        std::to_string(c.members));
  if (c.mode == Mode::data_parallel && c.batch_size % devices != 0)
    bad("--batch-size " + std::to_string(c.batch_size) + " does not split evenly over --devices " +
        std::to_string(devices));
  if (train.count < c.batch_size)
    bad("--batch-size " + std::to_string(c.batch_size) + " is larger than the " + std::to_string(train.count) +
        " training examples (see --train-limit)");
  if (test.count < 1) bad("the test set is empty");
  if (train.rows != test.rows || train.cols != test.cols) bad("training and test images differ in size");
}

// FNV-1a over the bytes of `data`, continuing from `h`.
std::uint64_t fnv1a(std::span<const std::uint8_t> data, std::uint64_t h = 14695981039346656037ull) {
  for (std::uint8_t b : data) h = (h ^ b) * 1099511628211ull;
  return h;
}

std::uint64_t fingerprint(const Json& config, const Dataset& train, const Dataset& test) {
  const std::string text = config.dump();
  std::uint64_t h = fnv1a({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
  for (const Dataset* d : {&train, &test}) {
    const std::int64_t dims[3] = {d->count, d->rows, d->cols};
    h = fnv1a({reinterpret_cast<const std::uint8_t*>(dims), sizeof(dims)}, h);
    h = fnv1a(d->images, h);
    h = fnv1a(d->labels, h);
  }
  return h;
}

}  // namespace

int Trainer::member_group() const { return work_.empty() ? 0 : work_.front()->runner.group(); }

std::string_view to_string(Mode m) { return m == Mode::ensemble ? "ensemble" : "data-parallel"; }

Mode parse_mode(std::string_view text) {
  if (text == "ensemble") return Mode::ensemble;
  if (text == "data-parallel") return Mode::data_parallel;
  throw ValueError("--mode must be ensemble or data-parallel, got '" + std::string(text) + "'");
}

Json TrainConfig::to_json() const {
  Json j = Json::object();
  j.set("backend", std::string(pmap::to_string(backend)));
  j.set("devices", devices);
  j.set("members", members);
  j.set("mode", std::string(ensemble::to_string(mode)));
  j.set("epochs", epochs);
  j.set("batch_size", batch_size);
  j.set("lr", static_cast<double>(learning_rate));
  j.set("momentum", static_cast<double>(momentum));
  j.set("seed", static_cast<std::int64_t>(seed));
  j.set("train_limit", train_limit);
  j.set("test_limit", test_limit);
  j.set("eval_batch", eval_batch);
  j.set("pin_threads", pin_threads);
  j.set("member_group", member_group);
  j.set("processes", processes);
  return j;
}

Trainer::Trainer(TrainConfig config, const Dataset& train, const Dataset& test)
    : config_(config), train_(train), test_(test),
      model_(flax_mnist_cnn({train.rows, train.cols, 1}, train.num_classes)), mesh_(build_mesh(config)) {
  const int devices = mesh_.size();
  config_.devices = devices;
  config_.processes = 1;
  for (const Device& d : mesh_.devices()) config_.processes = std::max(config_.processes, d.process + 1);
  for (const Device& d : mesh_.local_devices())
    mesh_index_.push_back(static_cast<int>(std::find(mesh_.devices().begin(), mesh_.devices().end(), d) -
                                           mesh_.devices().begin()));
  if (config_.members == 0) config_.members = config_.mode == Mode::ensemble ? devices : 1;
  check_config(config_, devices, train, test);
  total_members_ = config_.members;
  members_per_device_ = config_.mode == Mode::ensemble ? config_.members / devices : 1;
  if (config_.member_group < 0 || config_.member_group > members_per_device_)
    throw ValueError("member group " + std::to_string(config_.member_group) + " is outside 0.." +
                     std::to_string(members_per_device_) + " (the members per device; 0: default)");
  auto keys = split(key(config_.seed), 2);
  init_key_ = keys[0];
  data_key_ = keys[1];
  options_.sgd = kernels::SgdParams{config_.learning_rate, config_.momentum, false};
  options_.data_parallel = config_.mode == Mode::data_parallel;
  options_.axis = mesh_.axes()[0].name;
  options_.total_members = total_members_;
  // Activations for one training step's rows per device; evaluation runs its batches through them in pieces.
  const int rows = options_.data_parallel ? config_.batch_size / devices : config_.batch_size;
  const int eval_batch = std::min<int>(config_.eval_batch, static_cast<int>(test.count));
  std::vector<DeviceWork*> ptrs;
  std::vector<TrainState> states;
  for (const Device& d : mesh_.local_devices()) {
    work_.push_back(std::make_unique<DeviceWork>(*model_, d, members_per_device_, rows, eval_batch,
                                                 config_.member_group));
    ptrs.push_back(work_.back().get());
    const Shape s{members_per_device_ * model_->params_per_member()};
    states.push_back(TrainState{Array(s, DType::f32, d), Array(s, DType::f32, d), 0});
  }
  work_ptrs_ = Sharded<DeviceWork*>(std::move(ptrs));
  states_ = Sharded<TrainState>(std::move(states));
  const std::size_t example = static_cast<std::size_t>(train.rows * train.cols);
  const std::size_t host_batch = static_cast<std::size_t>(std::max(config_.batch_size, eval_batch));
  batch_images_.resize(host_batch * example);
  batch_labels_.resize(host_batch);
  if (config_.processes > 1) check_processes_agree();
  init_members();
}

void Trainer::check_processes_agree() const {
  // Processes started with different flags or data would train different things under one mesh.
  const std::uint64_t mine = fingerprint(config_.to_json(), train_, test_);
  const auto all = from_all_devices(std::vector<std::vector<std::int64_t>>(
      static_cast<std::size_t>(mesh_.local_size()), std::vector<std::int64_t>{static_cast<std::int64_t>(mine)}));
  std::string differ;
  for (std::size_t d = 0; d < all.size(); ++d)
    if (static_cast<std::uint64_t>(all[d]) != static_cast<std::uint64_t>(all[0]))
      differ += (differ.empty() ? "" : ", ") + std::to_string(mesh_.devices()[d].process);
  if (!differ.empty())
    throw ValueError("the processes of this run differ in their flags or data (process " + differ +
                     " against process 0): every process must get the same flags and the same data files; this "
                     "process has " + config_.to_json().dump() + " and " + std::to_string(train_.count) + " + " +
                     std::to_string(test_.count) + " examples");
}

Trainer::~Trainer() = default;

int Trainer::steps_per_epoch() const { return static_cast<int>(ensemble::steps_per_epoch(train_.count, config_.batch_size)); }

void Trainer::init_members() {
  // Data parallel: one model (member 0's key) on every replica.
  const auto keys = split(init_key_, total_members_);
  std::vector<float> all(static_cast<std::size_t>(total_members_ * model_->params_per_member()));
  model_->init(keys, all);
  scatter(all, std::vector<float>(all.size(), 0.0f), 0);
}

HostBatch Trainer::gather_batch(const std::vector<std::uint32_t>& order, std::int64_t begin, int size,
                                const Dataset& data, bool own_rows_only) {
  // A data-parallel training step over several processes: each process fills only its devices' rows of
  // the batch (the step reads device r's block at r * rows; the other rows are never read here).
  // Evaluation reads every row on every device.
  std::int64_t first = 0, count = size;
  if (own_rows_only && options_.data_parallel && config_.processes > 1 && size % mesh_.size() == 0) {
    const std::int64_t rows = size / mesh_.size();
    const auto [lo, hi] = std::minmax_element(mesh_index_.begin(), mesh_index_.end());
    first = *lo * rows;
    count = (*hi + 1) * rows - first;
  }
  std::span<const std::uint32_t> idx(order.data() + begin + first, static_cast<std::size_t>(count));
  const auto example = static_cast<std::size_t>(data.image_size());
  ensemble::gather_batch(data, idx, batch_images_.data() + static_cast<std::size_t>(first) * example,
                         batch_labels_.data() + first);
  return HostBatch{batch_images_.data(), batch_labels_.data(), size};
}

EpochMetrics Trainer::run_epoch(const StepCallback& on_step) {
  EpochMetrics m;
  m.epoch = epochs_done_ + 1;
  const auto order = permutation(fold_in(data_key_, static_cast<std::uint32_t>(epochs_done_)),
                                 static_cast<std::uint32_t>(train_.count));
  const int steps = steps_per_epoch();
  // Each step all-gathers every device's member losses and correct counts (counts are exact in f32), so
  // that every process sums the same values in one order (device, member) and the processes of a mesh
  // that spans several stay in step: a lost process is noticed within a step, not at the epoch's end.
  const auto per = static_cast<std::size_t>(members_per_device_);
  auto step_fn = pmap::pmap([per](TrainState& s, DeviceWork* w, const HostBatch& b, const StepOptions& o) {
    const StepResult r = train_step(s, *w, b, o);
    std::vector<float> mine(2 * per);
    for (std::size_t j = 0; j < per; ++j) {
      mine[j] = r.loss[j];
      mine[per + j] = static_cast<float>(r.correct[j]);
    }
    const Array stats = Array::from_host(mine, Shape{static_cast<std::int64_t>(mine.size())}, current_device());
    return all_gather(stats, o.axis, /*tiled=*/true).to_vector<float>();  // (devices, 2 * per)
  }, mesh_);
  // Ensemble: the mean over all members; data parallel: the mean over the devices' blocks.
  const double divisor = static_cast<double>(options_.data_parallel ? mesh_.size() : total_members_);
  const auto devices = static_cast<std::size_t>(mesh_.size());
  double loss_sum = 0, correct = 0;
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    HostBatch b = gather_batch(order, static_cast<std::int64_t>(s) * config_.batch_size, config_.batch_size, train_,
                               /*own_rows_only=*/true);
    auto res = step_fn(states_, work_ptrs_, b, options_);
    const std::vector<float>& all = res[0];
    double step_loss = 0;
    for (std::size_t d = 0; d < devices; ++d)
      for (std::size_t j = 0; j < per; ++j) {
        step_loss += all[d * 2 * per + j];
        correct += all[d * 2 * per + per + j];
      }
    loss_sum += step_loss / divisor;
    if (on_step) {
      const double secs = seconds_since(t0);
      on_step(s + 1, steps, loss_sum / (s + 1),
              secs > 0 ? static_cast<double>(total_members_) * config_.batch_size * (s + 1) / secs : 0.0);
    }
  }
  m.seconds = seconds_since(t0);
  const double seen = static_cast<double>(steps) * config_.batch_size;
  m.train_loss = steps > 0 ? loss_sum / steps : 0.0;
  m.train_accuracy = steps > 0 ? correct / (seen * total_members_) : 0.0;
  m.model_images_per_second = m.seconds > 0 ? total_members_ * seen / m.seconds : 0.0;
  ++epochs_done_;
  const auto t1 = Clock::now();
  evaluate(m);
  m.eval_seconds = seconds_since(t1);
  history_.push_back(m);
  return m;
}

void Trainer::evaluate(EpochMetrics& m) {
  auto eval_fn = pmap::pmap([](const TrainState& s, DeviceWork* w, const HostBatch& b, const StepOptions& o) {
    return eval_step(s, *w, b, o);
  }, mesh_);
  std::vector<std::uint32_t> order(static_cast<std::size_t>(test_.count));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  // Per local device: each member's loss sum (loss × batch size over the batches) and correct count,
  // then gathered over the mesh. Every device holds the ensemble's count (it comes from a pmean).
  const auto per = static_cast<std::size_t>(members_per_device_);
  std::vector<std::vector<double>> sums(static_cast<std::size_t>(mesh_.local_size()), std::vector<double>(2 * per, 0.0));
  double ensemble_right = 0;
  for (std::int64_t begin = 0; begin < test_.count; begin += config_.eval_batch) {
    const int size = static_cast<int>(std::min<std::int64_t>(config_.eval_batch, test_.count - begin));
    auto res = eval_fn(states_, work_ptrs_, gather_batch(order, begin, size, test_), options_);
    for (std::size_t i = 0; i < res.size(); ++i)
      for (std::size_t j = 0; j < per; ++j) {
        sums[i][j] += static_cast<double>(res[i].loss[j]) * size;
        sums[i][per + j] += res[i].correct[j];
      }
    ensemble_right += static_cast<double>(res[0].ensemble_correct);
  }
  const std::vector<double> all = from_all_devices(sums);
  std::vector<double> loss(static_cast<std::size_t>(total_members_), 0.0), right(loss.size(), 0.0);
  const std::size_t devices_reporting = options_.data_parallel ? 1 : static_cast<std::size_t>(mesh_.size());
  for (std::size_t d = 0; d < devices_reporting; ++d)
    for (std::size_t j = 0; j < per; ++j) {
      loss[d * per + j] = all[d * 2 * per + j];
      right[d * per + j] = all[d * 2 * per + per + j];
    }
  const double n = static_cast<double>(test_.count);
  m.member_test_accuracy.clear();
  m.test_loss = 0;
  for (std::size_t g = 0; g < loss.size(); ++g) {
    m.member_test_accuracy.push_back(right[g] / n);
    m.test_loss += loss[g] / n / static_cast<double>(loss.size());
  }
  m.ensemble_test_accuracy = ensemble_right / n;
}

std::int64_t Trainer::step() const { return states_[0].step; }

bool Trainer::is_main_process() const { return mesh_.devices()[0].process == distributed::process_index(); }

template <class T> std::vector<T> Trainer::from_all_devices(const std::vector<std::vector<T>>& mine) const {
  std::vector<Array> arrays;
  for (std::size_t i = 0; i < mine.size(); ++i)
    arrays.push_back(Array::from_host(mine[i], Shape{static_cast<std::int64_t>(mine[i].size())}, mesh_.local_devices()[i]));
  const std::string axis = options_.axis;
  auto gathered = pmap::pmap([&axis](const Array& a) {
    return all_gather(a, axis, /*tiled=*/true).template to_vector<T>();
  }, mesh_)(Sharded<Array>(std::move(arrays)));
  return std::move(gathered[0]);
}

std::vector<float> Trainer::gather(bool momentum) const {
  const std::int64_t total = total_members_, local = members_per_device_;
  std::vector<std::vector<float>> mine;
  for (const TrainState& s : states_) mine.push_back((momentum ? s.momentum : s.params).to_vector<float>());
  const std::vector<float> all = from_all_devices(mine);
  const auto per_device = static_cast<std::int64_t>(mine[0].size());
  std::vector<float> out(static_cast<std::size_t>(total * model_->params_per_member()));
  const int devices_holding = options_.data_parallel ? 1 : mesh_.size();
  for (int d = 0; d < devices_holding; ++d) {
    const auto host = all.begin() + d * per_device;
    for (const auto& t : model_->tensors())
      for (std::int64_t j = 0; j < local; ++j) {
        const std::int64_t g = d * local + j;
        std::copy_n(host + t.offset * local + j * t.size, t.size, out.begin() + t.offset * total + g * t.size);
      }
  }
  return out;
}

void Trainer::scatter(const std::vector<float>& params, const std::vector<float>& momentum, std::int64_t step) {
  const std::int64_t total = total_members_, local = members_per_device_;
  for (std::size_t i = 0; i < mesh_index_.size(); ++i) {
    TrainState& s = states_[i];
    const std::int64_t first = options_.data_parallel ? 0 : mesh_index_[i] * local;
    for (auto [src, dst] : {std::pair{&params, &s.params}, std::pair{&momentum, &s.momentum}}) {
      std::vector<float> host(static_cast<std::size_t>(dst->size()));
      for (const auto& t : model_->tensors())
        for (std::int64_t j = 0; j < local; ++j)
          std::copy_n(src->begin() + t.offset * total + (first + j) * t.size, t.size,
                      host.begin() + t.offset * local + j * t.size);
      dst->copy_from_host(host.data(), host.size() * sizeof(float));
    }
    s.step = step;
  }
}

}  // namespace pmap::ensemble
