// The training examples' flags and metrics (example_flags.h).
#include "example_flags.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>

#include <CLI/CLI.hpp>

#include <pmap/error.h>
#include <pmapcc/io/safetensors.h>
#include <pmapcc/kernels/cpu_backend.h>

namespace examples {

void parse(Flags& f, int argc, char** argv, const std::string& description) {
  CLI::App app{f.program + ": " + description};
  app.add_option("--data", f.data, "directory of the (Fashion-)MNIST IDX files")->required();
  app.add_option("--train-limit", f.train_limit, "use the first N training examples (-1: all)");
  app.add_option("--test-limit", f.test_limit, "use the first N test examples (-1: all)");
  app.add_option("--epochs", f.epochs, "epochs")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--devices", f.devices, "devices along '" + f.axis + "' (0: every local device)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--members", f.members, "models trained side by side (0: the program's default)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", f.backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--batch", f.batch, "global batch size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  if (f.momentum >= 0)
    app.add_option("--momentum", f.momentum, "SGD momentum")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  app.add_option("--seed", f.seed, "the PRNG seed: the models' keys and the data order")->capture_default_str();
  app.add_option("--cpu-threads", f.cpu_threads,
                 "threads per CPU device for the conv and dense products (the same bits for any count; 0: the "
                 "cores divided by the devices, the default unless PMAPCC_CPU_THREADS is set)")
      ->check(CLI::Range(0, 64));
  app.add_option("--metrics-json", f.metrics_json, "write the per-epoch and final metrics here");
  std::string precision = pmap::kernels::name(f.precision);
  if (f.has_precision)
    app.add_option("--precision", precision, "the products' arithmetic: fp32, or bf16 (operands rounded, fp32 sums)")
        ->check(CLI::IsMember({"fp32", "bf16"}))
        ->capture_default_str();
  if (f.can_save) app.add_option("--save", f.save, "write the trained parameters here (safetensors)");
  try {
    app.parse(argc, argv);
    f.precision = pmap::kernels::parse_precision(precision.c_str(), "--precision");
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help, or the message naming the flag
    std::exit(code == 0 ? 0 : 2);  // (CLI11's own codes differ by error: 105 for a value out of range)
  }
}

void share_cores(const Flags& f, const pmap::Mesh& mesh) {
  if (f.backend == "cpu") pmap::kernels::cpu::share_cores(mesh.local_size(), f.cpu_threads);
}

void Metrics::epoch(const EpochReport& r) {
  std::printf("epoch %d  train_loss %.4f", r.epoch, r.train_loss);
  if (r.train_accuracy >= 0) std::printf("  train_accuracy %.4f", r.train_accuracy);
  std::printf("  ensemble_test_accuracy %.4f  %.0f model-images/s\n", r.ensemble_test_accuracy,
              r.model_images_per_second);
  std::fflush(stdout);
  nlohmann::json e{{"epoch", r.epoch}, {"train_loss", r.train_loss}, {"member_test_accuracy", r.member_test_accuracy},
                   {"ensemble_test_accuracy", r.ensemble_test_accuracy},
                   {"model_images_per_second", r.model_images_per_second}, {"seconds", r.seconds}};
  if (r.train_accuracy >= 0) e["train_accuracy"] = r.train_accuracy;
  epochs_.push_back(std::move(e));
}

void Metrics::finish() const {
  const nlohmann::json last = epochs_.empty() ? nlohmann::json() : epochs_.back();
  if (!epochs_.empty()) {
    for (std::size_t m = 0; m < last["member_test_accuracy"].size(); ++m)
      std::printf("member %zu test accuracy %.4f\n", m, last["member_test_accuracy"][m].get<double>());
    std::printf("ensemble test accuracy %.4f\n", last["ensemble_test_accuracy"].get<double>());
  }
  if (f_.metrics_json.empty()) return;
  nlohmann::json doc{{"program", f_.program},
                           {"config", {{"members", f_.members}, {"devices", f_.devices}, {"epochs", f_.epochs},
                                       {"batch", f_.batch}, {"lr", f_.lr}, {"seed", f_.seed}}},
                           {"epochs", epochs_}, {"final", last}};
  if (f_.momentum >= 0) doc["config"]["momentum"] = f_.momentum;
  if (f_.has_precision) doc["config"]["precision"] = pmap::kernels::name(f_.precision);
  const std::string tmp = f_.metrics_json + ".tmp";
  {
    std::ofstream out(tmp);
    out << doc.dump(2) << "\n";
    if (!out) throw pmap::IoError("--metrics-json: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), f_.metrics_json.c_str()) != 0)
    throw pmap::IoError("--metrics-json: cannot write " + f_.metrics_json);
}

void print_jit(const char* name, const pmap::JitStats& s) {
  std::printf("jit %s: %llu trace(s), %llu replays (%llu left the plan), arenas %.1f MB; the latest call allocated %llu "
              "arrays besides its %llu results\n", name, static_cast<unsigned long long>(s.traces),
              static_cast<unsigned long long>(s.replays), static_cast<unsigned long long>(s.diverged),
              static_cast<double>(s.arena_bytes) / 1e6, static_cast<unsigned long long>(s.last_allocations),
              static_cast<unsigned long long>(s.last_result_allocations));
  if (s.graph_captures > 0 || s.graph_refusals > 0) {
    std::printf("jit %s: %llu graph capture(s), %llu graph launches", name,
                static_cast<unsigned long long>(s.graph_captures), static_cast<unsigned long long>(s.graph_launches));
    if (s.graph_refusals > 0) std::printf("; %llu without a graph: %s", static_cast<unsigned long long>(s.graph_refusals), s.graph_refusal.c_str());
    std::printf("\n");
  }
}

void save_params(const std::string& path, const std::vector<std::string>& names,
                 const std::vector<std::vector<const pmap::Array*>>& leaves) {
  std::vector<pmap::io::TensorEntry> tensors;
  for (std::size_t k = 0; k < names.size(); ++k) {
    std::vector<const pmap::Array*> parts;
    for (const auto& device : leaves) parts.push_back(device.at(k));
    const pmap::Array all = pmap::concatenate(parts, pmap::Device{});  // members of every device, in order
    const std::vector<float> values = all.to_vector<float>();
    tensors.push_back(pmap::io::make_tensor("params/" + names[k], all.shape(), std::span<const float>(values)));
  }
  pmap::io::save_safetensors(path, tensors, {});
}

}  // namespace examples
