// ONNX export of trained members: one member's network, or the whole ensemble as one graph (each member's
// network, Softmax, the Mean of the members' probabilities and its ArgMax), opset 17, the weights as
// initializers, BatchNormalization in inference form (the moving statistics) and Dropout left out. A
// server loads the file in ONNX Runtime (or any ONNX runtime) and gets what pmapcc's evaluation computes.
//
// The graph takes "images" (N, *model input shape) f32, channels last, as the model does (MNIST: (N, 28,
// 28, 1), pixels scaled to [0, 1], value / 255, as the program's data loader scales them); it transposes to
// ONNX's channels-first layout for the convolutions and back before a Flatten, so a Flatten flattens in the
// model's (H, W, C) order. Built with the ONNX protobuf classes (libonnx), which only this component
// needs; written atomically (a temp file renamed over the path, as checkpoints are).
#pragma once

#include <filesystem>
#include <map>
#include <span>
#include <string>

#include <pmapcc/ensemble/model.h>

namespace pmap::ensemble::onnx {

// The variables of `members` trained members of `model`, stacked as checkpoints hold them
// (Trainer::params() and Trainer::model_state(): ensemble/member_layout.h).
struct TrainedMembers {
  const Sequential& model;
  std::span<const float> params;  // members * model.params_per_member()
  std::span<const float> state;   // members * model.state_per_member()
  int members = 1;
};

// What the file records besides the network: metadata_props (e.g. the model, recipe, seed, dataset, and the
// test accuracy and NLL at export) and the graph's doc string.
struct ExportInfo {
  std::map<std::string, std::string> metadata;
  std::string doc;
};

// The ensemble of all t.members members: outputs "probabilities" (N, K) f32, the mean of the members'
// softmax probabilities, and "class" (N) i64, its argmax (the first index on ties, as pmapcc).
void export_ensemble(const TrainedMembers& t, const std::filesystem::path& path, const ExportInfo& info = {});

// Member `member` alone: outputs "logits" (N, K) f32 and "probabilities" (N, K) f32, their softmax.
void export_member(const TrainedMembers& t, int member, const std::filesystem::path& path,
                   const ExportInfo& info = {});

// Throws ValueError naming the first layer of `model` that has no ONNX form (a model-parallel device's
// GatherFeatures; a layer kind the exporter does not know), or whose output is not flat class scores.
void check_exportable(const Sequential& model);

}  // namespace pmap::ensemble::onnx
