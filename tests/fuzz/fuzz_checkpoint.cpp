// libFuzzer target: checkpoint metadata and its matching against a Trainer (train::Trainer::load,
// train::read_members, and the program's inspect_checkpoint) on a real trainer: one CPU device, one member of
// the CNN on 4x4 images (train::flax_cnn({4, 4, 1}): 38,026 parameters), SGD with momentum, trained for one
// epoch and saved as the program saves it (its configuration, history and training examples in __metadata__).
//
// The input is the head of a checkpoint file: the 8-byte header length and the JSON header with its
// __metadata__ (format, model, optimizer, mode, members, seed, step, epochs, keys, the program's config and
// history). The target appends the tensor bytes a checkpoint of this trainer has (zeros), so mutations land in
// the header and metadata, where the matching logic is, and a mutated file can still be accepted. A file may
// only be refused with pmap::DataError (or ValueError from read_members); an accepted one must give, and leave
// the trainer holding, the file's parameters and optimizer slots (all zero) and the epoch count it states (the
// one inspect_checkpoint reads, when it accepts the file too: it also reads the program's config, which
// Trainer::load leaves to the program).
//
// PMAPCC_FUZZ_WRITE_SEED=FILE writes the head of this trainer's own checkpoint to FILE and exits: how
// tests/fuzz/corpus/fuzz_checkpoint/ was made.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <pmap/error.h>
#include <pmap/pmap.h>

#include <pmapcc/io/json.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>
#include "examples/mnist_ensemble/config.h"
#include "examples/mnist_ensemble/run_parts.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/synthetic.h"

namespace pe = pmap::ensemble;
namespace train = pmap::train;

namespace {

[[noreturn]] void violated(const std::string& what) { pmap::fuzz::violated("fuzz_checkpoint", what); }

struct Fixture {
  train::Dataset train_set = pmap::testing::synthetic_dataset(8, 4, 1);
  train::Dataset test_set = pmap::testing::synthetic_dataset(4, 4, 2);
  std::unique_ptr<train::Trainer> trainer;
  std::filesystem::path own;     // the trainer's checkpoint after its epoch, as the program writes it
  std::size_t tensor_bytes = 0;  // its tensors' bytes: params, SGD's trace and count

  Fixture() {
    pe::TrainConfig c;
    c.devices = 1;
    c.members = 1;
    c.epochs = 1;
    c.batch_size = 4;
    c.eval_batch = 4;
    pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "ensemble");
    const pe::TrainConfig resolved = pe::resolved_config(c, mesh, train_set, test_set);
    trainer = std::make_unique<train::Trainer>(
        train::flax_cnn({4, 4, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
        std::move(mesh), train::TrainerOptions{.members = 1, .batch_size = 4, .eval_batch = 4});
    const train::EpochReport report = trainer->run_epoch(train_set);
    const pe::EpochMetrics epoch = pe::epoch_metrics(&report, trainer->evaluate(test_set));
    own = pmap::fuzz::scratch().path() / "own.safetensors";
    trainer->save(own, pe::checkpoint_metadata(resolved, {epoch}, train_set.count));
    tensor_bytes = static_cast<std::size_t>(std::filesystem::file_size(own)) - head_size(own);
  }

  // 8 + the header's length: where a safetensors file's tensor bytes start.
  static std::size_t head_size(const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    std::uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    if (!in) violated("cannot read back " + file.string());
    return 8 + static_cast<std::size_t>(n);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// The first 8 + N bytes of a safetensors file: its header length and header.
std::vector<char> head_of(const std::filesystem::path& file) {
  std::vector<char> head(Fixture::head_size(file));
  std::ifstream in(file, std::ios::binary);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (!in) violated("cannot read back " + file.string());
  return head;
}

// Whether every f32 tensor of `v` holds zero bytes only (the file's appended zeros). (An optimizer's i64 count
// is the file's tensor, or a runner's file's step.)
bool all_zero(const train::Variables& v) {
  for (const auto& [name, a] : v) {
    if (a.dtype() != pmap::DType::f32) continue;
    const auto* p = static_cast<const unsigned char*>(a.raw_data());
    for (std::size_t i = 0; i < a.nbytes(); ++i)
      if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Fixture& f = fixture();
  if (const char* out = std::getenv("PMAPCC_FUZZ_WRITE_SEED")) {
    const std::vector<char> head = head_of(f.own);
    std::ofstream(out, std::ios::binary).write(head.data(), static_cast<std::streamsize>(head.size()));
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Fixture& f = fixture();
  std::vector<std::uint8_t> file(data, data + size);
  file.resize(size + f.tensor_bytes, 0);
  const auto path = pmap::fuzz::scratch().write("input.safetensors", file);

  int epochs = -1;  // inspect_checkpoint's count; -1: it refused the file
  try {
    epochs = pe::inspect_checkpoint(path).epochs_done;
  } catch (const pmap::DataError&) {
  }
  try {
    const train::SavedMembers saved = train::read_members(path, f.trainer->model());
    if (saved.members < 1) violated("read_members accepted a file of no member");
    if (!all_zero(saved.params) || !all_zero(saved.state)) violated("read_members did not give the file's parameters");
  } catch (const pmap::DataError&) {
  } catch (const pmap::ValueError&) {
  }
  train::Checkpoint checkpoint;
  try {
    checkpoint = f.trainer->load(path);
  } catch (const pmap::DataError&) {
    return 0;
  }
  // Accepted: the epoch count the file states (its __metadata__.epochs_done, a JSON integer as load reads it).
  long long stated = -1;
  try {
    const pmap::io::Json j = pmap::io::parse_json(checkpoint.metadata.at("epochs_done"), "epochs_done");
    if (j.is_number_integer()) stated = j.get<long long>();
  } catch (const std::exception&) {
    violated("load accepted a file without a readable __metadata__.epochs_done");
  }
  if (f.trainer->epochs_done() != stated) violated("the trainer's epoch count is not the file's");
  if (epochs >= 0 && epochs != stated) violated("inspect_checkpoint's epoch count is not the one load read");
  if (!all_zero(f.trainer->params()) || !all_zero(f.trainer->model_state()) || !all_zero(f.trainer->optimizer_state()))
    violated("the trainer does not hold the file's parameters and optimizer slots");
  return 0;
}
