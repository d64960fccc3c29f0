// train::EarlyStopping, per-member early stopping on a validation set as a part beside the Trainer's loop:
// each member's records follow Keras's rule on the validation NLLs the epochs give, each member stops on its
// own and ends at its best epoch's parameters and BatchNorm statistics (those of the same run without early
// stopping after that epoch); a run saved mid-way resumes exactly on another device count; Trainer::set_members
// and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/early_stopping.h>
#include <pmapcc/train/trainer.h>

#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace train = pmap::train;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

using pmap::testing::stacked;

// Member g's rows of each tensor of `names` (host tensors (members, ...)), tensor after tensor.
std::vector<float> member_rows(const train::Variables& v, const std::vector<std::string>& names, int g) {
  std::vector<float> out;
  for (const std::string& n : names) {
    const auto t = v.at(n).to_vector<float>();
    const std::size_t row = t.size() / static_cast<std::size_t>(v.at(n).dim(0));
    const auto first = t.begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(g));
    out.insert(out.end(), first, first + static_cast<std::ptrdiff_t>(row));
  }
  return out;
}

// Keras's EarlyStopping(patience) on one member's validation NLLs, epoch by epoch (nll[e - 1]: epoch e's): the
// first epoch is its best, a lower NLL (or a number after a NaN) a new best, and `patience` epochs without one
// stop it at the last of them; an epoch after it stopped changes nothing.
train::MemberStopping expected_record(const std::vector<double>& nll, int patience) {
  train::MemberStopping r;
  for (int e = 1; e <= static_cast<int>(nll.size()) && r.stopped_epoch == 0; ++e) {
    const double x = nll[static_cast<std::size_t>(e - 1)];
    if (r.best_epoch == 0 || x < r.best_nll || (std::isnan(r.best_nll) && !std::isnan(x))) {
      r.best_epoch = e;
      r.best_nll = x;
      r.wait = 0;
    } else if (++r.wait >= patience) {
      r.stopped_epoch = e;
    }
  }
  return r;
}

void check_record(const train::MemberStopping& got, const train::MemberStopping& want) {
  CHECK(got.best_epoch == want.best_epoch);
  CHECK(((got.best_nll == want.best_nll) || (std::isnan(got.best_nll) && std::isnan(want.best_nll))));
  CHECK(got.wait == want.wait);
  CHECK(got.stopped_epoch == want.stopped_epoch);
}

// A Trainer of `members` members on `devices` CPU devices, each member its own learning rate.
std::unique_ptr<train::Trainer> make_trainer(train::Model model, train::Optimizer optimizer, int devices,
                                             const std::vector<float>& rates) {
  return std::make_unique<train::Trainer>(
      std::move(model), std::move(optimizer),
      pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "ensemble"),
      train::TrainerOptions{.members = static_cast<int>(rates.size()), .batch_size = 64,
                            .hyperparams = {.learning_rate = rates}});
}

}  // namespace

TEST_CASE("early stopping callback: each member stops on its own and ends at its best epoch") {
  // 4 members on 2 devices, flax-cnn, SGD with momentum at 0.1, 0.05, 2.0 (diverges early) and 0.1, a quarter of
  // the 640 examples held out, patience 1, at most 6 epochs; beside it the same run without early stopping.
  const int epochs = 6, members = 4;
  const std::vector<float> rates{0.1f, 0.05f, 2.0f, 0.1f};
  const train::Optimizer sgd(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f});
  const auto [fit, held_out] = train::split_validation(data().train, 0.25, train::validation_key(0));
  CHECK(held_out.count == 160);
  const auto now = make_trainer(train::flax_cnn({12, 12, 1}), sgd, 2, rates);
  const auto plain = make_trainer(train::flax_cnn({12, 12, 1}), sgd, 2, rates);
  const std::vector<std::string> names = now->model().param_names();
  std::vector<train::Variables> after;  // after[e]: the run without early stopping's parameters after e epochs
  after.push_back(plain->params());
  train::EarlyStopping stop(1);
  CHECK(stop.members().empty());
  std::vector<train::Evaluation> history;  // the epochs' evaluations on the validation set
  while (now->epochs_done() < epochs && !stop.all_stopped()) {
    CAPTURE(now->epochs_done());
    now->run_epoch(fit);
    plain->run_epoch(fit);
    after.push_back(plain->params());
    history.push_back(stop.end_epoch(*now, held_out));
    REQUIRE(history.back().member_calibration.size() == members);
    REQUIRE(stop.members().size() == members);
  }
  stop.restore_best(*now);
  const int run = now->epochs_done();
  const train::Variables final_params = now->params();
  int stopped = 0, early = 0;
  bool all = true;
  for (int g = 0; g < members; ++g) {
    CAPTURE(g);
    const auto m = static_cast<std::size_t>(g);
    std::vector<double> nll;
    for (const train::Evaluation& v : history) nll.push_back(v.member_calibration[m].nll);
    const train::MemberStopping& s = stop.members()[m];
    check_record(s, expected_record(nll, 1));
    REQUIRE(s.best_epoch >= 1);
    REQUIRE(s.best_epoch <= run);
    stopped += s.stopped_epoch > 0 ? 1 : 0;
    early += s.stopped_epoch > 0 && s.stopped_epoch < run ? 1 : 0;
    all = all && s.stopped_epoch > 0;
    // After it stopped, every epoch evaluates its best parameters: its numbers stay its best epoch's.
    if (s.stopped_epoch > 0)
      for (int e = s.stopped_epoch + 1; e <= run; ++e) {
        CHECK(history[static_cast<std::size_t>(e - 1)].member_accuracy[m] ==
              history[static_cast<std::size_t>(s.best_epoch - 1)].member_accuracy[m]);
        const double nll_then = history[static_cast<std::size_t>(e - 1)].member_calibration[m].nll;
        CHECK(((nll_then == s.best_nll) || (std::isnan(nll_then) && std::isnan(s.best_nll))));
      }
    // Its parameters at the end are those the run without early stopping had after its best epoch, bit for bit
    // (each member trains alone: the others' stops change nothing of it).
    CHECK(member_rows(final_params, names, g) ==
          member_rows(after[static_cast<std::size_t>(s.best_epoch)], names, g));
  }
  CHECK(stop.all_stopped() == all);
  CHECK((run == epochs || all));
  CHECK(stopped >= 2);  // members stopped early and went back to their best: the parameters above can tell
  CHECK(early >= 1);    // one before the last epoch: the loop above saw epochs after its stop
}

TEST_CASE("early stopping callback: BatchNorm's moving statistics go back to the best epoch with the parameters") {
  // keras-convnet (BatchNorm, Dropout), Adam at 1e-3 and at 0.05 (which overshoots), 2 members on 1 device;
  // beside it the same run without early stopping.
  const int epochs = 4, members = 2;
  const std::vector<float> rates{1e-3f, 0.05f};
  const train::Optimizer adam(pmap::optim::Adam{.learning_rate = 1e-3f});
  const auto [fit, held_out] = train::split_validation(data().train, 0.25, train::validation_key(0));
  const auto now = make_trainer(train::keras_convnet({12, 12, 1}), adam, 1, rates);
  const auto plain = make_trainer(train::keras_convnet({12, 12, 1}), adam, 1, rates);
  std::vector<train::Variables> params_after, state_after;  // [e]: the run without early stopping's after e epochs
  params_after.push_back(plain->params());
  state_after.push_back(plain->model_state());
  train::EarlyStopping stop(1);
  while (now->epochs_done() < epochs && !stop.all_stopped()) {
    now->run_epoch(fit);
    plain->run_epoch(fit);
    params_after.push_back(plain->params());
    state_after.push_back(plain->model_state());
    stop.end_epoch(*now, held_out);
  }
  stop.restore_best(*now);
  const train::Model& model = now->model();
  REQUIRE(!model.state_names().empty());
  const train::Variables params = now->params(), state = now->model_state();
  int behind = 0;  // members whose best epoch is not the last one run: their restored state can tell
  for (int g = 0; g < members; ++g) {
    CAPTURE(g);
    const int best = stop.members()[static_cast<std::size_t>(g)].best_epoch;
    REQUIRE(best >= 1);
    behind += best < now->epochs_done() ? 1 : 0;
    CHECK(member_rows(params, model.param_names(), g) ==
          member_rows(params_after[static_cast<std::size_t>(best)], model.param_names(), g));
    CHECK(member_rows(state, model.state_names(), g) ==
          member_rows(state_after[static_cast<std::size_t>(best)], model.state_names(), g));
  }
  CHECK(behind >= 1);
}

namespace {

struct StoppingRun {
  // 4 members, learning rates 0.1, 0.05, 2.0 and 0.1, a quarter of the training set held out, patience 1.
  std::vector<float> rates{0.1f, 0.05f, 2.0f, 0.1f};
  std::pair<train::Dataset, train::Dataset> parts =
      train::split_validation(data().train, 0.25, train::validation_key(0));

  std::unique_ptr<train::Trainer> trainer(int devices) const {
    return std::make_unique<train::Trainer>(
        train::flax_cnn({12, 12, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
        pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "ensemble"),
        train::TrainerOptions{.members = 4, .batch_size = 64,
                              .hyperparams = {.learning_rate = rates}});
  }
  // Epochs until `last` or every member has stopped.
  void run(train::Trainer& t, train::EarlyStopping& stop, int last) const {
    while (t.epochs_done() < last && !stop.all_stopped()) {
      t.run_epoch(parts.first);
      stop.end_epoch(t, parts.second);
    }
  }
};

}  // namespace

TEST_CASE("early stopping callback: a run saved mid-way resumes exactly, on another device count") {
  const StoppingRun r;
  const auto straight = r.trainer(2);
  train::EarlyStopping all(1);
  r.run(*straight, all, 6);
  all.restore_best(*straight);
  const auto path = pmap::testing::scratch_dir("pmapcc_train_early_stopping_test") / "mid.safetensors";
  {
    const auto first = r.trainer(2);
    train::EarlyStopping stop(1);
    r.run(*first, stop, 2);
    std::map<std::string, std::string> meta;
    train::Variables tensors;
    stop.save_to(meta, tensors);
    CHECK(tensors.contains("best/params/Conv_0/kernel"));
    first->save(path, meta, tensors);
  }
  {  // written on 2 devices, continued on 1
    const auto t = r.trainer(1);
    train::EarlyStopping stop(1);
    stop.restore(t->load(path, {"best/"}), *t, path.string());
    CHECK(t->epochs_done() == 2);
    r.run(*t, stop, 6);
    stop.restore_best(*t);
    for (std::size_t g = 0; g < 4; ++g) {
      CAPTURE(g);
      CHECK(stop.members()[g].best_epoch == all.members()[g].best_epoch);
      CHECK(stop.members()[g].stopped_epoch == all.members()[g].stopped_epoch);
      CHECK(stop.members()[g].wait == all.members()[g].wait);
    }
    CHECK(t->epochs_done() == straight->epochs_done());
    CHECK(stacked(t->params(), t->model().param_names()) ==
          stacked(straight->params(), t->model().param_names()));
  }
  // A file without records, and records of other members.
  const auto t = r.trainer(1);
  CHECK_THROWS_WITH_AS(train::EarlyStopping(1).restore(train::Checkpoint{}, *t, "x.safetensors"),
                       "x.safetensors: __metadata__ has no 'early_stopping' (written by a run without early "
                       "stopping)", pmap::DataError);
  CHECK_THROWS_WITH_AS(train::EarlyStopping(2).restore(t->load(path, {"best/"}), *t, "z.safetensors"),
                       "z.safetensors: the run stopped its members with patience 1; this EarlyStopping's is 2",
                       pmap::DataError);
  const train::Checkpoint three{{{"early_stopping", R"([{"best_epoch": 0, "best_nll": null, "wait": 0,
      "stopped_epoch": 0}])"}}, {}};
  CHECK_THROWS_WITH_AS(train::EarlyStopping(1).restore(three, *t, "y.safetensors"),
                       doctest::Contains("holds 1 records; the Trainer has 4 members"), pmap::DataError);
  CHECK_THROWS_WITH_AS(t->save(path, {}, [&] {
    train::Variables v;
    v.emplace("params/x", pmap::Array(pmap::Shape{1}, pmap::DType::f32));
    return v;
  }()), "train::Trainer::save: tensor 'params/x' is under params/, where the Trainer writes its own", pmap::ValueError);
}

TEST_CASE("early stopping callback and set_members: errors") {
  CHECK_THROWS_WITH_AS(train::EarlyStopping(0), "train::EarlyStopping: patience is 0; it must be at least 1",
                       pmap::ValueError);
  auto make = [](int members) {
    return std::make_unique<train::Trainer>(
        train::flax_cnn({12, 12, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f}),
        pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "ensemble"),
        train::TrainerOptions{.members = members});
  };
  auto two = make(2), three = make(3);
  train::EarlyStopping stop(2);
  stop.end_epoch(*two, data().test);
  CHECK_THROWS_WITH_AS(stop.end_epoch(*three, data().test),
                       "train::EarlyStopping::end_epoch: the Trainer has 3 members; this EarlyStopping keeps the "
                       "records of 2", pmap::ValueError);
  // set_members: member 1 takes the other Trainer's member 1, member 0 keeps its own.
  auto other = make(2);
  other->run_epoch(data().train);
  const train::Variables before = two->params();
  two->set_members(other->params(), other->model_state(), {1});
  const train::Variables after = two->params();
  for (const auto& [name, a] : after) {
    CAPTURE(name);
    const std::int64_t row = a.size() / 2;
    const auto mine = a.to_vector<float>(), was = before.at(name).to_vector<float>(),
               theirs = other->params().at(name).to_vector<float>();
    CHECK(std::equal(mine.begin(), mine.begin() + row, was.begin()));
    CHECK(std::equal(mine.begin() + row, mine.end(), theirs.begin() + row));
  }
  CHECK_THROWS_WITH_AS(two->set_members(other->params(), other->model_state(), {2}),
                       "train::Trainer::set_members: member 2 is not among the 2 members", pmap::ValueError);
  train::Variables missing = other->params();
  missing.erase("Dense_1/bias");
  CHECK_THROWS_WITH_AS(two->set_members(missing, other->model_state(), {0}),
                       "train::Trainer::set_members: params has no tensor 'Dense_1/bias'", pmap::ValueError);
  CHECK_THROWS_WITH_AS(two->set_members(three->params(), three->model_state(), {0}),
                       "train::Trainer::set_members: params tensor 'Conv_0/bias' is f32(3, 32); it must be f32(2, 32)",
                       pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
