// Tests of the optimizer kernels and the program's optimizer flags: the optimizer ops (SGD's trace, Adam's step
// size, schedules, clipping, the step counter) against their formulas computed independently, the CUDA kernels
// (run on the host; on a GPU too) against the CPU ops bit for bit, schedules as text (--lr-schedule), and the
// checks of the program's OptimizerConfig (examples/mnist_ensemble/config.h), which recipe_optimizer applies too.
#include "cuda_testing.h"

#include <cmath>
#include <cstring>

#include <pmapcc/kernels/cpu_backend.h>

#include "examples/mnist_ensemble/config.h"
#include "examples/mnist_ensemble/recipe.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using namespace cuda_testing;
namespace k = pmap::kernels;
namespace pe = pmap::ensemble;

const k::OptimizerOps& cpu_optimizer() { return k::cpu_backend().optimizer(); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("optimizer ops: sgd_trace keeps the update apart, params + updates is SGD's step in float, "
          "zeros' signs too") {
  const int members = 3;
  const std::size_t n = 41;
  const std::vector<float> lr{0.1f, 0.05f, 0.0f};  // a zero rate makes signed-zero updates
  const std::size_t z = 2 * n;  // the zero-rate member's first element
  for (float momentum : {0.9f, 0.0f})
  for (bool nesterov : {false, true}) {
    CAPTURE(momentum);
    CAPTURE(nesterov);
    const k::SgdParams sp{momentum, nesterov};
    // p and m: optax.sgd's step written out in float (m = momentum m + g; p -= lr m, or lr (g + momentum m)
    // with nesterov); ours_p: the same params plus sgd_trace's updates.
    std::vector<float> p = random_floats(members * n, 61), m(members * n, 0.0f), ours_p = p, trace = m;
    p[z + 3] = -0.0f, ours_p[z + 3] = -0.0f;  // a -0 parameter keeps its sign only where u is -0 too
    bool negative_zero_u = false, positive_zero_u = false;  // the zero-rate member's updates: both zeros made
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g = random_floats(members * n, 62 + static_cast<std::uint32_t>(step));
      // Signed zeros: a gradient of -0 after a negative one makes a -0 trace (momentum 0: 0 * -1 + -0), and
      // +-0 gradients meet +-0 traces in the zero-rate member.
      g[z + 5] = 0.0f;
      g[z + 6] = step == 0 ? -1.0f : -0.0f;
      g[6] = step == 0 ? -1.0f : -0.0f;
      for (std::size_t i = 0; i < p.size(); ++i) {
        const float r = lr[i / n];
        m[i] = momentum * m[i] + g[i];
        p[i] -= nesterov ? r * (g[i] + momentum * m[i]) : r * m[i];
      }
      std::vector<float> next(members * n, 7.0f), u(members * n, 7.0f);
      cpu_optimizer().sgd_trace(sp, members, n, lr.data(), g.data(), trace.data(), next.data(), u.data());
      for (std::size_t i = 0; i < u.size(); ++i) {  // the formula written out
        const float r = lr[i / n], want_next = momentum * trace[i] + g[i];
        CHECK(std::memcmp(&next[i], &want_next, sizeof(float)) == 0);
        const float want_u = -(nesterov ? r * (g[i] + momentum * want_next) : r * want_next);
        CHECK(std::memcmp(&u[i], &want_u, sizeof(float)) == 0);
        ours_p[i] += u[i];
        if (i >= z) (std::signbit(u[i]) ? negative_zero_u : positive_zero_u) = true;
      }
      trace = next;
      CHECK(same_bits(trace, m));
      CHECK(same_bits(ours_p, p));
      if (momentum == 0.0f && step > 0) CHECK(std::signbit(trace[z + 6]));  // the -0 trace was made
    }
    CHECK(std::signbit(p[z + 3]) == std::signbit(ours_p[z + 3]));
    CHECK(negative_zero_u);
    CHECK(positive_zero_u);
  }
  std::vector<float> x(4), lr1(1, 0.1f);
  CHECK_THROWS_WITH_AS(cpu_optimizer().sgd_trace(k::SgdParams{}, 1, 4, lr1.data(), x.data(), nullptr, x.data(),
                                                 x.data()),
                       doctest::Contains("trace"), pmap::Error);
  CHECK_THROWS_WITH_AS(cpu_optimizer().sgd_trace(k::SgdParams{}, 0, 4, lr1.data(), x.data(), x.data(), x.data(),
                                                 x.data()),
                       doctest::Contains("members"), pmap::ValueError);
}

TEST_CASE("optimizer ops: adam_step_size is Keras's bias-corrected step size, per member, at the device's step") {
  // alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) with t = step + 1 (the step read from memory), in double,
  // rounded to float once: within 2^-24 of the formula computed here in double, relative (the double's own
  // rounding aside); a step size computed in float, or at another t, would usually miss it.
  const int members = 3;
  const std::vector<float> lr{1e-3f, 3e-3f, 0.5f};
  for (const k::AdamParams adam : {k::AdamParams{}, k::AdamParams{0.8, 0.99, 1e-8f}}) {
    CAPTURE(adam.beta_1);
    std::int64_t step = 0;
    std::vector<float> alpha(members, 7.0f);
    for (int t = 1; t <= 6; ++t) {
      CAPTURE(t);
      cpu_optimizer().adam_step_size(adam, members, &step, lr.data(), alpha.data());
      for (int m = 0; m < members; ++m) {
        const double want = static_cast<double>(lr[static_cast<std::size_t>(m)]) *
                            std::sqrt(1.0 - std::pow(adam.beta_2, t)) / (1.0 - std::pow(adam.beta_1, t));
        const double got = alpha[static_cast<std::size_t>(m)];
        CHECK(std::abs(got - want) <= want * 0x1p-24 * (1 + 1e-6));
      }
      cpu_optimizer().increment(&step);
    }
    CHECK(step == 6);
  }
}

TEST_CASE("optimizer ops: schedules give their formulas' factors, on the device from the step counter") {
  k::ScheduleParams p;
  p.warmup_steps = 4;
  CHECK(k::schedule_factor(p, 0) == 0.0);
  CHECK(k::schedule_factor(p, 1) == 0.25);
  CHECK(k::schedule_factor(p, 4) == 1.0);
  CHECK(k::schedule_factor(p, 1000) == 1.0);
  p.kind = k::ScheduleKind::cosine, p.decay_steps = 10, p.alpha = 0.1;
  CHECK(k::schedule_factor(p, 4) == doctest::Approx(1.0));
  CHECK(k::schedule_factor(p, 9) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5))));
  CHECK(k::schedule_factor(p, 14) == doctest::Approx(0.1));
  CHECK(k::schedule_factor(p, 100) == doctest::Approx(0.1));  // after the decay: its final factor
  p = k::ScheduleParams{};
  p.kind = k::ScheduleKind::exponential, p.decay_steps = 10, p.decay_rate = 0.5;
  CHECK(k::schedule_factor(p, 5) == doctest::Approx(std::sqrt(0.5)));
  p.staircase = true;
  CHECK(k::schedule_factor(p, 5) == 1.0);
  CHECK(k::schedule_factor(p, 25) == 0.25);
  p = k::ScheduleParams{};
  p.kind = k::ScheduleKind::piecewise, p.boundaries_count = 2;
  p.boundaries[0] = 3, p.values[0] = 0.1, p.boundaries[1] = 6, p.values[1] = 0.01;
  CHECK(k::schedule_factor(p, 2) == 1.0);
  CHECK(k::schedule_factor(p, 3) == 0.1);
  CHECK(k::schedule_factor(p, 7) == 0.01);
  // The op: the base rate times the factor at *step; a constant schedule leaves it bit for bit.
  const std::vector<float> base{0.1f, 0.3f};
  std::vector<float> lr(2);
  const std::int64_t step = 4;
  cpu_optimizer().schedule_lr(p, 2, &step, base.data(), lr.data());
  CHECK(lr == std::vector<float>{static_cast<float>(0.1f * 0.1), static_cast<float>(0.3f * 0.1)});
  cpu_optimizer().schedule_lr(k::ScheduleParams{}, 2, &step, base.data(), lr.data());
  CHECK(lr == base);
  p.boundaries[1] = 2;  // not increasing
  CHECK_THROWS_WITH_AS(cpu_optimizer().schedule_lr(p, 2, &step, base.data(), lr.data()),
                       doctest::Contains("increasing"), pmap::ValueError);
}

TEST_CASE("optimizer ops: clipping by global norm over a member's tensors, as optax") {
  // Member 0: tensors (3) and (4): norm 5, clipped to 1 -> factor 0.2. Member 1: (0.3), (0.4): norm 0.5, kept.
  const std::vector<float> a{3.0f, 0.3f}, b{4.0f, 0.4f};
  std::vector<double> sumsq(2, 99.0);
  cpu_optimizer().sum_squares(2, 1, a.data(), sumsq.data(), false);
  cpu_optimizer().sum_squares(2, 1, b.data(), sumsq.data(), true);
  CHECK(sumsq[0] == 25.0);
  CHECK(sumsq[1] == doctest::Approx(0.25));
  std::vector<float> factor(2);
  cpu_optimizer().clip_factor(2, sumsq.data(), 1.0f, factor.data());
  CHECK(factor[0] == 0.2f);
  CHECK(factor[1] == 1.0f);
  CHECK_THROWS_WITH_AS(cpu_optimizer().clip_factor(2, sumsq.data(), 0.0f, factor.data()), doctest::Contains("max_norm"),
                       pmap::ValueError);
}

TEST_CASE("cuda optimizer ops are bitwise the CPU ops") {
  const int members = 3;
  const std::size_t n = 1001;
  const auto grads = random_floats(members * n, 72);
  const std::vector<float> base{0.1f, 0.01f, 0.5f};
  k::ScheduleParams sched;
  sched.kind = k::ScheduleKind::cosine, sched.warmup_steps = 1, sched.decay_steps = 5;
  // Three steps of: lr from the schedule, Adam's step size, the clipping factor to norm 3, SGD's trace and
  // update, the step counter.
  auto run = [&](const k::OptimizerOps& ops, auto&& buffer, auto&& read) {
    auto step = buffer(std::vector<std::int64_t>{0});
    auto b = buffer(base), lr = buffer(std::vector<float>(members)), alpha = buffer(std::vector<float>(members));
    auto sumsq = buffer(std::vector<double>(members)), clip = buffer(std::vector<float>(members));
    auto g = buffer(grads);
    auto tt = buffer(std::vector<float>(members * n)), tn = buffer(std::vector<float>(members * n)),
         tu = buffer(std::vector<float>(members * n));
    for (int iteration = 0; iteration < 3; ++iteration) {
      ops.schedule_lr(sched, members, step.template data<std::int64_t>(), b.template data<float>(),
                      lr.template data<float>());
      ops.adam_step_size(k::AdamParams{}, members, step.template data<std::int64_t>(), lr.template data<float>(),
                         alpha.template data<float>());
      ops.sum_squares(members, n, g.template data<float>(), sumsq.template data<double>(), false);
      ops.clip_factor(members, sumsq.template data<double>(), 3.0f, clip.template data<float>());
      ops.sgd_trace(k::SgdParams{0.9f, iteration % 2 == 1}, members, n, lr.template data<float>(),
                    g.template data<float>(), tt.template data<float>(), tn.template data<float>(),
                    tu.template data<float>());
      std::swap(tt, tn);
      ops.increment(step.template data<std::int64_t>());
    }
    return std::vector<std::vector<float>>{read(lr), read(alpha), read(clip), read(tt), read(tu)};
  };
  const pmap::Device host{pmap::DeviceKind::cpu, 0, 0};
  auto host_buffer = [&](auto v) { return on(host, v); };
  auto read = [](const pmap::Array& a) { return a.to_vector<float>(); };
  const auto expect = run(cpu_optimizer(), host_buffer, read);
  CHECK(expect[2][0] < 1.0f);  // the clipping did something
  for (const Target& t : targets()) {
    CAPTURE(t.name);
    auto buffer = [&](auto v) { return on(t.device, v); };
    const auto got = run(t.backend->optimizer(), buffer, read);
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      if (t.device.is_cpu())
        CHECK(same_bits(got[i], expect[i]));
      else
        CHECK(relative_error(got[i], expect[i]) <= kForwardTolerance);  // CUDA's cos/pow may differ in the last bit
    }
  }
}

TEST_CASE("schedules as text: every kind parses back from its str(), and bad text names --lr-schedule") {
  for (const char* text : {"constant", "cosine", "cosine:0.1", "exponential:0.5:100", "piecewise:10=0.1,20=0.01"})
    CHECK(pe::parse_schedule(text).str() == text);
  const pe::Schedule s = pe::parse_schedule("piecewise:10=0.1,20=0.01");
  const k::ScheduleParams p = s.params();
  CHECK(p.boundaries_count == 2);
  CHECK(p.boundaries[1] == 20);
  CHECK(p.values[1] == 0.01);
  for (auto [text, why] :
       std::vector<std::pair<const char*, const char*>>{{"linear", "unknown schedule 'linear'"},
                                                        {"cosine:2", "final factor must be in [0, 1]"},
                                                        {"exponential:0.5", "a rate and a number of steps"},
                                                        {"exponential:0.5:0", "the steps must be >= 1"},
                                                        {"exponential:0.5:-3", "the steps must be >= 1"},
                                                        {"exponential:x:10", "'x' is not a number"},
                                                        {"piecewise:10=0.1,5=0.2", "increasing"},
                                                        {"piecewise:10", "is not STEP=FACTOR"},
                                                        {"constant:1", "takes no arguments"}}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(pe::parse_schedule(text), doctest::Contains(why), pmap::ValueError);
    CHECK_THROWS_WITH_AS(pe::parse_schedule(text), doctest::Contains("--lr-schedule"), pmap::ValueError);
  }
  pe::Schedule warm;
  warm.warmup_steps = -1;
  CHECK_THROWS_WITH_AS(warm.params(), doctest::Contains("--warmup-steps"), pmap::ValueError);
}

TEST_CASE("the optimizer configuration's checks name the flag") {
  pe::OptimizerConfig c;
  c.check(4);
  c.name = "lamb";
  CHECK_THROWS_WITH_AS(c.check(4), doctest::Contains("--optimizer must be one of sgd, adam, adamw, got 'lamb'"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(pe::recipe_optimizer(c, 4, 10), doctest::Contains("--optimizer"), pmap::ValueError);
  c = pe::OptimizerConfig{};
  c.learning_rate = {0.1f, 0.2f, 0.3f};
  CHECK_THROWS_WITH_AS(c.check(4), doctest::Contains("--lr gives 3 values for 4 member(s)"), pmap::ValueError);
  c.check(3);
  CHECK(c.learning_rate_of(2) == 0.3f);
  c.weight_decay = {-1.0f};
  CHECK_THROWS_WITH_AS(c.check(3), doctest::Contains("--weight-decay must be a number >= 0"), pmap::ValueError);
  c.weight_decay = {};
  CHECK(c.weight_decay_of(1) == 0.0f);
  c.name = "adamw";
  CHECK(c.weight_decay_of(1) == 0.004f);  // Keras's AdamW default
  c.learning_rate = {};
  CHECK(c.learning_rate_of(0) == 0.001f);  // Keras's Adam default; SGD's is 0.1
  c.learning_rate = {0.1f, 0.2f};
  CHECK_THROWS_WITH_AS(c.learning_rate_of(2), doctest::Contains("--lr gives 2 values: none for member 2"),
                       pmap::ValueError);
  CHECK(c.learning_rates(2) == std::vector<float>{0.1f, 0.2f});
  CHECK(c.weight_decays(2) == std::vector<float>{0.004f});
  c.learning_rate = {};
  c.clip_norm = -1;
  CHECK_THROWS_WITH_AS(c.check(3), doctest::Contains("--clip-norm"), pmap::ValueError);
  CHECK(pe::optimizer_names() == std::vector<std::string>{"sgd", "adam", "adamw"});
}

}  // namespace PMAPCC_TEST_FILE
