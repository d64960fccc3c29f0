// Feed<T>: batches from the host onto a mesh's devices, double-buffered (Flax's prefetch_to_device). A
// batch is a tree T of Arrays with the prototype's shapes and dtypes; it reaches every local device whole
// (FeedLayout::replicated(), ensemble training), split along the leading axis over mesh axes
// (FeedLayout::sharded(axes), data parallelism: device i along the axes gets block i, as shard()), or split
// as PartitionSpecs say (FeedLayout::partitioned(specs), as shard(tree, mesh, specs); pop()'s value knows
// its specs and its mesh, so shard_map takes it as it is on this mesh and refuses it on another).
//
// On CUDA devices the host buffers are pinned and each device copies on a stream of its own, so the copy
// of batch s+1 runs while step s computes; the device's stream waits for a batch's copy (on the GPU, not
// the host) when the batch is popped. A block that is not one run of the batch (a dimension but the first
// split) is gathered at push(): into a pinned host buffer that the device copies from, or on a CPU device
// straight into its buffer. On CPU devices a push is a plain copy into each device's buffers (replicated:
// next() is the first device's buffers, copied to the others).
//
//   pmap::Feed<Batch> feed(mesh, prototype);        // prototype: one batch's shapes (host Arrays)
//   fill(feed.next()); feed.push();                 // batch 0 on its way
//   for (int s = 0; s < steps; ++s) {
//     if (s + 1 < steps) { fill(feed.next()); feed.push(); }   // batch s+1 on its way
//     step_fn(states, feed.pop());                  // step s, on batch s (a Sharded<T> argument)
//   }
//
// At most two batches are pushed and not yet popped. Host-thread only (not inside a pmapped function).
// Buffers are allocated once, at construction; later calls allocate nothing.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <pmap/array.h>
#include <pmap/mesh.h>
#include <pmap/partition.h>
#include <pmap/sharded.h>
#include <pmap/transfer.h>
#include <pmap/tree.h>

namespace pmap {

struct FeedLayout {
  bool shard = false;
  AxisNames axes;  // sharded: the axes the leading axis is split over (empty: every axis)
  bool by_spec = false;    // partitioned: each leaf split by its spec,
  Specs specs;             // by leaf path (a leaf not named is replicated),
  std::optional<P> every;  // or one spec for every leaf
  static FeedLayout replicated() { return FeedLayout{}; }
  static FeedLayout sharded(AxisNames over = {}) {
    FeedLayout l;
    l.shard = true;
    l.axes = std::move(over);
    return l;
  }
  static FeedLayout partitioned(Specs by_path) {
    FeedLayout l;
    l.by_spec = true;
    l.specs = std::move(by_path);
    return l;
  }
  static FeedLayout partitioned(P every_leaf) {
    FeedLayout l;
    l.by_spec = true;
    l.every = std::move(every_leaf);
    return l;
  }
};

namespace detail {

// The tree-free part of a Feed: slots of host and device leaves, copies, events and streams.
class FeedCore {
 public:
  // host[slot][leaf]; device[slot][local device][leaf]; prototype leaves give the whole batch's shapes.
  // Partitioned: splits[leaf] says how each leaf splits (empty otherwise).
  FeedCore(const Mesh& mesh, std::vector<std::vector<Array*>> host,
           std::vector<std::vector<std::vector<Array*>>> device, FeedLayout layout, std::vector<Split> splits = {});
  ~FeedCore();
  FeedCore(const FeedCore&) = delete;
  FeedCore& operator=(const FeedCore&) = delete;

  int next_slot();  // waits until the slot's host buffers may be written
  void push();
  int pop_slot();   // the devices' streams wait for the slot's copies

 private:
  struct DeviceState;
  const Mesh& mesh_;
  std::vector<std::vector<Array*>> host_;
  std::vector<std::vector<std::vector<Array*>>> device_;
  FeedLayout layout_;
  std::vector<int> piece_;  // per local device: its block (sharded)
  int parts_ = 1;
  std::vector<Split> splits_;                          // partitioned: per leaf
  std::vector<std::vector<std::vector<int>>> index_;  // partitioned: [leaf][local device] its block's index
  std::vector<std::vector<std::vector<Array>>> gathered_;  // [slot][local device][leaf]: a GPU's gathered
                                                           // block (pinned; empty where one run)
  std::vector<std::unique_ptr<DeviceState>> state_;  // per local device
  long long pushed_ = 0, popped_ = 0;
  bool slot_taken_ = false;  // next() was called and push() not yet
};

}  // namespace detail

template <class T> class Feed {
 public:
  Feed(const Mesh& mesh, const T& prototype, FeedLayout layout = FeedLayout::replicated()) {
    if (layout.shard && layout.by_spec)
      throw ValueError("Feed: a FeedLayout is sharded (the leading axis) or partitioned (by specs), not both");
    const int parts = layout.shard ? mesh.axis_size(layout.axes) : 1;
    // Replicated onto CPU devices, the first device's buffers are host memory already: the batch is filled
    // there, and pushed to the other devices.
    fill_first_device_ = !layout.shard && !layout.by_spec && mesh.local_devices().front().is_cpu();
    std::vector<detail::Split> splits;  // partitioned: per Array leaf
    std::vector<LeafSpec> leaf_specs;
    if (layout.by_spec) {
      std::vector<std::string> paths;
      std::vector<const Array*> leaves;
      tree_for_each_with_path(prototype, [&](const std::string& path, const auto& leaf) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
          paths.push_back(path);
          leaves.push_back(&leaf);
        }
      });
      const std::vector<P> spec = layout.every ? std::vector<P>(paths.size(), *layout.every)
                                               : detail::specs_of_leaves(paths, layout.specs.by_path(), "Feed");
      for (std::size_t i = 0; i < paths.size(); ++i) {
        splits.push_back(detail::split_of("Feed", paths[i], leaves[i]->shape(), leaves[i]->dtype(), spec[i], mesh));
        leaf_specs.push_back({paths[i], spec[i]});
      }
    }
    std::vector<std::vector<Array*>> host_leaves(2);
    std::vector<std::vector<std::vector<Array*>>> device_leaves(2);
    auto leaves_of = [](T& tree, std::vector<Array*>& out) {
      tree_for_each(tree, [&](auto& leaf) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) out.push_back(&leaf);
      });
    };
    for (int slot = 0; slot < 2; ++slot) {
      if (!fill_first_device_) {
        host_[slot] = tree_map(prototype, [](const auto& leaf) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
            return Array::pinned(leaf.shape(), leaf.dtype());
          } else {
            return leaf;
          }
        });
      }
      std::vector<T> per_device;
      for (const Device& d : mesh.local_devices()) {
        std::size_t k = 0;
        per_device.push_back(tree_map(prototype, [&](const auto& leaf) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
            Shape s = layout.by_spec ? splits[k++].block : leaf.shape();
            if (layout.shard && !s.empty()) s[0] /= parts;
            return Array(s, leaf.dtype(), d);
          } else {
            return leaf;
          }
        }));
      }
      device_[slot] = Sharded<T>(std::move(per_device), leaf_specs,
                                 layout.by_spec ? detail::mesh_identity(mesh) : std::string());
      for (T& tree : device_[slot]) leaves_of(tree, device_leaves[slot].emplace_back());
      leaves_of(fill_first_device_ ? device_[slot][0] : host_[slot], host_leaves[slot]);
    }
    core_ = std::make_unique<detail::FeedCore>(mesh, std::move(host_leaves), std::move(device_leaves),
                                               std::move(layout), std::move(splits));
  }

  // The host tree to fill with the next batch (pinned memory when GPUs are in use). Waits until the copy
  // out of it (two pushes ago) has finished. ValueError when two batches are pushed and not popped.
  T& next() {
    const int slot = core_->next_slot();
    return fill_first_device_ ? device_[slot][0] : host_[slot];
  }
  // Starts copying the batch filled through next() to every local device (returns once the copies are
  // queued on GPUs, after gathering any block that is not one run; CPU devices' copies are done).
  void push() { core_->push(); }
  // The oldest pushed batch on the devices (one tree per local device, for a pmapped function). Each
  // device's stream will wait for the batch's copy before the work queued after this call. Valid until
  // the second push() after it. ValueError when nothing was pushed.
  const Sharded<T>& pop() { return device_[core_->pop_slot()]; }

 private:
  bool fill_first_device_ = false;
  T host_[2];  // unused when fill_first_device_
  Sharded<T> device_[2];
  std::unique_ptr<detail::FeedCore> core_;
};

}  // namespace pmap
