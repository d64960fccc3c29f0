// ONNX export from the traced program: a network's inference function is recorded as a core::Program
// (pmapcc/core/program.h) and each primitive becomes ONNX nodes (opset 17) by its own emitter, so any model
// written with pmap::ops exports (a residual network as well as the program's CNNs), with its variables as
// initializers. A member exports alone (its logits and their softmax) or the members as one ensemble graph
// (each member's softmax, their Mean and its ArgMax), what pmapcc's evaluation computes; a server loads the
// file in ONNX Runtime. Built with the ONNX protobuf classes (libonnx), which only this library needs;
// written atomically (a temp file renamed over the path, as checkpoints are).
//
//   onnx::Network net = onnx::network_of(trainer.model());
//   onnx::export_ensemble(net, onnx::members_of(trainer.model(), trainer.params(), trainer.model_state()), path);
//
// - The graph takes "images" (N, *Network::input) f32 for any N, as the function does (MNIST's trained
//   models: (N, 28, 28, 1), channels last, pixel / 255). How each value depends on N is found by recording
//   the function at two batch sizes, which must give one program but for those sizes (the same primitives,
//   operands, attributes and constants); a primitive that would fix N in the graph (a reshape that splits the
//   examples over several axes, a broadcast to the batch's size, a slice of part of the examples, an image
//   op on images whose height, width or channels follow N) is refused. A reshape that merges the examples'
//   axis with others is emitted with -1 there.
// - Images stay channels last as in the function: each convolution or pooling transposes to ONNX's channels
//   first and back, and transposes that undo each other are left out, so a chain of them runs channels first.
// - Products run in f32 (a bf16 precision scope's results differ from the file's by bf16 rounding).
// - What has no ONNX form raises NotAvailable naming the primitive and the member: training-mode BatchNorm
//   and dropout (export the inference function), collectives (export one device's function), vmap, the loss.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <pmap/array.h>

#include <pmapcc/train/model.h>
#include <pmapcc/train/variables.h>

namespace pmap::onnx {

// The logits (N, classes) f32 of `images` (N, input...) under one member's `variables`: an inference function
// of pmap::ops (a model's apply with Call{.train = false}).
using LogitsFunction = std::function<Array(const train::Variables& variables, const Array& images)>;

struct Network {
  std::string name;  // the graph's name ("keras-convnet"); the ensemble's is "<name>-ensemble-of-<M>"
  Shape input;       // one example's shape: (28, 28, 1)
  LogitsFunction logits;
};

// What the file records besides the network: metadata_props (e.g. the model, recipe, seed, dataset, and the
// test accuracy and NLL at export) and the graph's doc string.
struct ExportInfo {
  std::map<std::string, std::string> metadata;
  std::string doc;
};

// The ensemble of `members` (each member's variables, f32 tensors on the host or a CPU device): outputs
// "probabilities" (N, K) f32, the mean of the members' softmax probabilities, and "class" (N) i64, its argmax
// (the first index on ties, as pmapcc). The members' initializers are named "member_<m>/<variable>".
void export_ensemble(const Network& network, const std::vector<train::Variables>& members,
                     const std::filesystem::path& path, const ExportInfo& info = {});

// One member alone: outputs "logits" (N, K) f32 and "probabilities" (N, K) f32, their softmax.
void export_member(const Network& network, const train::Variables& member, const std::filesystem::path& path,
                   const ExportInfo& info = {});

// Records `network` on `member` and converts it without writing a file: NotAvailable for what has no ONNX form,
// ValueError for variables that are not f32 or logits that are not (N, K). What a program checks before a
// long run, so an export cannot fail after it.
void check_exportable(const Network& network, const train::Variables& member);

// A train::Model as a Network (its apply in inference; the Network holds a copy of the model), and the members
// of stacked tensors (members, ...) as Trainer::params() and Trainer::model_state() give them: member m's
// variables are "params/<name>" and "state/<name>", row m of each. ValueError naming a tensor whose rows are
// not the members.
Network network_of(const train::Model& model);
std::vector<train::Variables> members_of(const train::Model& model, const train::Variables& params,
                                         const train::Variables& state);

}  // namespace pmap::onnx
