// Evaluation of an ensemble (or of one data- or model-parallel model) on a test set, split out of the
// Trainer: the eval step on every device, each batch's results all-gathered along the mesh's first axis and
// summed on the host in batch order (so every process holds the same bits), and the final report: the
// ensemble of the first k members for k = 1..M and every test image's results.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <pmap/feed.h>
#include <pmap/mesh.h>
#include <pmap/sharded.h>

#include <pmapcc/ensemble/data.h>
#include <pmapcc/ensemble/metrics.h>
#include <pmapcc/ensemble/step.h>

namespace pmap::ensemble {

// What a final evaluation adds: the ensemble of the first k members for k = 1..M, and per-image results.
struct EnsembleReport {
  std::vector<SizePoint> size_curve;
  Predictions predictions;
};

// DataError when `bad` labels outside the model's classes reached the loss in `where` ("training",
// "evaluation"): the data loader validates labels, so this should not happen.
void check_labels(std::int64_t bad, const char* where);

class Evaluator {
 public:
  // Evaluates `test` in batches of eval_batch (at most the test set) over `mesh`, whose devices along the
  // first axis hold members_per_device members each (total_members in all; data and model parallel: 1).
  // Allocates its feed of test batches now (replicated over the mesh, double-buffered).
  Evaluator(const Mesh& mesh, const Dataset& test, int eval_batch, int members_per_device, int total_members);
  ~Evaluator();

  // Per-member test loss, accuracy and calibration and the ensemble's accuracy and calibration of the
  // members in `states` (each device's, with its step buffers `work`), into m (epoch and timings untouched).
  // With `report`, also the ensemble-size curve and every test image's results, the same bits into m.
  void run(const Sharded<TrainState>& states, const Sharded<DeviceWork*>& work, const StepOptions& options,
           EpochMetrics& m, EnsembleReport* report);

 private:
  // Fills the feed's next host batch with test images [begin, begin + size).
  void fill(std::int64_t begin, int size);
  int size_at(std::int64_t begin) const;

  const Mesh& mesh_;
  const Dataset& test_;
  int eval_batch_, members_per_device_, total_members_;
  std::vector<std::uint32_t> order_;  // the test set in order: 0, 1, ..., count - 1
  std::unique_ptr<Feed<Batch>> feed_;
  std::vector<std::unique_ptr<ReportWork>> report_work_;  // per local device, made by the first report
};

}  // namespace pmap::ensemble
