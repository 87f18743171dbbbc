// Single-tower throughput of every model's TrainStep on the CPU backend, and (optionally) a check that the
// mlp's default learning rate reaches the bar on Fashion-MNIST.
//
//   dtrain_models_bench [--threads=1] [--seconds=3] [--models=mlp,cnn,convnet,cifar10]
//                       [--fashion_mnist=/usr/share/datasets/fashion-mnist] [--steps=2000]
//
// Prints one line per model: batch, steps timed, examples/sec, last loss (checked finite). With
// --fashion_mnist, trains the mlp with plain SGD at DefaultsByName("mlp") for --steps steps and prints its test
// accuracy (exit code 1 below 80%).
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "kernels/device.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"

namespace dtrain::models {
namespace {

struct Flags {
  int threads = 1;
  double seconds = 3.0;
  std::vector<std::string> models = {"mlp", "cnn", "convnet", "cifar10"};
  std::string fashion_mnist;
  int steps = 2000;
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

// The bench names its models; each is resolved once where it is benchmarked.
ModelDefaults DefaultsByName(const std::string& name) {
  absl::StatusOr<ModelRef> spec = ResolveModel(name);
  return spec.ok() ? (*spec)->defaults : ModelDefaults{};
}
absl::StatusOr<std::unique_ptr<Model>> CreateModelByName(const std::string& name, const ModelOptions& o,
                                                        kernels::Device* device) {
  absl::StatusOr<ModelRef> spec = ResolveModel(name);
  if (!spec.ok()) return spec.status();
  return CreateModel(**spec, o, device);
}

int Batch(const std::string& name) {
  if (name == "convnet") return 256;  // one tower's share of the 1024 default
  return DefaultsByName(name).batch_size;
}

int Bench(const Flags& f, const std::string& name) {
  ModelOptions o;
  o.batch_size = Batch(name);
  const ModelDefaults d = DefaultsByName(name);
  SetInputGeometry(d, d.data_height, d.data_width, d.data_channels, &o);
  auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(f.threads));
  if (!dev.ok()) return Fail(dev.status());
  auto model = CreateModelByName(name, o, dev->get());
  if (!model.ok()) return Fail(model.status());
  std::vector<float> params = InitialParameters((*model)->variables(), 1);
  std::vector<float> grads(params.size());
  if (absl::Status s = (*model)->SetParameters(params.data()); !s.ok()) return Fail(s);
  std::mt19937_64 gen(1);
  std::vector<float> images(static_cast<size_t>(o.batch_size) * o.height * o.width * o.channels), labels(o.batch_size);
  for (float& x : images) x = std::uniform_real_distribution<float>(0, 1)(gen);
  for (float& l : labels) l = static_cast<float>(gen() % 10);
  const HostBatch b{o.batch_size, o.height, o.width, o.channels, images.data(), labels.data()};
  float loss = 0;
  int steps = -1;  // the first step warms up (oneDNN primitive caches, page faults)
  auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (steps < 2 || elapsed < f.seconds) {
    auto l = (*model)->TrainStep(b, steps + 1, grads.data());
    if (!l.ok()) return Fail(l.status());
    loss = *l;
    if (++steps == 0) start = std::chrono::steady_clock::now();
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (!std::isfinite(loss)) return Fail(absl::InternalError(name + ": loss is not finite"));
  std::printf("%-8s params %10lld  batch %4d  threads %d  steps %4d  %9.1f examples/sec  %7.1f ms/step  loss %.4f\n",
              name.c_str(), static_cast<long long>((*model)->num_parameters()), o.batch_size, f.threads, steps,
              steps * o.batch_size / elapsed, 1e3 * elapsed / steps, loss);
  return 0;
}

// Reads a gzip IDX file's payload after its header (images: 16 bytes, labels: 8 bytes).
bool ReadIdx(const std::string& path, size_t header, std::vector<uint8_t>* out) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::vector<uint8_t> all;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) all.insert(all.end(), buf, buf + n);
  gzclose(f);
  if (all.size() < header) return false;
  out->assign(all.begin() + header, all.end());
  return true;
}

int FashionMnist(const Flags& f) {
  std::vector<uint8_t> train_x, train_y, test_x, test_y;
  const std::string& d = f.fashion_mnist;
  if (!ReadIdx(d + "/train-images-idx3-ubyte.gz", 16, &train_x) ||
      !ReadIdx(d + "/train-labels-idx1-ubyte.gz", 8, &train_y) ||
      !ReadIdx(d + "/t10k-images-idx3-ubyte.gz", 16, &test_x) ||
      !ReadIdx(d + "/t10k-labels-idx1-ubyte.gz", 8, &test_y) || train_x.size() != train_y.size() * 784 ||
      test_x.size() != test_y.size() * 784 || test_y.size() % 1000 != 0) {
    return Fail(absl::NotFoundError("cannot read Fashion-MNIST IDX files from " + d));
  }
  const ModelDefaults defaults = DefaultsByName("mlp");
  ModelOptions o;
  o.batch_size = defaults.batch_size;
  o.eval_batch_size = 1000;
  auto dev = kernels::CreateDevice(kernels::DeviceSpec::Cpu(f.threads));
  if (!dev.ok()) return Fail(dev.status());
  auto model = CreateModelByName("mlp", o, dev->get());
  if (!model.ok()) return Fail(model.status());
  std::vector<float> params = InitialParameters((*model)->variables(), 1), grads(params.size());
  std::vector<float> images(784 * 1000), labels(1000);
  std::mt19937_64 gen(2);
  const size_t train_n = train_y.size();
  for (int step = 0; step < f.steps; ++step) {
    if (absl::Status s = (*model)->SetParameters(params.data()); !s.ok()) return Fail(s);
    for (int i = 0; i < o.batch_size; ++i) {
      const size_t k = gen() % train_n;
      for (int p = 0; p < 784; ++p) images[i * 784 + p] = train_x[k * 784 + p] / 255.0f;
      labels[i] = train_y[k];
    }
    auto loss = (*model)->TrainStep({o.batch_size, 28, 28, 1, images.data(), labels.data()}, step, grads.data());
    if (!loss.ok()) return Fail(loss.status());
    for (size_t i = 0; i < params.size(); ++i) params[i] -= defaults.learning_rate * grads[i];
  }
  if (absl::Status s = (*model)->SetParameters(params.data()); !s.ok()) return Fail(s);
  int correct = 0;
  for (size_t start = 0; start < test_y.size(); start += 1000) {
    for (size_t i = 0; i < 1000; ++i) {
      for (int p = 0; p < 784; ++p) images[i * 784 + p] = test_x[(start + i) * 784 + p] / 255.0f;
      labels[i] = test_y[start + i];
    }
    auto c = (*model)->CountCorrect({1000, 28, 28, 1, images.data(), labels.data()});
    if (!c.ok()) return Fail(c.status());
    correct += *c;
  }
  const double acc = static_cast<double>(correct) / test_y.size();
  std::printf("mlp Fashion-MNIST: sgd lr %.3g batch %d, %d steps: test accuracy %.4f\n", defaults.learning_rate,
              o.batch_size, f.steps, acc);
  return acc >= 0.8 ? 0 : 1;
}

int Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return a.compare(0, n, name) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--threads=")) f.threads = std::atoi(v);
    else if (const char* v = value("--seconds=")) f.seconds = std::atof(v);
    else if (const char* v = value("--models=")) f.models = absl::StrSplit(v, ',', absl::SkipEmpty());
    else if (const char* v = value("--fashion_mnist=")) f.fashion_mnist = v;
    else if (const char* v = value("--steps=")) f.steps = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  int rc = 0;
  for (const std::string& m : f.models) rc |= Bench(f, m);
  if (!f.fashion_mnist.empty()) rc |= FashionMnist(f);
  return rc;
}

}  // namespace
}  // namespace dtrain::models

int main(int argc, char** argv) { return dtrain::models::Main(argc, argv); }
