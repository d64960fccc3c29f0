// Placement: the members' places on the mesh (ensemble/placement.h).
#include <pmapcc/ensemble/placement.h>

#include <algorithm>
#include <span>

#include <pmap/distributed.h>
#include <pmap/error.h>

#include <pmapcc/ensemble/member_layout.h>

namespace pmap::ensemble {

Placement::Placement(const TrainConfig& config, const Sequential& model, const Mesh& mesh)
    : model_(model), mesh_(mesh), data_parallel_(config.mode != Mode::ensemble) {
  for (const Device& d : mesh_.devices()) processes_ = processes_ || d.process > 0;
  for (const Device& d : mesh_.local_devices())
    mesh_index_.push_back(
        static_cast<int>(std::find(mesh_.devices().begin(), mesh_.devices().end(), d) - mesh_.devices().begin()));
  if (config.splits_weights()) {
    plan_ = std::make_unique<ShardingPlan>(model_, config.layout, mesh_.axes());
    // The first axis holds other members or other examples: a weight split over it would mix them.
    for (const ShardedTensor& t : plan_->tensors())
      if (std::find(t.axis_of_dim.begin(), t.axis_of_dim.end(), 0) != t.axis_of_dim.end())
        throw ValueError("layout of " + t.name + " (shape " + shape_str(t.shape) + "): " + t.spec.str() +
                         ": splits it over '" + mesh_.axes()[0].name + "', which holds " +
                         (config.mode == Mode::ensemble ? "other members" : "other examples") +
                         ": weights may be split over 'model' only (--layout)");
    local_ = local_model(model_, *plan_);
  }
  total_members_ = config.members;
  members_per_device_ = config.mode == Mode::ensemble ? config.members / mesh_.axes()[0].size : 1;
}

int Placement::first_member(std::size_t local_device) const {
  return data_parallel_ ? 0 : mesh_.coords(mesh_index_[local_device])[0] * members_per_device_;
}

std::pair<std::int64_t, std::int64_t> Placement::own_rows(int size) const {
  const int parts = mesh_.axes()[0].size;
  if (!data_parallel_ || !processes_ || size % parts != 0) return {0, size};
  const std::int64_t rows = size / parts;
  int lo = parts, hi = -1;
  for (int i : mesh_index_) {
    const int r = mesh_.coords(i)[0];
    lo = std::min(lo, r);
    hi = std::max(hi, r);
  }
  return {lo * rows, (hi + 1) * rows - lo * rows};
}

std::vector<float> Placement::stacked(const Sharded<TrainState>& states, const std::string& name) const {
  std::vector<std::vector<float>> mine;
  for (const TrainState& s : states)
    mine.push_back((name == "params" ? s.params : name == "state" ? s.state : s.opt.at(name)).to_vector<float>());
  const std::vector<float> all = distributed::process_allgather(mesh_, mine);  // every device's, in mesh order
  if (name == "state") {  // whole on every device: the devices at (r, 0, ...) hold the members at r
    if (!plan_)
      return stack_members(model_.state_layout(), all, data_parallel_ ? 1 : mesh_.size(), members_per_device_,
                           total_members_);
    const auto per = static_cast<std::int64_t>(members_per_device_) * model_.state_per_member();
    const int rows = data_parallel_ ? 1 : mesh_.axes()[0].size;
    std::vector<float> blocks(static_cast<std::size_t>(rows * per));
    for (int i = 0; i < mesh_.size(); ++i) {
      const std::vector<int> c = mesh_.coords(i);
      if (c[0] < rows && std::all_of(c.begin() + 1, c.end(), [](int v) { return v == 0; }))
        std::copy_n(all.begin() + i * per, per, blocks.begin() + c[0] * per);
    }
    return stack_members(model_.state_layout(), blocks, rows, members_per_device_, total_members_);
  }
  // Data parallel: every device holds the one model; the first device's copy is it.
  if (!plan_) return stack_members(model_, all, data_parallel_ ? 1 : mesh_.size(), members_per_device_, total_members_);
  // Split weights: member j of the devices at r along the first axis is put back together from the blocks
  // of the devices (r, 0..M-1) along "model" (data and model parallel: r = 0 holds the one model).
  const auto per = static_cast<std::int64_t>(members_per_device_), local = plan_->local_params();
  const auto full = static_cast<std::size_t>(plan_->full_params());
  const int rows = data_parallel_ ? 1 : mesh_.axes()[0].size;
  std::vector<float> members(static_cast<std::size_t>(rows * per) * full);  // member by member, whole
  for (int i = 0; i < mesh_.size(); ++i) {
    const std::vector<int> c = mesh_.coords(i);
    if (c[0] >= rows) continue;
    const std::vector<float> device(all.begin() + static_cast<std::ptrdiff_t>(i * per * local),
                                    all.begin() + static_cast<std::ptrdiff_t>((i + 1) * per * local));
    for (std::int64_t j = 0; j < per; ++j) {
      const std::vector<float> block = member_block(device_model(), device, per, j, 1);
      const auto g = static_cast<std::size_t>(c[0] * per + j);
      plan_->unshard(block, c, std::span<float>(members.data() + g * full, full));
    }
  }
  return stack_members(model_, members, static_cast<int>(rows * per), 1, total_members_);
}

void Placement::restore(Sharded<TrainState>& states, const std::vector<float>& params, const std::vector<float>& state,
                        const std::map<std::string, std::vector<float>>& opt, std::int64_t step) const {
  const auto per = static_cast<std::int64_t>(members_per_device_);
  for (std::size_t i = 0; i < mesh_index_.size(); ++i) {
    TrainState& s = states[i];
    const std::vector<int> c = mesh_.coords(mesh_index_[i]);
    const std::int64_t first = data_parallel_ ? 0 : std::int64_t{c[0]} * per;
    std::vector<std::pair<const std::vector<float>*, Array*>> variables{{&params, &s.params}};
    for (auto& [slot, array] : s.opt) variables.emplace_back(&opt.at(slot), &array);
    for (auto [src, dst] : variables) {
      std::vector<float> block;
      if (plan_) {  // this device's blocks of each of its members, stacked as the local model's tensors
        const auto local = static_cast<std::size_t>(plan_->local_params());
        std::vector<float> mine(static_cast<std::size_t>(per) * local);
        for (std::int64_t j = 0; j < per; ++j)
          plan_->shard(member_block(model_, *src, total_members_, first + j, 1), c,
                       std::span<float>(mine.data() + static_cast<std::size_t>(j) * local, local));
        block = stack_members(device_model(), mine, static_cast<int>(per), 1, per);
      } else {
        block = member_block(model_, *src, total_members_, first, per);
      }
      dst->copy_from_host(block.data(), block.size() * sizeof(float));
    }
    const std::vector<float> st = member_block(model_.state_layout(), state, total_members_, first, per);
    if (!st.empty()) s.state.copy_from_host(st.data(), st.size() * sizeof(float));
    s.step.copy_from_host(&step, sizeof step);
  }
}

}  // namespace pmap::ensemble
