// The seam between the runtime and pmapcc's transformations (grad, in pmapcc/core): an Array being traced
// by a transformation carries a tag, and the runtime's differentiable operations (the collectives) hand a
// tagged operand to the transformation that registered itself here instead of computing on it directly.
// The runtime knows nothing else of tracing; with no transformation linked in, no Array is ever tagged.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/mesh.h>
#include <pmap/partition.h>

namespace pmap::detail {

// The collectives a transformation may see; their evaluation and their transposes are the core's.
enum class TracedCollectiveKind : std::uint8_t {
  psum, pmean, pmax, pmin, all_gather, psum_scatter, ppermute, all_to_all
};

struct TracedCollective {
  TracedCollectiveKind kind = TracedCollectiveKind::psum;
  AxisNames axes;
  int axis = 0;        // all_gather: where the gathered axis goes; all_to_all: its concat_axis
  bool tiled = false;  // all_gather, psum_scatter, all_to_all
  std::vector<std::pair<int, int>> perm;  // ppermute
  int split_axis = 0;  // all_to_all
};

// Called with a collective whose operand carries a trace tag; returns the (tagged) result. Set once by the
// core when it is first used; null until then.
using TracedCollectiveHandler = Array (*)(const TracedCollective& call, const Array& x);
void set_traced_collective_handler(TracedCollectiveHandler handler) noexcept;
TracedCollectiveHandler traced_collective_handler() noexcept;

// shard_map called on values grad traces (grad of a function that calls shard_map), type-erased over its
// Array leaves: the core evaluates it, records it, and transposes it with a second shard_map.
struct TracedShardMap {
  const Mesh* mesh = nullptr;
  std::vector<P> in_specs;  // one per input leaf, in order
  // One device's output leaves from its input blocks, in order (the function's Array leaves).
  std::function<std::vector<Array>(const std::vector<Array>&)> body;
  // Once the body has run: each output leaf's out spec.
  std::function<std::vector<P>()> out_specs;
  bool check = true;  // ShardMapOptions::check
};
// Returns the (tagged) output leaves, assembled whole in host memory. Set once by the core when it is first
// used; null until then.
using TracedShardMapHandler = std::vector<Array> (*)(const TracedShardMap& call,
                                                     const std::vector<const Array*>& leaves);
void set_traced_shard_map_handler(TracedShardMapHandler handler) noexcept;
TracedShardMapHandler traced_shard_map_handler() noexcept;

}  // namespace pmap::detail
