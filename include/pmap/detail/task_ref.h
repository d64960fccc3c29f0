// TaskRef: a non-owning reference to a callable taking a local device index, the task pmap hands to every
// worker. Unlike std::function it never allocates; the callable must outlive the call it is passed to.
#pragma once

namespace pmap::detail {

class TaskRef {
 public:
  template <class F>
  TaskRef(const F& f)  // NOLINT: implicit, like std::function
      : object_(&f), call_([](const void* o, int i) { (*static_cast<const F*>(o))(i); }) {}
  void operator()(int i) const { call_(object_, i); }

 private:
  const void* object_;
  void (*call_)(const void*, int);
};

}  // namespace pmap::detail
