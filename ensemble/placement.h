// Placement (the design review's W1, split out of the Trainer): where the members live. It holds the mesh's
// member-to-device map (which members each local device holds), each weight's blocks when weights are split
// over "model" (the sharding plan and the model a device runs), the rows of a training batch this process
// fills, and the moves between the devices' train states and the members stacked as checkpoints hold them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pmap/mesh.h>
#include <pmap/sharded.h>

#include <pmapcc/ensemble/config.h>
#include <pmapcc/ensemble/layout.h>
#include <pmapcc/ensemble/model.h>
#include <pmapcc/ensemble/train_state.h>

namespace pmap::ensemble {

class Placement {
 public:
  // The members of `config` (members set and checked) over `mesh`, built for it; `model` is the whole model.
  // With config.splits_weights(), makes the sharding plan from config.layout: ValueError for a weight split
  // over the mesh's first axis, which holds other members or other examples.
  Placement(const TrainConfig& config, const Sequential& model, const Mesh& mesh);

  const Mesh& mesh() const { return mesh_; }
  // Where each weight lives when weights are split (nullptr otherwise), and the layers' splits.
  const ShardingPlan* plan() const { return plan_.get(); }
  const LocalModel& local() const { return local_; }
  // The model a device runs: the local model when weights are split, else the model.
  const Sequential& device_model() const { return local_.model ? *local_.model : model_; }
  int members_per_device() const { return members_per_device_; }
  int total_members() const { return total_members_; }
  // The global index of the first member local device i holds (data and model parallel: 0, the one model).
  int first_member(std::size_t local_device) const;
  // The rows [first, first + count) of a `size`-row training batch that this process must fill: data
  // parallel over several processes, only its devices' rows (the device at r along the first axis gets rows
  // [r * size / n, (r + 1) * size / n)); otherwise every row.
  std::pair<std::int64_t, std::int64_t> own_rows(int size) const;

  // The members' variable `name` ("params", "state" or an optimizer slot) of `states` (the local devices'),
  // stacked as a checkpoint holds it, gathered from every device (weights split over "model" put back
  // together; the state is whole on every device). Collective over the processes.
  std::vector<float> stacked(const Sharded<TrainState>& states, const std::string& name) const;
  // The reverse: each local device's members (its blocks of their weights) into `states`, from stacked
  // params, model state and optimizer slots (every slot of the states, by name), at `step`.
  void restore(Sharded<TrainState>& states, const std::vector<float>& params, const std::vector<float>& state,
               const std::map<std::string, std::vector<float>>& opt, std::int64_t step) const;

 private:
  const Sequential& model_;
  const Mesh& mesh_;
  bool data_parallel_;      // data and model parallel: one model, the batch split over the first axis
  bool processes_ = false;  // the mesh spans several processes
  std::unique_ptr<ShardingPlan> plan_;
  LocalModel local_;
  std::vector<int> mesh_index_;  // mesh position of each local device
  int members_per_device_ = 1;
  int total_members_ = 1;
};

}  // namespace pmap::ensemble
