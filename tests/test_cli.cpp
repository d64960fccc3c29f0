// Tests of mnist_ensemble's command-line parsing: defaults, both flag spellings, one-line errors.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "examples/mnist_ensemble/cli.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

using pmap::ensemble::parse_cli;
using pmap::ensemble::UsageError;

TEST_CASE("defaults follow the Flax recipe") {
  auto o = parse_cli({});
  CHECK(o.train.epochs == 10);
  CHECK(o.train.batch_size == 128);
  CHECK(o.train.optimizer.name == "sgd");
  CHECK(o.train.optimizer.learning_rate_of(0) == 0.1f);
  CHECK(o.train.optimizer.momentum == 0.9f);
  CHECK(o.train.seed == 0);
  CHECK(o.train.members == 0);  // resolved to the device count by the trainer
  CHECK(o.data == "data/mnist");
  CHECK(o.progress == "auto");
}

TEST_CASE("flags take '--flag value' and '--flag=value'") {
  auto o = parse_cli({"--members", "8", "--devices=2", "--mode", "data-parallel", "--lr=0.05", "--seed", "42",
                      "--train-limit", "1000", "--progress=none", "--save", "a.st", "--backend", "cpu"});
  CHECK(o.train.members == 8);
  CHECK(o.train.devices == 2);
  CHECK(o.train.mode == pmap::ensemble::Mode::data_parallel);
  CHECK(o.train.optimizer.learning_rate == std::vector<float>{0.05f});
  CHECK(o.train.seed == 42);
  CHECK(o.train.train_limit == 1000);
  CHECK(o.progress == "none");
  CHECK(o.save == "a.st");
  CHECK(parse_cli({"--help"}).help);
  CHECK(parse_cli({"--epochs", "3", "--epochs=4"}).train.epochs == 4);  // the last one counts
  CHECK(parse_cli({"--evaluate", "c.st", "--members-subset", "5,0,2"}).members_subset == std::vector<int>{5, 0, 2});
  CHECK(parse_cli({"--dataset", "fashion-mnist"}).data == "data/fashion-mnist");
  CHECK(parse_cli({"--dataset", "fashion-mnist", "--data", "d"}).data == "d");
  CHECK(parse_cli({"--seed", "18446744073709551615"}).train.seed == 18446744073709551615ull);
}

TEST_CASE("the help lists every flag in its group, with its default") {
  const std::string help = pmap::ensemble::cli_help("prog");
  CHECK(help.starts_with("usage: prog [flags]\nTrains an ensemble of MNIST CNNs"));
  std::size_t at = 0;
  for (const char* line : {"\nData:\n", "  --dataset D           mnist | fashion-mnist", "[mnist]\n",
                           "\nDevices:\n", "  --backend cpu|cuda    device kind  [cpu]\n",
                           "  --mode M              ensemble | data-parallel | model-parallel  [ensemble]\n",
                           "  --mesh AxM            A devices along the mode's axis by M along 'model'",
                           "  --layout NAME=SPEC    split the weights", "\nTraining:\n",
                           "  --epochs E            epochs  [10]\n", "\nOptimizer:\n",
                           "  --optimizer O         sgd | adam | adamw", "[sgd; keras-convnet: adam]\n",
                           "  --lr LR[,..]          learning rate; a list gives each member its own  [0.1; adam, adamw: 0.001]\n",
                           "  --lr-schedule S       constant | cosine[:ALPHA] | exponential:RATE:STEPS |  [constant]\n",
                           "\nOutput:\n", "\nCheckpoints:\n", "  -h,--help             this text\n",
                           "Several processes: mpirun"}) {
    const std::size_t found = help.find(line, at);
    CHECK_MESSAGE(found != std::string::npos, line);
    if (found != std::string::npos) at = found;
  }
}

TEST_CASE("bad command lines raise UsageError naming the flag") {
  CHECK_THROWS_WITH_AS(parse_cli({"--epochs", "ten"}), "--epochs: 'ten' is not an integer", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--lr", "0.1x"}), "--lr: '0.1x' is not a number", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--lr", "-1"}), doctest::Contains("must be positive"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--momentum", "1"}), doctest::Contains("[0, 1)"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--devices", "0"}), doctest::Contains("out of range"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--batch-size"}), "--batch-size needs a value", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--bogus", "1"}), "unknown flag '--bogus'", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"stray"}), doctest::Contains("unexpected argument 'stray'"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mode", "fast"}),
                       doctest::Contains("not ensemble, data-parallel or model-parallel"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--backend", "tpu"}), doctest::Contains("not cpu or cuda"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--progress", "fancy"}), doctest::Contains("auto, bar, plain or none"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--seed", "-3"}), doctest::Contains("not an integer"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--data", ""}), "--data: needs a non-empty value", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--data="}), "--data needs a value", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--members-subset", "1,,2"}), doctest::Contains("empty entry"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--bogus=3"}), "unknown flag '--bogus'", UsageError);
  CHECK_THROWS_AS(parse_cli({"--epochs", "99999999999"}), UsageError);
}

TEST_CASE("--model names a registered model, --summary asks for its table") {
  CHECK(parse_cli({}).train.model == "flax-cnn");
  CHECK_FALSE(parse_cli({}).summary);
  CHECK(parse_cli({"--summary"}).summary);
  CHECK(parse_cli({"--model", "flax-cnn"}).train.model == "flax-cnn");
  CHECK_THROWS_WITH_AS(parse_cli({"--model", "resnet"}), "--model: 'resnet' is not flax-cnn or keras-convnet", UsageError);
  CHECK(pmap::ensemble::cli_help("p").find("  --model NAME          flax-cnn (the Flax example's CNN") != std::string::npos);
  // Each model brings its recipe's optimizer and batch size where the flags leave them open.
  auto flax = parse_cli({});
  CHECK(flax.train.optimizer.name == "sgd");
  CHECK(flax.train.batch_size == 128);
  auto keras = parse_cli({"--model", "keras-convnet"});
  CHECK(keras.train.model == "keras-convnet");
  CHECK(keras.train.optimizer.name == "adam");
  CHECK(keras.train.optimizer.learning_rate_of(0) == 0.001f);
  CHECK(keras.train.batch_size == 64);
  keras = parse_cli({"--batch-size", "32", "--model", "keras-convnet", "--optimizer", "sgd"});
  CHECK(keras.train.optimizer.name == "sgd");
  CHECK(keras.train.batch_size == 32);
}

TEST_CASE("the optimizer's flags: --optimizer, per-member --lr and --weight-decay, schedules, warmup, clipping") {
  auto o = parse_cli({"--optimizer", "adam"});
  CHECK(o.train.optimizer.name == "adam");
  CHECK(o.train.optimizer.learning_rate_of(0) == 0.001f);  // Keras's default for Adam
  o = parse_cli({"--optimizer", "adamw", "--lr", "0.01,0.02", "--weight-decay=0,0.1", "--clip-norm", "1.5",
                 "--lr-schedule", "cosine:0.1", "--warmup-steps", "100"});
  CHECK(o.train.optimizer.learning_rate == std::vector<float>{0.01f, 0.02f});
  CHECK(o.train.optimizer.weight_decay == std::vector<float>{0.0f, 0.1f});
  CHECK(o.train.optimizer.clip_norm == 1.5f);
  CHECK(o.train.optimizer.schedule.str() == "cosine:0.1");
  CHECK(o.train.optimizer.schedule.warmup_steps == 100);
  o = parse_cli({"--warmup-steps", "5", "--lr-schedule", "exponential:0.5:10", "--nesterov"});  // either order
  CHECK(o.train.optimizer.schedule.warmup_steps == 5);
  CHECK(o.train.optimizer.schedule.decay_steps == 10);
  CHECK(o.train.optimizer.nesterov);
  CHECK_THROWS_WITH_AS(parse_cli({"--optimizer", "lion"}), doctest::Contains("'lion' is not sgd, adam or adamw"),
                       UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--lr", "0.1,-2"}), "--lr: must be positive, got -2", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--lr", "0.1,"}), doctest::Contains("empty entry"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--weight-decay", "x"}), "--weight-decay: 'x' is not a number", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--clip-norm", "-1"}), doctest::Contains("must be >= 0"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--lr-schedule", "linear"}), "--lr-schedule: unknown schedule 'linear' "
                       "(constant | cosine[:ALPHA] | exponential:RATE:STEPS | piecewise:STEP=FACTOR,...)", UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--lr-schedule", "exponential:0.9:0"}), doctest::Contains("the steps must be >= 1"),
                       UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--warmup-steps", "-1"}), doctest::Contains("out of range"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--optimizer", "adam", "--momentum", "0.5"}),
                       "--momentum is an option of --optimizer sgd, not of adam", UsageError);
}

TEST_CASE("model parallelism's flags: --mode model-parallel, --mesh AxM and repeatable --layout before the default") {
  using pmap::ensemble::Mode;
  using pmap::ensemble::PartitionSpec;
  auto o = parse_cli({"--mode", "model-parallel", "--mesh", "2x4"});
  CHECK(o.train.mode == Mode::model_parallel);
  CHECK(o.train.mesh_axis == 2);
  CHECK(o.train.mesh_model == 4);
  CHECK(o.train.layout.entries().size() == 3);  // the default: Dense_0 column-, Dense_1 row-parallel
  CHECK(o.train.layout.layout_of("Dense_0/kernel") == PartitionSpec::parse("None,model"));
  o = parse_cli({"--mesh=4x2", "--layout", "Dense_1/kernel=()", "--layout=Conv_0/.*=(None, None, None, 'model')"});
  CHECK(o.train.mode == Mode::ensemble);  // an ensemble of members each split over 'model'
  CHECK(o.train.splits_weights());
  REQUIRE(o.train.layout.entries().size() == 5);
  CHECK(o.train.layout.entries()[0].pattern == "Dense_1/kernel");  // in the order given, then the default's
  CHECK(o.train.layout.entries()[1].pattern == "Conv_0/.*");
  CHECK(o.train.layout.entries()[2].pattern == "Dense_0/kernel");
  CHECK(o.train.layout.layout_of("Dense_1/kernel").replicated());  // given first: overrides the default
  CHECK(o.train.layout.layout_of("Conv_0/bias") == PartitionSpec::parse("None,None,None,model"));
  CHECK(o.layouts == std::vector<std::string>{"Dense_1/kernel=()", "Conv_0/.*=(None, None, None, 'model')"});
  CHECK(parse_cli({"--mode", "model-parallel"}).train.mesh_axis == 0);  // the Trainer picks 1xN
  CHECK(parse_cli({"--mesh", "2x4", "--mesh", "8x1"}).train.mesh_axis == 8);  // the last one counts
}

TEST_CASE("bad --mesh and --layout values raise UsageError naming the flag") {
  CHECK_THROWS_WITH_AS(parse_cli({"--mesh", "2"}), doctest::Contains("--mesh: '2' is not AxM (e.g. 2x4"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mesh", "2x"}), doctest::Contains("'2x' is not AxM"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mesh", "x4"}), doctest::Contains("'x4' is not AxM"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mesh", "0x4"}), doctest::Contains("--mesh: '0x4' is out of range"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mesh", "4096x2"}), doctest::Contains("at most 4096 devices"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mesh", "2x4x1"}), doctest::Contains("is not AxM"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mode", "model-parallel", "--layout", "Dense_0/kernel"}),
                       doctest::Contains("--layout: 'Dense_0/kernel' is not NAME=SPEC"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mode", "model-parallel", "--layout", "=model"}),
                       doctest::Contains("is not NAME=SPEC"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mode", "model-parallel", "--layout", "Dense_0/kernel=None,,model"}),
                       doctest::Contains("--layout:"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mode", "model-parallel", "--layout", "Dense_[0/kernel=model"}),
                       doctest::Contains("Dense_[0/kernel"), UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--layout", "Dense_0/kernel=None,model"}),
                       "--layout splits weights over 'model': it needs --mode model-parallel or --mesh AxM with M > 1",
                       UsageError);
  CHECK_THROWS_WITH_AS(parse_cli({"--mesh", "4x1", "--layout", "Dense_0/kernel=None,model"}),
                       doctest::Contains("needs --mode model-parallel"), UsageError);
}

}  // namespace PMAPCC_TEST_FILE
