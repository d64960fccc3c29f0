// BatchLevel: the record of one vmap call on one thread (pmapcc/core/vmap.h drives it; users call vmap).
// It holds each value of the call stacked over the members, (members, shape), and hands the function views
// that stand for one member's value: the member's shape, a tag (pmap/array.h's kBatchedTag), no storage of
// their own. core::apply turns an op on such views into the primitive's batching rule on the stacked
// values. The helpers below are what batching rules are written with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pmap/array.h>

#include <pmapcc/core/primitive.h>

namespace pmap::core {

class BatchLevel {
 public:
  // Begins vmap of `function` over `members` (>= 1) on the calling thread. vmap inside vmap raises
  // NotAvailable.
  BatchLevel(std::string function, std::int64_t members);
  ~BatchLevel();
  BatchLevel(const BatchLevel&) = delete;
  BatchLevel& operator=(const BatchLevel&) = delete;

  static BatchLevel* active();  // the calling thread's, or null
  const std::string& function() const { return function_; }
  std::int64_t members() const { return members_; }

  // Keeps `stacked` ((members, ...); it may be a value grad traces) and returns the view of one member.
  Array wrap(Array stacked);
  // Whether x is one of this call's views: false for an untagged array or a value grad traces; ValueError
  // for a view of a vmap call that has returned (`op` and `operand` name the call in the message).
  bool holds(const Array& x, const std::string& op, std::size_t operand) const;
  // The stacked value behind one of this call's views.
  const Array& stacked(const Array& view) const;
  // The stacked value behind a view, as the function's result: moved out when it is this call's own and
  // untraced (a later take of it copies), else a copy (an argument's storage; a copy of a value grad traces
  // stays traced). The result must outlive this level's later takes.
  Array take(const Array& view);

 private:
  std::size_t slot_of(const Array& x) const;

  std::string function_;
  std::int64_t members_;
  std::uint64_t serial_;
  std::vector<Array> values_;
};

// The primitive a call of p on `batched` inputs over `members` members is: its evaluation is p's batching
// rule, its VJP p's batch_vjp (what grad records for an op inside vmap).
std::shared_ptr<const Primitive> batched_primitive(std::shared_ptr<const Primitive> p, std::vector<bool> batched,
                                                   std::int64_t members);

// The view of a value that no transformation follows, as the batching rules compute on (shares storage);
// view_as: the same elements seen in another shape of the same count.
Array plain_view(const Array& x);
Array view_as(const Array& x, Shape shape);
// Member m's part of a stacked array (members, ...), as a view of its storage.
Array member_view(const Array& stacked, std::int64_t m);
// Arrays of the same shape stacked along a new leading axis, on their device.
Array stack(const std::vector<Array>& parts);
// The same, taking the parts: a single part that owns its storage becomes the result without a copy.
Array stack(std::vector<Array>&& parts);
// x repeated for each member: (members, x's shape).
Array broadcast_members(const Array& x, std::int64_t members);
// A stacked array with its two leading axes merged ((members, N, ...) -> (members * N, ...)), and back.
Array merge_members(const Array& stacked);
Array split_members(Array merged, std::int64_t members);

// The rules of a primitive of one (N, H, W, C) input whose output rows are its images' (pooling): the
// members' images are more images, (members * N, H, W, C), in one call; member by member when the input is
// not 4-d for a member (the op's own error).
std::vector<Array> batch_images(const Primitive& p, Arrays in, const std::vector<bool>& batched, std::int64_t members);
std::vector<Array> batch_images_vjp(const Primitive& p, Arrays in, Arrays out, Arrays cts,
                                    const std::vector<bool>& wanted, const std::vector<bool>& batched,
                                    std::int64_t members);

}  // namespace pmap::core
