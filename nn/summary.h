// What a model summary sees of nn/'s modules (Keras's model.summary(), Flax's tabulate): while a
// ModuleRecorder lives on a thread, each module called on that thread appends one ModuleCall (what it is,
// the tensors it read, its output's shape). train::Model::summary runs a model once under one; every other
// call of a module costs one thread-local read.
#pragma once

#include <string>
#include <vector>

#include <pmap/array.h>

namespace pmap::nn {

struct ModuleCall {
  std::string kind;                  // "Conv2D", "Dense", "BatchNormalization", "Dropout"
  std::string description;           // the kind with its settings: "Conv2D(24, 6x6, stride 2, valid, no bias)"
  std::vector<const void*> tensors;  // the storage of the parameters and state it read, in its order
  Shape output;                      // its output's shape
};

// Records the module calls of this thread from construction to destruction. Recorders nest: the innermost
// one records, and the outer one again after it is gone; each is destroyed on its thread, innermost first
// (a local variable is). Not copyable or movable.
class ModuleRecorder {
 public:
  ModuleRecorder();
  ~ModuleRecorder();
  ModuleRecorder(const ModuleRecorder&) = delete;
  ModuleRecorder& operator=(const ModuleRecorder&) = delete;

  const std::vector<ModuleCall>& calls() const { return calls_; }

 private:
  friend void record_module_call(std::string kind, std::string settings, std::vector<const Array*> tensors,
                                 const Array& output);
  std::vector<ModuleCall> calls_;
  ModuleRecorder* outer_ = nullptr;
};

// Whether a recorder is alive on this thread (a module describes itself only then).
bool recording_modules();
// For modules (a user's own too): one call, when a recorder is alive on this thread; nothing otherwise.
// `settings` go in the description's parentheses ("" for none); `tensors` are the parameters and state read
// (null or storage-less entries, such as an absent bias or a value inside vmap, are skipped).
void record_module_call(std::string kind, std::string settings, std::vector<const Array*> tensors,
                        const Array& output);

}  // namespace pmap::nn
