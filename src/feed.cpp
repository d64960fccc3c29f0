// FeedCore: the double-buffered staging behind pmap::Feed. Per CUDA device: a copy stream, an event per
// slot marking its copy, and an event marking the device's work so far (the copy into a slot waits for
// the steps that read it); per CPU device: plain copies.
#include <pmap/feed.h>

#include <cstring>
#include <string>

#include <pmap/error.h>
#include <pmap/transfer.h>

#include "cuda_seam.h"
#include "mesh_impl.h"

namespace pmap::detail {

struct FeedCore::DeviceState {
  Device device;
  int mesh_index = 0;
  DeviceStream copy_stream;        // CUDA devices: the stream the copies run on
  EventHandle copied[2] = {nullptr, nullptr};
  EventHandle released = nullptr;  // recorded on the device's stream before each copy into a slot
  bool pushed[2] = {false, false};

  DeviceState(const Device& d, int index)
      : device(d), mesh_index(index), copy_stream(!d.is_cpu(), d.ordinal) {
    if (d.is_cpu()) return;
    for (auto& e : copied) e = cuda_event_create(d.ordinal);
    released = cuda_event_create(d.ordinal);
  }
  ~DeviceState() {
    for (EventHandle e : copied) cuda_event_destroy(device.ordinal, e);
    cuda_event_destroy(device.ordinal, released);
  }
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;
};

FeedCore::FeedCore(const Mesh& mesh, std::vector<std::vector<Array*>> host,
                   std::vector<std::vector<std::vector<Array*>>> device, FeedLayout layout, std::vector<Split> splits)
    : mesh_(mesh), host_(std::move(host)), device_(std::move(device)), layout_(std::move(layout)),
      splits_(std::move(splits)) {
  if (host_[0].empty()) throw ShapeError("Feed: the prototype tree has no arrays");
  if (layout_.by_spec && splits_.size() != host_[0].size())
    throw Error("Feed: a partitioned FeedLayout needs one split per leaf");
  parts_ = layout_.shard ? mesh.axis_size(layout_.axes) : 1;
  if (layout_.shard) {
    const std::string over = layout_.axes.empty() ? std::string("all axes") : layout_.axes.str();
    for (std::size_t l = 0; l < host_[0].size(); ++l) {
      const Array& a = *host_[0][l];
      if (a.ndim() == 0)
        throw ShapeError("Feed sharded over " + over + ": leaf " + std::to_string(l) + " (" + a.str() +
                         ") is a scalar and has no leading axis to split");
      if (a.shape()[0] % parts_ != 0)
        throw ShapeError("Feed sharded over " + over + " (" + std::to_string(parts_) + " devices): the leading size " +
                         std::to_string(a.shape()[0]) + " of leaf " + std::to_string(l) + " (" + a.str() +
                         ") is not divisible by " + std::to_string(parts_));
    }
    piece_ = piece_of_device(mesh, layout_.axes);
  } else {
    piece_.assign(static_cast<std::size_t>(mesh.local_size()), 0);
  }
  if (layout_.by_spec) {
    for (std::size_t l = 0; l < splits_.size(); ++l) index_.push_back(block_index(mesh, splits_[l]));
    for (int slot = 0; slot < 2; ++slot) {
      auto& g = gathered_.emplace_back(static_cast<std::size_t>(mesh.local_size()));
      for (std::size_t i = 0; i < g.size(); ++i) {
        for (std::size_t l = 0; l < splits_.size(); ++l) {
          const bool staged = !contiguous_blocks(splits_[l]) && !mesh.local_devices()[i].is_cpu();
          g[i].push_back(staged ? Array::pinned(splits_[l].block, host_[0][l]->dtype()) : Array());
        }
      }
    }
  }
  const auto& ids = mesh.impl().local_ids();
  for (std::size_t i = 0; i < ids.size(); ++i)
    state_.push_back(std::make_unique<DeviceState>(mesh.local_devices()[i], ids[i]));
}

FeedCore::~FeedCore() {
  // Copies may still be in flight into buffers about to be freed. (Freeing them would wait too: cudaFree
  // and cudaFreeHost synchronize the device in practice, so no test can tell this wait is here. CUDA's
  // documentation promises that only for some frees, so the wait stays.)
  for (auto& s : state_) {
    if (s->device.is_cpu()) continue;
    for (int slot = 0; slot < 2; ++slot) {
      try {
        if (s->pushed[slot]) cuda_event_synchronize(s->copied[slot]);
      } catch (...) {  // destructors never throw; a failed GPU has nothing left to wait for
      }
    }
  }
}

int FeedCore::next_slot() {
  if (pushed_ - popped_ >= 2)
    throw ValueError("Feed::next: two batches are already pushed and not popped; pop() one first");
  const int slot = static_cast<int>(pushed_ % 2);
  for (auto& s : state_)  // the copy out of this slot's host buffers (two pushes ago) must be done
    if (!s->device.is_cpu() && s->pushed[slot]) cuda_event_synchronize(s->copied[slot]);
  slot_taken_ = true;
  return slot;
}

void FeedCore::push() {
  if (!slot_taken_) throw ValueError("Feed::push: call next() and fill the batch first");
  if (pushed_ - popped_ >= 2) throw ValueError("Feed::push: two batches are already pushed and not popped");
  const int slot = static_cast<int>(pushed_ % 2);
  const auto& hosts = host_[static_cast<std::size_t>(slot)];
  for (std::size_t i = 0; i < state_.size(); ++i) {
    DeviceState& s = *state_[i];
    const auto& dsts = device_[static_cast<std::size_t>(slot)][i];
    const auto piece = static_cast<std::size_t>(piece_[i]);
    if (!s.device.is_cpu()) {
      // The device's work queued so far includes every step that read this slot: the copy waits for it.
      const StreamHandle compute = mesh_.impl().stream(s.mesh_index);
      cuda_event_record(s.released, compute);
      cuda_stream_wait_event(s.copy_stream.get(), s.released);
    }
    for (std::size_t l = 0; l < hosts.size(); ++l) {
      Array& dst = *dsts[l];
      const auto* src = static_cast<const char*>(hosts[l]->raw_data()) + piece * dst.nbytes();
      if (layout_.by_spec && dst.nbytes() != 0) {
        const Split& split = splits_[l];
        const std::vector<int>& index = index_[l][i];
        char* whole = static_cast<char*>(hosts[l]->raw_data());
        if (contiguous_blocks(split)) {
          src = whole + (index.empty() ? 0 : static_cast<std::size_t>(index[0])) * dst.nbytes();
        } else {  // gathered run by run: into the CPU device's buffer, or a GPU's pinned one to copy from
          Array& g = s.device.is_cpu() ? dst : gathered_[static_cast<std::size_t>(slot)][i][l];
          copy_block(whole, static_cast<char*>(g.raw_data()), hosts[l]->shape(), split, index,
                     size_of(dst.dtype()), true);
          if (s.device.is_cpu()) continue;
          src = static_cast<const char*>(g.raw_data());
        }
      }
      if (s.device.is_cpu()) {
        if (dst.nbytes() != 0 && dst.raw_data() != src) std::memcpy(dst.raw_data(), src, dst.nbytes());
      } else {
        cuda_copy_async(dst.raw_data(), src, dst.nbytes(), s.copy_stream.get(), s.device.ordinal);
      }
    }
    if (!s.device.is_cpu()) {
      cuda_event_record(s.copied[slot], s.copy_stream.get());
      s.pushed[slot] = true;
    }
  }
  slot_taken_ = false;
  ++pushed_;
}

int FeedCore::pop_slot() {
  if (popped_ >= pushed_) throw ValueError("Feed::pop: no batch was pushed");
  const int slot = static_cast<int>(popped_ % 2);
  for (auto& s : state_)
    if (!s->device.is_cpu()) cuda_stream_wait_event(mesh_.impl().stream(s->mesh_index), s->copied[slot]);
  ++popped_;
  return slot;
}

}  // namespace pmap::detail
