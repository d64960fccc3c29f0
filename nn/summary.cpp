// nn/summary.h: the thread's innermost ModuleRecorder, and the record a module leaves in it.
#include <pmapcc/nn/summary.h>

#include <cassert>
#include <utility>

namespace pmap::nn {
namespace {

thread_local ModuleRecorder* innermost = nullptr;

}  // namespace

ModuleRecorder::ModuleRecorder() : outer_(innermost) { innermost = this; }

ModuleRecorder::~ModuleRecorder() {
  assert(innermost == this && "nn::ModuleRecorder: destroyed out of order or on another thread");
  innermost = outer_;
}

bool recording_modules() { return innermost != nullptr; }

void record_module_call(std::string kind, std::string settings, std::vector<const Array*> tensors,
                        const Array& output) {
  if (innermost == nullptr) return;
  ModuleCall call{kind, settings.empty() ? kind : kind + "(" + settings + ")", {}, output.shape()};
  for (const Array* t : tensors)
    if (t != nullptr && t->valid() && t->size() > 0 && (pmap::detail::trace_tag(*t) & pmap::detail::kBatchedTag) == 0)
      call.tensors.push_back(t->raw_data());
  innermost->calls_.push_back(std::move(call));
}

}  // namespace pmap::nn
