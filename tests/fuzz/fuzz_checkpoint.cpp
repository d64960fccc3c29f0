// libFuzzer target: checkpoint metadata and configuration matching (Trainer::load_checkpoint,
// load_members, inspect_checkpoint) on a real trainer: one CPU device, one member of the CNN on 4x4
// images (38,026 parameters), trained for one epoch.
//
// The input is the head of a checkpoint file: the 8-byte header length and the JSON header with its
// __metadata__ (format, config, step, epochs, keys, history). The target appends the tensor bytes a
// checkpoint of this trainer has (zeros), so mutations land in the header and metadata, where the
// matching logic is, and a mutated file can still be accepted. A file may only be refused with
// pmap::DataError (or ValueError from load_members, for members that do not fit); an accepted one must
// leave the trainer holding the file's parameters (all zero) and the epoch count it states.
//
// PMAPCC_FUZZ_WRITE_SEED=FILE writes the head of this trainer's own checkpoint to FILE and exits: how
// tests/fuzz/corpus/fuzz_checkpoint/ was made.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/io/safetensors.h>
#include <pmapcc/ensemble/trainer.h>
#include "tests/fuzz/fuzz_common.h"
#include "tests/synthetic.h"

namespace se = pmap::ensemble;

namespace {

[[noreturn]] void violated(const std::string& what) { pmap::fuzz::violated("fuzz_checkpoint", what); }

struct Fixture {
  se::Dataset train = pmap::testing::synthetic_dataset(8, 4, 1);
  se::Dataset test = pmap::testing::synthetic_dataset(4, 4, 2);
  std::unique_ptr<se::Trainer> trainer;
  std::size_t tensor_bytes = 0;  // params and SGD momentum of every member, as f32

  Fixture() {
    se::TrainConfig c;
    c.devices = 1;
    c.members = 1;
    c.epochs = 1;
    c.batch_size = 4;
    c.eval_batch = 4;
    trainer = std::make_unique<se::Trainer>(c, train, test);
    trainer->run_epoch();
    tensor_bytes = 2 * static_cast<std::size_t>(trainer->model().params_per_member()) *
                   static_cast<std::size_t>(trainer->total_members()) * sizeof(float);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// The first 8 + N bytes of a safetensors file: its header length and header.
std::vector<char> head_of(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::vector<char> head(8 + n);
  in.seekg(0);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (!in) violated("cannot read back " + file.string());
  return head;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Fixture& f = fixture();
  if (const char* out = std::getenv("PMAPCC_FUZZ_WRITE_SEED")) {
    const auto full = pmap::fuzz::scratch().path() / "seed.safetensors";
    f.trainer->save_checkpoint(full);
    const std::vector<char> head = head_of(full);
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

  int epochs = -1;
  try {
    epochs = se::inspect_checkpoint(path).epochs_done;
  } catch (const pmap::DataError&) {
  }
  try {
    f.trainer->load_members(path, {});
    if (epochs < 0) violated("load_members accepted a file inspect_checkpoint refuses");
  } catch (const pmap::DataError&) {
  } catch (const pmap::ValueError&) {
  }
  try {
    f.trainer->load_checkpoint(path);
  } catch (const pmap::DataError&) {
    return 0;
  }
  if (epochs < 0) violated("load_checkpoint accepted a file inspect_checkpoint refuses");
  if (f.trainer->epochs_done() != epochs) violated("the trainer's epoch count is not the file's");
  for (const std::vector<float>& held : {f.trainer->params(), f.trainer->optimizer_state("momentum")})
    for (float v : held)
      if (v != 0.0f) violated("the trainer does not hold the file's parameters");
  return 0;
}
