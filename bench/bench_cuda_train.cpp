// Training throughput of the Flax MNIST CNN on one GPU, in model-images/s (members x batch x steps / s),
// at batch 128 for 1, 4 and 8 members: members batched on one device (eager, and replayed as a CUDA
// graph), and one member per virtual device sharing the GPU (each its own stream). Prints a table and one
// JSON line per configuration. Without a GPU it says so and exits 0.
//   bench_cuda_train [--steps N] [--warmup N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include "ensemble/model.h"
#include "ensemble/runner.h"
#include "kernels/backend.h"

#if PMAPCC_HAVE_CUDA
#include "kernels/cuda/graph.h"
#include "kernels/cuda/ops.h"
#endif

namespace {

constexpr int kBatch = 128;

struct Options {
  int steps = 200;
  int warmup = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) o.steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--warmup") == 0) o.warmup = std::atoi(argv[i + 1]);
  }
  return o;
}

#if PMAPCC_HAVE_CUDA
using pmap::Array;
using pmap::DType;
using pmap::Shape;
namespace k = pmap::kernels;

// One device's training buffers for `members` members: the model runner, parameters, momentum,
// gradients, a fixed random batch, and the loss outputs (host for the eager step, device for graphs).
struct DeviceTrainer {
  DeviceTrainer(const pmap::ensemble::Sequential& model, pmap::Device device, int members)
      : runner(model, device, members, kBatch),
        be(k::backend_for(device.kind)),
        params(Shape{members * model.params_per_member()}, DType::f32, device),
        momentum(params.shape(), DType::f32, device),
        grads(params.shape(), DType::f32, device),
        x(Shape{kBatch, 28, 28, 1}, DType::f32, device),
        labels(Shape{kBatch}, DType::i32, device),
        dlogits(Shape{members, kBatch, 10}, DType::f32, device),
        loss_dev(Shape{members}, DType::f32, device),
        correct_dev(Shape{members}, DType::i32, device),
        loss(static_cast<std::size_t>(members)),
        correct(static_cast<std::size_t>(members)),
        xent{members, kBatch, 10, true} {
    std::vector<pmap::Key> keys = pmap::split(pmap::key(0), members);
    std::vector<float> host(static_cast<std::size_t>(params.size()));
    model.init(keys, host);
    params.copy_from_host(host.data(), params.nbytes());
    pmap::uniform(pmap::key(1), x);
    std::vector<std::int32_t> y(kBatch);
    for (int i = 0; i < kBatch; ++i) y[static_cast<std::size_t>(i)] = i % 10;
    labels.copy_from_host(y.data(), labels.nbytes());
  }

  // The train step as ensemble/step.cpp runs it: loss and counts read on the host every step.
  void eager_step() {
    const float* logits = runner.forward(x.data<float>(), kBatch, params.data<float>());
    be.softmax_cross_entropy(xent, logits, labels.data<std::int32_t>(), loss.data(), dlogits.data<float>(), nullptr,
                             correct.data());
    backward_and_update();
  }

  // The same step with device-side loss outputs only: capturable in a CUDA graph.
  void device_step() {
    const float* logits = runner.forward(x.data<float>(), kBatch, params.data<float>());
    k::gpu::softmax_cross_entropy(xent, logits, labels.data<std::int32_t>(), loss_dev.data<float>(),
                                  dlogits.data<float>(), nullptr, correct_dev.data<std::int32_t>(), nullptr);
    backward_and_update();
  }

  void backward_and_update() {
    runner.backward(x.data<float>(), params.data<float>(), dlogits.data<float>(), grads.data<float>());
    be.sgd_momentum_update(k::SgdParams{}, static_cast<std::size_t>(params.size()), params.data<float>(),
                           momentum.data<float>(), grads.data<float>());
  }

  pmap::ensemble::ModelRunner runner;
  const k::Backend& be;
  Array params, momentum, grads, x, labels, dlogits, loss_dev, correct_dev;
  std::vector<float> loss;
  std::vector<std::int32_t> correct;
  k::SoftmaxXentParams xent;
};

// Seconds for `steps` calls of step(d) on every device of the mesh (one pmap; pmap waits for the GPU).
template <class Step> double time_steps(const pmap::Mesh& mesh, int steps, Step&& step) {
  const auto start = std::chrono::steady_clock::now();
  pmap::pmap([&]() {
    for (int s = 0; s < steps; ++s) step(pmap::axis_index("i"));
  }, mesh, "i")();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void report(const char* mode, int members, int devices, int steps, double seconds) {
  const double rate = static_cast<double>(members) * devices * kBatch * steps / seconds;
  std::printf("%-22s members %2d  devices %2d  %9.1f ms/step  %12.0f model-images/s\n", mode, members * devices,
              devices, 1e3 * seconds / steps, rate);
  std::printf("{\"bench\": \"cuda_train\", \"mode\": \"%s\", \"members\": %d, \"devices\": %d, \"batch\": %d, "
              "\"steps\": %d, \"seconds\": %.6f, \"model_images_per_s\": %.1f}\n",
              mode, members * devices, devices, kBatch, steps, seconds, rate);
}

// `members` members batched on one device: eager steps, then graph replays.
void bench_batched(const pmap::ensemble::Sequential& model, int members, const Options& o) {
  const pmap::Device gpu{pmap::DeviceKind::cuda, 0, 0};
  pmap::Mesh mesh({gpu}, "i");
  std::unique_ptr<DeviceTrainer> t;
  std::unique_ptr<k::gpu::GraphStep> graph;
  pmap::pmap([&]() {
    t = std::make_unique<DeviceTrainer>(model, gpu, members);
    graph = std::make_unique<k::gpu::GraphStep>([&] { t->device_step(); });
  }, mesh, "i")();
  time_steps(mesh, o.warmup, [&](int) { t->eager_step(); });
  report("batched/eager", members, 1, o.steps, time_steps(mesh, o.steps, [&](int) { t->eager_step(); }));
  time_steps(mesh, o.warmup, [&](int) { (*graph)(); });  // warm-up, capture, replays
  report("batched/graph", members, 1, o.steps, time_steps(mesh, o.steps, [&](int) { (*graph)(); }));
  pmap::pmap([&]() {  // free on the device's thread
    graph.reset();
    t.reset();
  }, mesh, "i")();
}

// One member on each of `devices` virtual devices sharing GPU 0, each with its own stream.
void bench_virtual(const pmap::ensemble::Sequential& model, int devices, const Options& o) {
  std::vector<pmap::Device> list;
  for (int i = 0; i < devices; ++i) list.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  pmap::Mesh mesh(list, "i");
  std::vector<std::unique_ptr<DeviceTrainer>> t(static_cast<std::size_t>(devices));
  pmap::pmap([&]() {
    const int d = pmap::axis_index("i");
    t[static_cast<std::size_t>(d)] = std::make_unique<DeviceTrainer>(model, list[static_cast<std::size_t>(d)], 1);
  }, mesh, "i")();
  time_steps(mesh, o.warmup, [&](int d) { t[static_cast<std::size_t>(d)]->eager_step(); });
  report("virtual-devices/eager", 1, devices, o.steps,
         time_steps(mesh, o.steps, [&](int d) { t[static_cast<std::size_t>(d)]->eager_step(); }));
  pmap::pmap([&]() { t[static_cast<std::size_t>(pmap::axis_index("i"))].reset(); }, mesh, "i")();
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::printf("bench_cuda_train: Flax MNIST CNN, batch %d, %d timed steps after %d warm-up steps\n", kBatch, o.steps,
              o.warmup);
  if (pmap::cuda_device_count() == 0) {
    std::printf("no GPU: skipped\n");
    return 0;
  }
#if PMAPCC_HAVE_CUDA
  const auto model = pmap::ensemble::flax_mnist_cnn();
  for (int members : {1, 4, 8}) bench_batched(*model, members, o);
  for (int devices : {4, 8}) bench_virtual(*model, devices, o);
#endif
  return 0;
}
