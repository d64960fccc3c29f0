// shard_padded / unshard_padded (padded.h): pieces of a leading axis of any size.
#include <pmap/padded.h>

#include "mesh_impl.h"

namespace pmap::detail {

PaddedSplit padded_split(const std::vector<std::pair<std::string, const Array*>>& leaves,
                         const std::vector<std::string>& scalar_paths, const Mesh& mesh, const AxisNames& axes) {
  PaddedSplit s;
  s.rows = check_shardable(leaves, scalar_paths, 1, "", "shard_padded");  // one part: all but divisibility
  const int parts = mesh.axis_size(axes);
  s.block = (s.rows + parts - 1) / parts;
  s.piece = piece_of_device(mesh, axes);
  for (int piece : s.piece) {
    const std::int64_t begin = std::min(s.rows, piece * s.block);
    s.begin.push_back(begin);
    s.count.push_back(std::min(s.block, s.rows - begin));
  }
  return s;
}

Array padded_rows(const Array& host, std::int64_t begin, std::int64_t count, std::int64_t block, const Device& device) {
  Shape shape = host.shape();
  const std::size_t row_bytes = shape[0] == 0 ? 0 : host.nbytes() / static_cast<std::size_t>(shape[0]);
  shape[0] = block;
  Array out(shape, host.dtype(), Device{});  // zeros
  if (count > 0)
    std::memcpy(out.raw_data(), static_cast<const char*>(host.raw_data()) + static_cast<std::size_t>(begin) * row_bytes,
                static_cast<std::size_t>(count) * row_bytes);
  return device == Device{} ? std::move(out) : out.to(device);
}

Array row_mask(std::int64_t count, std::int64_t block, const Device& device) {
  std::vector<float> mask(static_cast<std::size_t>(block), 0.0f);
  std::fill(mask.begin(), mask.begin() + count, 1.0f);
  return Array::from_host(mask, {block}, device);
}

void check_padded_result(std::size_t entries, const std::vector<std::int64_t>& like_pieces, const Mesh& mesh,
                         const AxisNames& axes) {
  const auto local = static_cast<std::size_t>(mesh.local_size());
  if (entries != local || like_pieces.size() != local)
    throw ShapeError("unshard_padded: the results have " + std::to_string(entries) + " entries and the padded " +
                     "argument " + std::to_string(like_pieces.size()) + ", but the mesh has " + std::to_string(local) +
                     " local devices");
  const std::vector<int> piece = piece_of_device(mesh, axes);
  for (std::size_t d = 0; d < local; ++d)
    if (like_pieces[d] != piece[d])
      throw ValueError("unshard_padded: local device " + std::to_string(d) + " holds piece " +
                       std::to_string(like_pieces[d]) + " of the padded argument, but piece " +
                       std::to_string(piece[d]) + " when split over " +
                       (axes.empty() ? std::string("all axes") : axes.str()) +
                       ": give the axes (and mesh) shard_padded split it over");
}

void check_padded_leaves(const std::vector<std::string>& paths, const std::vector<std::size_t>& counts) {
  for (std::size_t d = 0; d < counts.size(); ++d)
    if (counts[d] != paths.size())
      throw ShapeError("unshard_padded: local device " + std::to_string(d) + "'s result has " +
                       std::to_string(counts[d]) + " arrays, the first device's " + std::to_string(paths.size()));
}

}  // namespace pmap::detail
