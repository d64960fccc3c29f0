// The optimizer registry, schedules as text, the configuration's checks, and optimizer_step: the learning
// rate of the step, clipping, then each tensor's update, all on the device.
#include <pmapcc/ensemble/optimizer.h>

#include <array>
#include <charconv>
#include <cmath>
#include <functional>

#include <pmap/collectives.h>
#include <pmap/error.h>

namespace pmap::ensemble {
namespace {

using Factory = std::unique_ptr<Optimizer> (*)(const OptimizerConfig&);

// The registry: one line per optimizer.
const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> r{
      {"sgd", make_sgd}, {"adam", make_adam}, {"adamw", make_adam}};
  return r;
}

[[noreturn]] void bad_schedule(std::string_view text, const std::string& why) {
  throw ValueError("--lr-schedule '" + std::string(text) + "': " + why +
                   " (constant | cosine[:ALPHA] | exponential:RATE:STEPS | piecewise:STEP=FACTOR,...)");
}

template <class T>
T number(std::string_view text, std::string_view part, const char* what) {
  T v{};
  const auto r = std::from_chars(part.data(), part.data() + part.size(), v);
  if (part.empty() || r.ec != std::errc() || r.ptr != part.data() + part.size())
    bad_schedule(text, std::string(what) + " '" + std::string(part) + "' is not a number");
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) bad_schedule(text, std::string(what) + " must be finite");
  return v;
}

std::vector<std::string_view> split_on(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t start = 0;;) {
    const std::size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

// The shortest decimal that reads back to v (0.1, not 0.10000000149011612).
template <class T>
std::string shortest(T v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

Schedule parse_schedule(std::string_view text) {
  const auto parts = split_on(text, ':');
  const std::string_view kind = parts[0];
  Schedule s;
  if (kind == "constant") {
    if (parts.size() != 1) bad_schedule(text, "constant takes no arguments");
  } else if (kind == "cosine") {
    s.kind = kernels::ScheduleKind::cosine;
    if (parts.size() > 2) bad_schedule(text, "cosine takes one argument, the final factor");
    if (parts.size() == 2) s.alpha = number<double>(text, parts[1], "the final factor");
    if (!(s.alpha >= 0 && s.alpha <= 1)) bad_schedule(text, "the final factor must be in [0, 1]");
  } else if (kind == "exponential") {
    s.kind = kernels::ScheduleKind::exponential;
    if (parts.size() != 3) bad_schedule(text, "exponential takes a rate and a number of steps");
    s.decay_rate = number<double>(text, parts[1], "the rate");
    s.decay_steps = number<std::int64_t>(text, parts[2], "the steps");
    if (!(s.decay_rate > 0)) bad_schedule(text, "the rate must be > 0");
    if (s.decay_steps < 1) bad_schedule(text, "the steps must be >= 1, got " + std::to_string(s.decay_steps));
  } else if (kind == "piecewise") {
    s.kind = kernels::ScheduleKind::piecewise;
    if (parts.size() != 2 || parts[1].empty()) bad_schedule(text, "piecewise takes STEP=FACTOR,... ");
    for (std::string_view piece : split_on(parts[1], ',')) {
      const auto kv = split_on(piece, '=');
      if (kv.size() != 2) bad_schedule(text, "'" + std::string(piece) + "' is not STEP=FACTOR");
      const auto step = number<std::int64_t>(text, kv[0], "the step");
      const auto factor = number<double>(text, kv[1], "the factor");
      if (step < 0 || (!s.pieces.empty() && step <= s.pieces.back().first))
        bad_schedule(text, "the steps must be >= 0 and increasing");
      if (factor < 0) bad_schedule(text, "the factors must be >= 0");
      s.pieces.emplace_back(step, factor);
    }
    if (s.pieces.size() > static_cast<std::size_t>(kernels::kMaxScheduleBoundaries))
      bad_schedule(text, "at most " + std::to_string(kernels::kMaxScheduleBoundaries) + " pieces");
  } else {
    bad_schedule(text, "unknown schedule '" + std::string(kind) + "'");
  }
  return s;
}

std::string Schedule::str() const {
  switch (kind) {
    case kernels::ScheduleKind::constant:
      return "constant";
    case kernels::ScheduleKind::cosine:
      return alpha == 0 ? "cosine" : "cosine:" + shortest(alpha);
    case kernels::ScheduleKind::exponential:
      return "exponential:" + shortest(decay_rate) + ":" + std::to_string(decay_steps);
    case kernels::ScheduleKind::piecewise: {
      std::string out = "piecewise:";
      for (std::size_t i = 0; i < pieces.size(); ++i)
        out += (i ? "," : "") + std::to_string(pieces[i].first) + "=" + shortest(pieces[i].second);
      return out;
    }
  }
  return "constant";
}

kernels::ScheduleParams Schedule::params() const {
  kernels::ScheduleParams p;
  p.kind = kind;
  p.warmup_steps = warmup_steps;
  p.decay_steps = kind == kernels::ScheduleKind::constant || kind == kernels::ScheduleKind::piecewise ? 1 : decay_steps;
  p.decay_rate = decay_rate;
  p.alpha = alpha;
  p.boundaries_count = static_cast<int>(pieces.size());
  for (std::size_t i = 0; i < pieces.size() && i < static_cast<std::size_t>(kernels::kMaxScheduleBoundaries); ++i) {
    p.boundaries[i] = pieces[i].first;
    p.values[i] = pieces[i].second;
  }
  if (warmup_steps < 0) throw ValueError("--warmup-steps must be >= 0, got " + std::to_string(warmup_steps));
  if (p.decay_steps < 1)
    throw ValueError("--lr-schedule " + str() + ": decays over " + std::to_string(p.decay_steps) +
                     " steps; it needs at least 1 (the run's steps after --warmup-steps)");
  kernels::validate(p);
  return p;
}

std::string OptimizerConfig::str() const {
  auto list = [](const std::vector<float>& v) {
    std::string out;
    for (float x : v) out += (out.empty() ? "" : ",") + shortest(x);
    return out;
  };
  std::string out = name + " lr " + list(learning_rates(static_cast<int>(learning_rate.size())));
  if (name == "sgd") out += ", momentum " + shortest(momentum) + (nesterov ? " (Nesterov)" : "");
  if (weight_decay_of(0) != 0 || weight_decay.size() > 1)
    out += ", weight decay " + list(weight_decays(static_cast<int>(weight_decay.size())));
  if (clip_norm > 0) out += ", clip norm " + shortest(clip_norm);
  if (schedule.kind != kernels::ScheduleKind::constant || schedule.warmup_steps > 0)
    out += ", " + schedule.str() +
           (schedule.warmup_steps > 0 ? " after " + std::to_string(schedule.warmup_steps) + " warmup steps" : "");
  return out;
}

namespace {

// Member m's value of a flag's list: the default when empty, the one value, or the member's own.
float value_of(const std::vector<float>& v, float fallback, int member, const char* flag) {
  if (v.empty()) return fallback;
  if (v.size() == 1) return v[0];
  if (member < 0 || static_cast<std::size_t>(member) >= v.size())
    throw ValueError(std::string(flag) + " gives " + std::to_string(v.size()) + " values: none for member " +
                     std::to_string(member) + " (give one value, or one per member)");
  return v[static_cast<std::size_t>(member)];
}

std::vector<float> values(const std::vector<float>& v, int members, const std::function<float(int)>& of) {
  std::vector<float> out;
  for (int m = 0; m < (v.size() > 1 ? members : 1); ++m) out.push_back(of(m));
  return out;
}

}  // namespace

float OptimizerConfig::learning_rate_of(int member) const {
  return value_of(learning_rate, name == "sgd" ? 0.1f : 0.001f, member, "--lr");
}

float OptimizerConfig::weight_decay_of(int member) const {
  return value_of(weight_decay, name == "adamw" ? 0.004f : 0.0f, member, "--weight-decay");
}

std::vector<float> OptimizerConfig::learning_rates(int members) const {
  return values(learning_rate, members, [this](int m) { return learning_rate_of(m); });
}

std::vector<float> OptimizerConfig::weight_decays(int members) const {
  return values(weight_decay, members, [this](int m) { return weight_decay_of(m); });
}

void OptimizerConfig::check(int members) const {
  auto bad = [](const std::string& m) { throw ValueError(m); };
  bool known = false;
  for (const auto& [n, f] : registry()) known = known || n == name;
  if (!known) {
    std::string names;
    for (const auto& [n, f] : registry()) names += (names.empty() ? "" : ", ") + n;
    bad("--optimizer must be one of " + names + ", got '" + name + "'");
  }
  auto per_member = [&](const char* flag, const std::vector<float>& v) {
    if (v.size() > 1 && v.size() != static_cast<std::size_t>(members))
      bad(std::string(flag) + " gives " + std::to_string(v.size()) + " values for " + std::to_string(members) +
          " member(s): give one value, or one per member");
  };
  per_member("--lr", learning_rate);
  per_member("--weight-decay", weight_decay);
  for (float lr : learning_rate)
    if (!(lr > 0) || !std::isfinite(lr)) bad("--lr must be a positive number, got " + shortest(lr));
  for (float wd : weight_decay)
    if (!(wd >= 0) || !std::isfinite(wd)) bad("--weight-decay must be a number >= 0, got " + shortest(wd));
  if (!(momentum >= 0 && momentum < 1)) bad("--momentum must be in [0, 1), got " + shortest(momentum));
  if (!(clip_norm >= 0) || !std::isfinite(clip_norm))
    bad("--clip-norm must be a number >= 0 (0: off), got " + shortest(clip_norm));
  kernels::validate(kernels::AdamParams{beta_1, beta_2, epsilon});
  if (schedule.warmup_steps < 0) bad("--warmup-steps must be >= 0, got " + std::to_string(schedule.warmup_steps));
}

void Optimizer::prepare(const kernels::OptimizerOps&, int, const std::int64_t*, const float*, float*) const {}

std::vector<std::string> optimizer_names() {
  std::vector<std::string> out;
  for (const auto& [n, f] : registry()) out.push_back(n);
  return out;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c) {
  for (const auto& [n, f] : registry())
    if (n == c.name) return f(c);
  c.check(1);  // an unknown name: throws, naming --optimizer and the choices
  throw ValueError("--optimizer: unknown optimizer '" + c.name + "'");
}

OptimizerWork::OptimizerWork(const OptimizerConfig& c, int members, int first, Device device)
    : base_lr(Shape{members}, DType::f32, device),
      weight_decay(Shape{members}, DType::f32, device),
      lr(Shape{members}, DType::f32, device),
      aux(Shape{members}, DType::f32, device),
      sumsq(Shape{members}, DType::f64, device),
      clip(Shape{members}, DType::f32, device) {
  std::vector<float> lrs, wds;
  for (int m = first; m < first + members; ++m) {
    lrs.push_back(c.learning_rate_of(m));
    wds.push_back(c.weight_decay_of(m));
    decays = decays || wds.back() != 0.0f;
  }
  base_lr.copy_from_host(lrs.data(), lrs.size() * sizeof(float));
  weight_decay.copy_from_host(wds.data(), wds.size() * sizeof(float));
}

TrainState make_train_state(const Optimizer& opt, Array params, std::int64_t state_floats) {
  TrainState s;
  s.state = Array(Shape{state_floats}, DType::f32, params.device());
  for (const std::string& slot : opt.slots()) s.opt.emplace(slot, Array(params.shape(), DType::f32, params.device()));
  s.step = Array(Shape{1}, DType::i64, params.device());  // zero-filled, as every new Array
  s.params = std::move(params);
  return s;
}

void optimizer_step(const Optimizer& opt, UpdateOptions u, const kernels::OptimizerOps& ops, const Sequential& model,
                    OptimizerWork& work, TrainState& state, const float* grads) {
  const int members = static_cast<int>(work.base_lr.size());
  const std::int64_t* step = state.step.data<std::int64_t>();
  ops.schedule_lr(u.schedule, members, step, work.base_lr.data<float>(), work.lr.data<float>());
  opt.prepare(ops, members, step, work.lr.data<float>(), work.aux.data<float>());
  kernels::UpdateScalars s{work.lr.data<float>(), work.decays ? work.weight_decay.data<float>() : nullptr, nullptr};
  if (u.clip_norm > 0) {
    // The split tensors' blocks first, completed by a psum over their axes; then the whole tensors.
    const std::vector<TensorSlot>& tensors = model.tensors();
    auto split = [&](std::size_t k) { return k < u.split_tensors.size() && u.split_tensors[k]; };
    bool first = true;
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        if (split(k) != (pass == 0)) continue;
        ops.sum_squares(members, static_cast<std::size_t>(tensors[k].size), grads + tensors[k].offset * members,
                        work.sumsq.data<double>(), !first);
        first = false;
      }
      if (pass == 0 && !first) psum_inplace(work.sumsq, u.split_axes);
    }
    ops.clip_factor(members, work.sumsq.data<double>(), u.clip_norm, work.clip.data<float>());
    s.grad_scale = work.clip.data<float>();
  }
  const std::vector<std::string>& names = opt.slots();
  std::array<float*, Optimizer::kMaxSlots> slots{};  // nothing allocates in a step
  for (const TensorSlot& t : model.tensors()) {
    const std::int64_t at = t.offset * members;
    for (std::size_t k = 0; k < names.size(); ++k) slots[k] = state.opt.at(names[k]).data<float>() + at;
    opt.update(ops, members, static_cast<std::size_t>(t.size), s, work.aux.data<float>(),
               state.params.data<float>() + at, slots.data(), grads + at);
  }
  ops.increment(state.step.data<std::int64_t>());
}

}  // namespace pmap::ensemble
