// TrainConfig's checks and JSON, and the modes' names.
#include <pmapcc/ensemble/config.h>

#include <charconv>

#include <pmap/error.h>

namespace pmap::ensemble {

std::string TrainConfig::mesh_text() const { return std::to_string(mesh_axis) + "x" + std::to_string(mesh_model); }

std::string_view to_string(Mode m) {
  return m == Mode::ensemble ? "ensemble" : m == Mode::data_parallel ? "data-parallel" : "model-parallel";
}

Mode parse_mode(std::string_view text) {
  for (Mode m : {Mode::ensemble, Mode::data_parallel, Mode::model_parallel})
    if (text == to_string(m)) return m;
  throw ValueError("--mode must be ensemble, data-parallel or model-parallel, got '" + std::string(text) + "'");
}

namespace {

// The float as the decimal it was most likely written as: the shortest one that reads back to it.
double as_given(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  double d = 0;
  std::from_chars(buf, r.ptr, d);
  return d;
}

// One value for every member as a number, a per-member list as an array.
io::Json as_given(const std::vector<float>& v) {
  if (v.size() == 1) return as_given(v[0]);
  io::Json a = io::Json::array();
  for (float x : v) a.push_back(as_given(x));
  return a;
}

// The optimizer's fields, those it uses only: the flags' names with '_' for '-'.
void optimizer_json(const OptimizerConfig& o, int members, io::Json& j) {
  j["optimizer"] = o.name;
  j["lr"] = as_given(o.learning_rates(members));
  if (o.name == "sgd") {
    j["momentum"] = as_given(o.momentum);
    j["nesterov"] = o.nesterov;
  } else {
    j["beta_1"] = o.beta_1;
    j["beta_2"] = o.beta_2;
    j["epsilon"] = as_given(o.epsilon);
  }
  j["weight_decay"] = as_given(o.weight_decays(members));
  j["clip_norm"] = as_given(o.clip_norm);
  j["lr_schedule"] = o.schedule.str();
  j["warmup_steps"] = o.schedule.warmup_steps;
  if (o.schedule.kind == kernels::ScheduleKind::cosine) j["decay_steps"] = o.schedule.decay_steps;
}

}  // namespace

io::Json TrainConfig::to_json() const {
  io::Json j = io::Json::object();
  j["backend"] = pmap::to_string(backend);
  j["devices"] = devices;
  j["members"] = members;
  j["mode"] = ensemble::to_string(mode);
  j["model"] = model;
  if (!architecture.empty()) j["architecture"] = architecture;
  j["mesh"] = mesh_text();
  if (splits_weights()) {
    io::Json entries = io::Json::array();
    for (const LayoutMap::Entry& e : layout.entries())
      entries.push_back({{"pattern", e.pattern}, {"spec", e.spec.str()}});
    j["layout"] = std::move(entries);
  }
  j["epochs"] = epochs;
  j["batch_size"] = batch_size;
  optimizer_json(optimizer, members, j);
  j["dropout"] = dropout.empty() ? io::Json(nullptr) : as_given(dropout);  // null: the model's own rates
  j["seed"] = static_cast<std::int64_t>(seed);
  j["validation_split"] = validation_split;
  j["early_stopping_patience"] = patience;
  j["train_limit"] = train_limit;
  j["test_limit"] = test_limit;
  j["eval_batch"] = eval_batch;
  j["pin_threads"] = pin_threads;
  j["member_group"] = member_group;
  j["report_every"] = report_every;
  j["kernels"] = cuda_kernels_on_host ? "cuda-on-host" : "native";
  j["graphs"] = graphs;
  j["precision"] = kernels::name(precision);
  j["processes"] = processes;
  j["dataset"] = dataset;
  return j;
}

// `devices`: along the mode's axis (the mesh's first), which the members or the batch are split over.
void TrainConfig::check(int along, const Dataset& train, const Dataset& test) const {
  const TrainConfig& c = *this;
  auto bad = [](const std::string& m) { throw ValueError(m); };
  if (c.epochs < 0) bad("--epochs must be >= 0, got " + std::to_string(c.epochs));
  if (c.batch_size < 1) bad("--batch-size must be >= 1, got " + std::to_string(c.batch_size));
  c.optimizer.check(c.members);
  if (c.dropout.size() > 1 && c.dropout.size() != static_cast<std::size_t>(c.members))
    bad("--dropout gives " + std::to_string(c.dropout.size()) + " values for " + std::to_string(c.members) +
        " member(s): give one value, or one per member");
  for (float r : c.dropout)
    if (!(r >= 0 && r < 1)) bad("--dropout must be in [0, 1), got " + io::dump_json(as_given(r)));
  if (c.eval_batch < 1) bad("eval batch must be >= 1");
  if (!(c.validation_split >= 0 && c.validation_split < 1))
    bad("--validation-split must be in [0, 1), got " + io::dump_json(c.validation_split));
  if (c.patience < 0) bad("--early-stopping-patience must be >= 0 (0: off), got " + std::to_string(c.patience));
  if (c.patience > 0 && c.validation_split == 0)
    bad("--early-stopping-patience " + std::to_string(c.patience) +
        " watches the validation NLL: give --validation-split too");
  if (c.report_every < 0) bad("report_every must be >= 0 (0: automatic), got " + std::to_string(c.report_every));
  const std::string over = c.splits_weights()
                               ? "the " + std::to_string(along) + " devices of --mesh's first axis"
                               : "--devices " + std::to_string(along);
  if (c.mode == Mode::ensemble && c.members % along != 0)
    bad("--members " + std::to_string(c.members) + " is not a multiple of " + over +
        ": every device runs the same number of members");
  if (c.mode != Mode::ensemble && c.members != 1)
    bad("--mode " + std::string(to_string(c.mode)) + " trains one model over the devices: --members must be 1, got " +
        std::to_string(c.members));
  // Data parallel splits a batch of any size (train::Trainer pads the blocks); split weights need equal blocks (the
  // collectives over "model" take one shape on every device).
  if (c.splits_weights() && c.mode != Mode::ensemble && c.batch_size % along != 0)
    bad("--batch-size " + std::to_string(c.batch_size) + " does not split evenly over " + over +
        ": model parallelism needs equal blocks");
  if (c.mode != Mode::ensemble && c.batch_size < along)
    bad("--batch-size " + std::to_string(c.batch_size) + " is smaller than " + over +
        ": data parallel gives every device at least one example");
  if (c.epochs > 0 && train.count < c.batch_size)
    bad("--batch-size " + std::to_string(c.batch_size) + " is larger than the " + std::to_string(train.count) +
        " training examples (see --train-limit" + (c.validation_split > 0 ? " and --validation-split)" : ")"));
  if (test.count < 1) bad("the test set is empty");
  if (train.rows != test.rows || train.cols != test.cols)
    bad("the training images are " + std::to_string(train.rows) + "x" + std::to_string(train.cols) +
        ", the test images " + std::to_string(test.rows) + "x" + std::to_string(test.cols) +
        ": --data must hold the two splits of one dataset");
}

}  // namespace pmap::ensemble
