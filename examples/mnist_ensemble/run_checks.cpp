// A run's checks against the machine and against a checkpoint (run_checks.h).
#include "examples/mnist_ensemble/run_checks.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <pmap/detail/hash.h>
#include <pmap/distributed.h>
#include <pmap/error.h>

#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu_backend.h>

namespace pmap::ensemble {

using io::dump_json;
using io::Json;
using io::JsonView;

namespace {

// The mesh's axes: the mode's axis ("ensemble" or "data") by "model" when --mesh was given or weights are
// split (2-D), else the mode's axis over every device (1-D, as before model parallelism); one_axis: always 1-D.
std::vector<AxisSpec> mesh_axes(const TrainConfig& c, int devices, MeshAxes shape) {
  const std::string first = c.mode == Mode::ensemble ? "ensemble" : "data";
  const std::string given = c.mesh_text();
  if (c.mesh_axis > 0 && c.mesh_axis * c.mesh_model != devices)
    throw ValueError("--mesh " + given + " needs " + std::to_string(c.mesh_axis * c.mesh_model) +
                     " devices, the run has " + std::to_string(devices) +
                     " (--devices, per process under mpirun)");
  if (c.mode == Mode::data_parallel && c.mesh_model > 1)
    throw ValueError("--mesh " + given + ": --mode data-parallel keeps the whole model on every device (--mesh " +
                     std::to_string(devices) + "x1); --mode model-parallel splits its weights over 'model'");
  if (shape == MeshAxes::one_axis) {
    if (c.mode == Mode::model_parallel)
      throw ValueError("--mode model-parallel splits weights over 'model', which a one-axis mesh does not");
    if (c.mesh_model > 1)
      throw ValueError("--mesh " + given + " splits weights over 'model', which a one-axis mesh does not");
    return {{first, devices}};
  }
  if (c.mesh_axis > 0 || c.mode == Mode::model_parallel) {
    const int model = c.mesh_axis > 0 ? c.mesh_model : devices;
    return {{first, devices / model}, {"model", model}};
  }
  return {{first, devices}};
}

std::uint64_t fingerprint(const io::Json& config, const Dataset& train, const Dataset& test) {
  const std::string text = io::dump_json(config);
  using pmap::detail::fnv1a;
  std::uint64_t h = fnv1a(text);
  for (const Dataset* d : {&train, &test}) {
    const std::int64_t dims[3] = {d->count, d->rows, d->cols};
    h = fnv1a({reinterpret_cast<const std::uint8_t*>(dims), sizeof(dims)}, h);
    h = fnv1a(d->images, h);
    h = fnv1a(d->labels, h);
  }
  return h;
}

// A float recorded in a configuration, or a per-member list of them.
bool same_floats(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return static_cast<float>(a.get<double>()) == static_cast<float>(b.get<double>());
  if (!a.is_array() || !b.is_array() || a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_floats(a[i], b[i])) return false;
  return true;
}

// Two recorded values of a field agree. Floats are compared as such (checkpoints before the configuration
// was recorded as given hold the float's exact double, 0.10000000149011612).
bool same_setting(std::string_view field, const Json& a, const Json& b) {
  for (const char* f : {"lr", "momentum", "weight_decay", "clip_norm", "epsilon"})
    if (field == f) return same_floats(a, b);
  return a == b;
}

// What a checkpoint written before a field was recorded ran with: MNIST and the Flax CNN (the only data and
// model there were), and before optimizers were parts, SGD with momentum, constant rate, no decay or
// clipping.
const Json* legacy_value(std::string_view field) {
  static const Json values{{"dataset", "mnist"},     {"optimizer", "sgd"},    {"nesterov", false},
                           {"model", "flax-cnn"},
                           {"weight_decay", 0.0},    {"clip_norm", 0.0},      {"lr_schedule", "constant"},
                           {"warmup_steps", 0},      {"dropout", nullptr},    {"validation_split", 0.0},
                           {"early_stopping_patience", 0}};
  const std::string key(field);
  return values.contains(key) ? &values[key] : nullptr;
}

// A record in the form train::Model::architecture() writes. A record of the runner's (releases before the
// Trainer) lists every layer: its ReLU layers become the ", relu" of the module before them and its pooling,
// flattening and gathering layers (ops between modules) are left out, so "Conv_0=Conv2D(32, 3x3)",
// "relu=ReLU", "avg_pool=AveragePooling2D(2)" reads as "Conv_0=Conv2D(32, 3x3, relu)". A record in this
// form already is unchanged.
std::vector<std::string> module_record(const std::vector<std::string>& record) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < record.size(); ++i) {
    const std::string& entry = record[i];
    const std::size_t eq = entry.find('=');
    const std::string what = i == 0 || eq == std::string::npos ? "" : entry.substr(eq + 1);
    if (what == "ReLU" && out.size() > 1) {
      std::string& before = out.back();
      if (before.ends_with(")")) before.insert(before.size() - 1, ", relu");
      else before += "(relu)";
      continue;
    }
    if (what == "Flatten" || what == "GlobalAveragePooling2D" || what.starts_with("AveragePooling2D(") ||
        what.starts_with("MaxPooling2D(") || what.starts_with("GatherFeatures("))
      continue;
    out.push_back(entry);
  }
  return out;
}

std::vector<std::string> record_of(const JsonView& v) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(v[i].as_string());
  return module_record(out);
}

}  // namespace

void check_architecture(const std::filesystem::path& path, const Json& saved_json, const Json& now_json) {
  const std::vector<std::string> saved =
      record_of(JsonView(saved_json, path.string(), "__metadata__.config.architecture"));
  const std::vector<std::string> now = record_of(JsonView(now_json, "this run", "config.architecture"));
  const std::size_t n = std::max(saved.size(), now.size());
  for (std::size_t i = 0; i < n; ++i) {
    const std::string mine = i < now.size() ? now[i] : "nothing";
    const std::string theirs = i < saved.size() ? saved[i] : "nothing";
    if (mine == theirs) continue;
    const std::string what = i == 0 ? "input " : "layer " + std::to_string(i - 1) + " ";
    throw DataError(path.string() + ": the checkpoint's model has " + what + theirs + " where this run's has " +
                    mine + " (resume with the same model)");
  }
}

void check_resumable(const std::filesystem::path& path, const Json& saved, const Json& now) {
  const JsonView s(saved, path.string(), "__metadata__.config");
  std::vector<std::string> fields{"model",      "mode",        "members", "seed",
                                  "batch_size", "train_limit", "dataset", "optimizer"};
  if (saved.contains("architecture")) fields.emplace_back("architecture");  // before it was recorded: the flax CNN
  for (const char* o : {"lr", "momentum", "nesterov", "beta_1", "beta_2", "epsilon", "weight_decay", "clip_norm",
                        "lr_schedule", "warmup_steps", "decay_steps", "dropout", "validation_split",
                        "early_stopping_patience"})
    if (now.contains(o)) fields.emplace_back(o);
  for (const std::string& field : fields) {
    if (field == "architecture") {
      check_architecture(path, s["architecture"].json(), now.at("architecture"));
      continue;
    }
    const Json* a = saved.contains(field) ? &saved[field] : legacy_value(field);
    const Json& b = now.at(field);
    if (a == nullptr) s.fail(std::string("missing field '") + field + "'");
    if (!same_setting(field, *a, b))
      throw DataError(path.string() + ": the checkpoint was written with " + field + " = " + dump_json(*a) +
                      ", this run has " + dump_json(b) +
                      (field == "decay_steps" ? " (a cosine schedule decays over the run's steps after warmup: resume "
                                                "with the same --epochs and --warmup-steps)"
                                              : " (resume with the same setting)"));
  }
}

void check_precision(const TrainConfig& c) {
  if (c.precision == kernels::Precision::fp32) return;
  if (c.backend != DeviceKind::cpu || c.cuda_kernels_on_host) return;
  const std::string flag = std::string("--precision ") + kernels::name(c.precision);
  if (!kernels::bf16::supported())
    throw ValueError(flag + ": this CPU lacks AVX512_BF16 (with AVX512F, BW and VL), which bf16 needs: use fp32");
  if (kernels::cpu::isa() != "avx512")
    throw ValueError(flag + ": bf16 runs in the avx512 CPU kernels, and PMAPCC_CPU_ISA selects " + kernels::cpu::isa() +
                     ": use fp32, or PMAPCC_CPU_ISA=avx512 or auto");
  kernels::bf16::active_path();  // a bad PMAPCC_BF16_PATH is refused here, before anything runs
}

Mesh build_mesh(const TrainConfig& c, MeshAxes shape) {
  if (c.cuda_kernels_on_host && c.backend != DeviceKind::cpu)
    throw ValueError("cuda_kernels_on_host runs the CUDA kernels on the host, for CPU devices: use --backend cpu");
  check_precision(c);
  // Under mpirun/srun (distributed::initialize() called), the mesh spans every process's devices; a --mesh
  // without --devices spreads its devices evenly over the processes.
  const int processes = distributed::process_count();
  int local_n = c.devices > 0 ? c.devices : -1;
  if (c.devices == 0 && c.mesh_axis > 0) {
    const int want = c.mesh_axis * c.mesh_model;
    if (want % processes != 0)
      throw ValueError("--mesh " + c.mesh_text() + ": its " + std::to_string(want) +
                       " devices do not split evenly over the " + std::to_string(processes) +
                       " processes (give --devices per process)");
    local_n = want / processes;
  }
  auto devices = processes > 1 ? distributed::global_devices(c.backend, local_n) : local_devices(c.backend, local_n);
  MeshOptions options;
  options.pin_threads = c.pin_threads;
  auto axes = mesh_axes(c, static_cast<int>(devices.size()), shape);
  return Mesh(std::move(devices), std::move(axes), options);
}

void check_memory(const TrainConfig& c, int devices, std::int64_t params_per_member, int copies) {
  if (c.backend != DeviceKind::cpu) return;
  const double per_device = c.mode == Mode::ensemble ? static_cast<double>(c.members) / devices : 1.0;
  const double local_devices = c.devices > 0 ? c.devices : devices;
  const double need = copies * 4.0 * static_cast<double>(params_per_member) * per_device * local_devices;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (need <= have) return;
  throw ValueError(std::to_string(c.members) + " members (--members; one per device by default): their parameters, "
                   "gradients and optimizer state alone need " +
                   std::to_string(static_cast<long long>(need / 1e9)) + " GB; this machine has " +
                   std::to_string(static_cast<long long>(have / 1e9)) + " GB of memory");
}

void check_processes_agree(const Mesh& mesh, const io::Json& config, const Dataset& train, const Dataset& test) {
  const std::uint64_t mine = fingerprint(config, train, test);
  const auto all = distributed::process_allgather(mesh, std::vector<std::vector<std::int64_t>>(
      static_cast<std::size_t>(mesh.local_size()), std::vector<std::int64_t>{static_cast<std::int64_t>(mine)}));
  std::string differ;
  for (std::size_t d = 0; d < all.size(); ++d)
    if (static_cast<std::uint64_t>(all[d]) != static_cast<std::uint64_t>(all[0]))
      differ += (differ.empty() ? "" : ", ") + std::to_string(mesh.devices()[d].process);
  if (!differ.empty())
    throw ValueError("the processes of this run differ in their flags or data (process " + differ +
                     " against process 0): every process must get the same flags and the same data files; this "
                     "process has " + io::dump_json(config) + " and " + std::to_string(train.count) +
                     " + " + std::to_string(test.count) + " examples");
}

void check_member_subset(const std::vector<int>& subset, int members, const std::filesystem::path& path) {
  for (std::size_t i = 0; i < subset.size(); ++i) {
    if (subset[i] < 0 || subset[i] >= members)
      throw ValueError("--members-subset: member " + std::to_string(subset[i]) + " is not among the checkpoint's " +
                       std::to_string(members) + " members (0.." + std::to_string(members - 1) + ") in " +
                       path.string());
    if (std::find(subset.begin(), subset.begin() + static_cast<std::ptrdiff_t>(i), subset[i]) !=
        subset.begin() + static_cast<std::ptrdiff_t>(i))
      throw ValueError("--members-subset: member " + std::to_string(subset[i]) + " is named twice");
  }
}

}  // namespace pmap::ensemble
