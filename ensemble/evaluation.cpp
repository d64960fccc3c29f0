// Evaluator: the evaluation the Trainer runs after each epoch and for a final report (ensemble/evaluation.h).
#include <pmapcc/ensemble/evaluation.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <string>

#include <pmap/collectives.h>
#include <pmap/error.h>
#include <pmap/pmap.h>

namespace pmap::ensemble {
namespace {

constexpr std::size_t kSlots = kernels::kCalibrationSlots;

// One eval batch's results of every device along the mesh's first axis, on the host: (devices, members),
// (devices), (devices, members + 1, slots); with a report, the size curve's sums and the per-image results.
struct EvalOnHost {
  std::vector<float> loss;
  std::vector<std::int32_t> correct, ensemble_correct;
  std::vector<double> calibration;
  std::int64_t bad_labels = 0;
  std::vector<double> curve;                   // (M, slots)
  std::vector<std::int32_t> predicted, votes;  // (eval batch), (M, eval batch)
  std::vector<float> probability, entropy;     // (eval batch)
};

EvalOnHost eval_to_host(const EvalResult& all, const Array& bad) {
  EvalOnHost h{all.loss.to_vector<float>(), all.correct.to_vector<std::int32_t>(),
               all.ensemble_correct.to_vector<std::int32_t>(), all.calibration.to_vector<double>(), 0, {}, {}, {}, {}, {}};
  for (std::int32_t v : bad.to_vector<std::int32_t>()) h.bad_labels += v;
  return h;
}

void add_report(const ReportResult& r, EvalOnHost& h) {
  h.curve = r.curve.to_vector<double>();
  h.predicted = r.predicted.to_vector<std::int32_t>();
  h.probability = r.probability.to_vector<float>();
  h.entropy = r.entropy.to_vector<float>();
  h.votes = r.votes.to_vector<std::int32_t>();
}

// Element-wise dst += src[offset, offset + dst.size()).
void add_slots(std::vector<double>& dst, const std::vector<double>& src, std::size_t offset) {
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i] += src[offset + i];
}

// Appends one eval batch's `rows` per-image results (and `first`..: their test indices) to p.
void add_predictions(const EvalOnHost& r, int rows, std::int64_t first, const Dataset& test, int members,
                     Predictions& p) {
  const auto eval_rows = r.predicted.size();
  p.votes.resize(static_cast<std::size_t>(members));
  for (int i = 0; i < rows; ++i) {
    const auto ui = static_cast<std::size_t>(i);
    p.label.push_back(test.labels[static_cast<std::size_t>(first + i)]);
    p.predicted.push_back(r.predicted[ui]);
    p.probability.push_back(r.probability[ui]);
    p.entropy.push_back(r.entropy[ui]);
    for (int m = 0; m < members; ++m)
      p.votes[static_cast<std::size_t>(m)].push_back(r.votes[static_cast<std::size_t>(m) * eval_rows + ui]);
  }
}

// The sums of an evaluation over its batches, in batch order: per device along the first axis each
// member's loss sum (loss x batch size), correct count and calibration sums; the ensemble's (device 0's:
// every device holds the same, from a psum); the size curve's.
struct EvalSums {
  EvalSums(std::size_t mesh_devices, std::size_t per_device, int curve_points)
      : devices(mesh_devices), per(per_device), loss(mesh_devices * per_device, 0.0), right(loss.size(), 0.0),
        member_slots(loss.size(), std::vector<double>(kSlots, 0.0)), ensemble_slots(kSlots, 0.0),
        curve_slots(static_cast<std::size_t>(curve_points), std::vector<double>(kSlots, 0.0)) {}

  void add(const EvalOnHost& r, int size) {
    for (std::size_t d = 0; d < devices; ++d)
      for (std::size_t j = 0; j < per; ++j) {
        const std::size_t i = d * per + j;
        loss[i] += static_cast<double>(r.loss[i]) * size;
        right[i] += r.correct[i];
        add_slots(member_slots[i], r.calibration, (d * (per + 1) + j) * kSlots);
      }
    add_slots(ensemble_slots, r.calibration, per * kSlots);  // device 0's ensemble row
    ensemble_right += static_cast<double>(r.ensemble_correct[0]);
    for (std::size_t k = 0; k < curve_slots.size(); ++k) add_slots(curve_slots[k], r.curve, k * kSlots);
  }

  // The metrics of the first `members` members (mesh order) over n test images.
  void finish(std::size_t members, double n, EpochMetrics& m, std::vector<SizePoint>* curve) const {
    m.member_test_accuracy.clear();
    m.member_calibration.clear();
    m.test_loss = 0;
    for (std::size_t g = 0; g < members; ++g) {
      m.member_test_accuracy.push_back(right[g] / n);
      m.test_loss += loss[g] / n / static_cast<double>(members);
      m.member_calibration.push_back(calibration_from_sums(member_slots[g]));
    }
    m.ensemble_test_accuracy = ensemble_right / n;
    m.ensemble_calibration = calibration_from_sums(ensemble_slots);
    for (std::size_t k = 0; curve != nullptr && k < curve_slots.size(); ++k)
      curve->push_back(
          SizePoint{static_cast<int>(k + 1), accuracy_from_sums(curve_slots[k]), calibration_from_sums(curve_slots[k])});
  }

  std::size_t devices, per;
  std::vector<double> loss, right;
  std::vector<std::vector<double>> member_slots;
  std::vector<double> ensemble_slots;
  std::vector<std::vector<double>> curve_slots;
  double ensemble_right = 0;
};

}  // namespace

void check_labels(std::int64_t bad, const char* where) {
  if (bad != 0)
    throw DataError(std::to_string(bad) + " label(s) outside the model's classes reached the loss in " + where +
                    " (the data loader validates labels; this should not happen)");
}

Evaluator::Evaluator(const Mesh& mesh, const Dataset& test, int eval_batch, int members_per_device, int total_members)
    : mesh_(mesh),
      test_(test),
      eval_batch_(static_cast<int>(std::min<std::int64_t>(eval_batch, test.count))),
      members_per_device_(members_per_device),
      total_members_(total_members) {
  const Batch prototype{Array(Shape{eval_batch_, test.rows, test.cols, 1}, DType::f32),
                        Array(Shape{eval_batch_}, DType::i32)};
  feed_ = std::make_unique<Feed<Batch>>(mesh_, prototype, FeedLayout::replicated());
  order_.resize(static_cast<std::size_t>(test.count));
  std::iota(order_.begin(), order_.end(), 0u);
}

Evaluator::~Evaluator() = default;

int Evaluator::size_at(std::int64_t begin) const {
  return static_cast<int>(std::min<std::int64_t>(eval_batch_, test_.count - begin));
}

void Evaluator::fill(std::int64_t begin, int size) {
  Batch& host = feed_->next();
  const std::span<const std::uint32_t> idx(order_.data() + begin, static_cast<std::size_t>(size));
  gather_batch(test_, idx, host.images.data<float>(), host.labels.data<std::int32_t>());
  feed_->push();
}

void Evaluator::run(const Sharded<TrainState>& states, const Sharded<DeviceWork*>& work, const StepOptions& options,
                    EpochMetrics& m, EnsembleReport* report) {
  const bool with_report = report != nullptr;
  if (with_report && report_work_.empty()) {  // allocated once, outside any step
    report_work_.resize(work.size());
    pmap::pmap([&](DeviceWork* w) {
      const auto i = static_cast<std::size_t>(std::find(work.begin(), work.end(), w) - work.begin());
      report_work_[i] = std::make_unique<ReportWork>(w->eval, total_members_);
    }, mesh_)(work);
  }
  const Device first_local = mesh_.local_devices()[0];
  std::vector<ReportWork*> report_ptrs(work.size(), nullptr);
  for (std::size_t i = 0; i < report_work_.size(); ++i) report_ptrs[i] = report_work_[i].get();
  const Sharded<ReportWork*> reports(std::move(report_ptrs));
  auto eval_fn = pmap::pmap([first_local, with_report](const TrainState& s, DeviceWork* w, ReportWork* rw,
                                                       const Batch& b, int rows, const StepOptions& o) {
    eval_step(s, *w, b, rows, o, with_report);
    const EvalResult all = all_gather(w->eval.result, o.axis);
    const Array bad = all_gather(w->eval.bad_labels, o.axis);
    if (with_report) report_step(*w, *rw, b, rows, o);
    if (current_device() != first_local) return EvalOnHost{};
    EvalOnHost h = eval_to_host(all, bad);
    if (with_report) add_report(rw->result, h);
    return h;
  }, mesh_);
  EvalSums sums(static_cast<std::size_t>(mesh_.axes()[0].size), static_cast<std::size_t>(members_per_device_),
                with_report ? total_members_ : 0);
  fill(0, size_at(0));
  for (std::int64_t begin = 0; begin < test_.count; begin += eval_batch_) {
    const std::int64_t next = begin + eval_batch_;
    if (next < test_.count) fill(next, size_at(next));  // the next batch's copy overlaps this one's step
    const int size = size_at(begin);
    auto res = eval_fn(states, work, reports, feed_->pop(), size, options);
    check_labels(res[0].bad_labels, "evaluation");
    sums.add(res[0], size);
    if (with_report) add_predictions(res[0], size, begin, test_, total_members_, report->predictions);
  }
  sums.finish(static_cast<std::size_t>(total_members_), static_cast<double>(test_.count), m,  // data parallel: 1
              with_report ? &report->size_curve : nullptr);
}

}  // namespace pmap::ensemble
