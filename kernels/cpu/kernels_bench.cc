// Micro-benchmark of the CPU backend at the MNIST CNN's shapes (batch 50):
//   conv1 28x28x1 -> 32 (5x5 SAME), relu, pool 2x2/2, conv2 14x14x32 -> 64 (5x5 SAME), relu, pool 2x2/2,
//   dense 3136 -> 1024, relu, dense 1024 -> 10, softmax cross-entropy.
// For 1 and 2 threads it prints ms per op call and GFLOP/s, then times the whole training step (forward and
// backward, no optimizer) and prints examples/sec. Before timing, each conv/dense output is verified against
// the reference loops on the first example of the batch (prints #wrong). Times are the best of 5 rounds.
// Then the broadcasting Binary op at a residual block's activation (50x14x14x64): a same-shape Add (a residual
// connection), a per-channel bias Add and a scalar Mul, forward and backward, verified against the reference
// and reported in GB/s beside a plain copy of the same tensor (CopyOnDevice) timed in the same run.
//
// Usage: dtrain_kernels_bench [iterations=50] [threads=1|2, default both]   (ONEDNN_VERBOSE=1 shows which
// implementations run)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/gradient_check.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels {
namespace {

using testing::CompareArrays;
using testing::RandomVector;

constexpr int kBatch = 50;

#define BENCH_CHECK(expr)                                                                \
  do {                                                                                   \
    const absl::Status s_ = (expr);                                                      \
    if (!s_.ok()) {                                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #expr, std::string(s_.message()).c_str()); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

template <typename T>
T Unwrap(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return std::move(*v);
}

struct Timing {
  double wall_ms = 1e30;  // best round, wall clock per call
  double cpu_ms = 1e30;   // best round, process CPU time per call (all threads together)
};

double CpuNowMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// Per-call times of fn: after 3 warm-up calls, the best of 5 rounds of iters/5 calls each (the best round,
// because on a shared machine other processes only ever add time). With one thread, the CPU time excludes the
// time the process was descheduled and is the steadier figure on a loaded machine.
Timing Time(int iters, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  const int per_round = std::max(1, iters / 5);
  Timing t;
  for (int round = 0; round < 5; ++round) {
    const double cpu0 = CpuNowMs();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < per_round; ++i) fn();
    const double wall =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    t.wall_ms = std::min(t.wall_ms, wall / per_round);
    t.cpu_ms = std::min(t.cpu_ms, (CpuNowMs() - cpu0) / per_round);
  }
  return t;
}

void Report(const char* op, const Timing& t, double flops) {
  std::printf("  %-26s %8.3f ms wall %8.3f ms cpu", op, t.wall_ms, t.cpu_ms);
  if (flops > 0) std::printf("  %6.1f GFLOP/s (wall)", flops / (t.wall_ms * 1e6));
  std::printf("\n");
}

class Bench {
 public:
  Bench(int threads, int iters)
      : iters_(iters), dev_(Unwrap(CreateCpuDevice(DeviceSpec::Cpu(threads)), "device")) {}

  float* Random(int64_t n, uint64_t seed, float scale = 1.0f) {
    float* p = Unwrap(dev_->Alloc(n), "Alloc");
    std::vector<float> v = RandomVector(n, seed, -scale, scale);
    BENCH_CHECK(dev_->CopyToDevice(v.data(), p, n));
    return p;
  }
  std::vector<float> Host(const float* p, int64_t n) {
    std::vector<float> v(n);
    BENCH_CHECK(dev_->CopyToHost(p, v.data(), n));
    return v;
  }

  // Verifies a conv forward on example 0 against the reference; returns the number of wrong outputs.
  int64_t VerifyConv(const Conv2DParams& p, const float* x, const float* w, const float* b, const float* y) {
    Conv2DParams one = p;
    one.batch = 1;
    const int64_t nx = int64_t{p.in_h} * p.in_w * p.in_c, ny = int64_t{p.out_h()} * p.out_w() * p.out_c;
    std::vector<float> ref(ny);
    const std::vector<float> hw = Host(w, int64_t{p.k_h} * p.k_w * p.in_c * p.out_c), hb = Host(b, p.out_c);
    reference::Conv2DForward(one, Host(x, nx).data(), hw.data(), hb.data(), ref.data());
    return CompareArrays(Host(y, ny), ref, 1e-4, 1e-4).mismatches;
  }
  int64_t VerifyDense(const DenseParams& p, const float* x, const float* w, const float* b, const float* y) {
    DenseParams one = p;
    one.batch = 1;
    std::vector<float> ref(p.out);
    const std::vector<float> hw = Host(w, int64_t{p.in} * p.out), hb = Host(b, p.out);
    reference::DenseForward(one, Host(x, p.in).data(), hw.data(), hb.data(), ref.data());
    return CompareArrays(Host(y, p.out), ref, 1e-4, 1e-4).mismatches;
  }

  void Run() {
    std::printf("threads=%d batch=%d iterations=%d\n", dev_->spec().threads, kBatch, iters_);
    Conv2DParams c1;
    c1.batch = kBatch, c1.in_h = 28, c1.in_w = 28, c1.in_c = 1, c1.out_c = 32, c1.k_h = 5, c1.k_w = 5;
    Conv2DParams c2 = c1;
    c2.in_h = 14, c2.in_w = 14, c2.in_c = 32, c2.out_c = 64;
    PoolParams p1;
    p1.batch = kBatch, p1.in_h = 28, p1.in_w = 28, p1.channels = 32;
    PoolParams p2 = p1;
    p2.in_h = 14, p2.in_w = 14, p2.channels = 64;
    const DenseParams d1{kBatch, 7 * 7 * 64, 1024}, d2{kBatch, 1024, 10};

    auto conv1 = Unwrap(dev_->MakeConv2D(c1), "conv1");
    auto conv2 = Unwrap(dev_->MakeConv2D(c2), "conv2");
    auto pool1 = Unwrap(dev_->MakeMaxPool(p1), "pool1");
    auto pool2 = Unwrap(dev_->MakeMaxPool(p2), "pool2");
    auto fc1 = Unwrap(dev_->MakeDense(d1), "fc1");
    auto fc2 = Unwrap(dev_->MakeDense(d2), "fc2");

    const int64_t n_x = kBatch * 28 * 28, n_a1 = kBatch * 28 * 28 * 32, n_p1 = kBatch * 14 * 14 * 32;
    const int64_t n_a2 = kBatch * 14 * 14 * 64, n_p2 = kBatch * 7 * 7 * 64, n_f1 = kBatch * 1024,
                  n_f2 = kBatch * 10;
    float *x = Random(n_x, 1), *w1 = Random(5 * 5 * 32, 2, 0.2f), *b1 = Random(32, 3, 0.1f);
    float *w2 = Random(5 * 5 * 32 * 64, 4, 0.05f), *b2 = Random(64, 5, 0.1f);
    float *w3 = Random(3136 * 1024, 6, 0.02f), *b3 = Random(1024, 7, 0.1f);
    float *w4 = Random(1024 * 10, 8, 0.05f), *b4 = Random(10, 9, 0.1f);
    float *a1 = Random(n_a1, 10), *h1 = Random(n_p1, 11), *a2 = Random(n_a2, 12), *h2 = Random(n_p2, 13);
    float *f1 = Random(n_f1, 14), *f2 = Random(n_f2, 15), *loss = Random(1, 16);
    float *g_a1 = Random(n_a1, 17), *g_h1 = Random(n_p1, 18), *g_a2 = Random(n_a2, 19),
          *g_h2 = Random(n_p2, 20);
    float *g_f1 = Random(n_f1, 21), *g_f2 = Random(n_f2, 22);
    float *gw1 = Random(5 * 5 * 32, 23), *gb1 = Random(32, 24), *gw2 = Random(5 * 5 * 32 * 64, 25),
          *gb2 = Random(64, 26);
    float *gw3 = Random(3136 * 1024, 27), *gb3 = Random(1024, 28), *gw4 = Random(10240, 29),
          *gb4 = Random(10, 30);
    std::vector<float> host_labels(kBatch);
    for (int i = 0; i < kBatch; ++i) host_labels[i] = static_cast<float>(i % 10);
    float* labels = Unwrap(dev_->Alloc(kBatch), "Alloc");
    BENCH_CHECK(dev_->CopyToDevice(host_labels.data(), labels, kBatch));

    // Verify what we time.
    BENCH_CHECK(conv1->Forward(x, w1, b1, a1));
    BENCH_CHECK(conv2->Forward(h1, w2, b2, a2));
    BENCH_CHECK(fc1->Forward(h2, w3, b3, f1));
    BENCH_CHECK(fc2->Forward(f1, w4, b4, f2));
    const int64_t wrong = VerifyConv(c1, x, w1, b1, a1) + VerifyConv(c2, h1, w2, b2, a2) +
                          VerifyDense(d1, h2, w3, b3, f1) + VerifyDense(d2, f1, w4, b4, f2);
    std::printf("  verified conv1/conv2/fc1/fc2 forward vs reference on example 0: #wrong=%lld\n",
                static_cast<long long>(wrong));

    const double conv1_flops = 2.0 * kBatch * 28 * 28 * 32 * 25 * 1,
                 conv2_flops = 2.0 * kBatch * 14 * 14 * 64 * 25 * 32;
    const double fc1_flops = 2.0 * kBatch * 3136 * 1024, fc2_flops = 2.0 * kBatch * 1024 * 10;
    Timing total{0, 0};
    auto timed = [&](const char* name, double flops, const std::function<void()>& fn, bool in_step = true) {
      const Timing t = Time(iters_, fn);
      if (in_step) total.wall_ms += t.wall_ms, total.cpu_ms += t.cpu_ms;
      Report(name, t, flops);
    };
    timed("conv1 fwd", conv1_flops, [&] { BENCH_CHECK(conv1->Forward(x, w1, b1, a1)); });
    timed(
        "conv1 bwd data (unused)", conv1_flops, [&] { BENCH_CHECK(conv1->BackwardData(g_a1, w1, x)); },
        false);
    timed("conv1 bwd weights", conv1_flops, [&] { BENCH_CHECK(conv1->BackwardWeights(x, g_a1, gw1, gb1)); });
    timed("relu1 fwd+bwd", 0, [&] {
      BENCH_CHECK(dev_->Relu(a1, a1, n_a1));
      BENCH_CHECK(dev_->ReluBackward(a1, g_a1, g_a1, n_a1));
    });
    timed("pool1 fwd", 0, [&] { BENCH_CHECK(pool1->Forward(a1, h1)); });
    timed("pool1 bwd", 0, [&] { BENCH_CHECK(pool1->Backward(g_h1, g_a1)); });
    timed("conv2 fwd", conv2_flops, [&] { BENCH_CHECK(conv2->Forward(h1, w2, b2, a2)); });
    timed("conv2 bwd data", conv2_flops, [&] { BENCH_CHECK(conv2->BackwardData(g_a2, w2, g_h1)); });
    timed("conv2 bwd weights", conv2_flops, [&] { BENCH_CHECK(conv2->BackwardWeights(h1, g_a2, gw2, gb2)); });
    timed("relu2 fwd+bwd", 0, [&] {
      BENCH_CHECK(dev_->Relu(a2, a2, n_a2));
      BENCH_CHECK(dev_->ReluBackward(a2, g_a2, g_a2, n_a2));
    });
    timed("pool2 fwd", 0, [&] { BENCH_CHECK(pool2->Forward(a2, h2)); });
    timed("pool2 bwd", 0, [&] { BENCH_CHECK(pool2->Backward(g_h2, g_a2)); });
    timed("fc1 fwd", fc1_flops, [&] { BENCH_CHECK(fc1->Forward(h2, w3, b3, f1)); });
    timed("fc1 bwd data", fc1_flops, [&] { BENCH_CHECK(fc1->BackwardData(g_f1, w3, g_h2)); });
    timed("fc1 bwd weights", fc1_flops, [&] { BENCH_CHECK(fc1->BackwardWeights(h2, g_f1, gw3, gb3)); });
    timed("fc2 fwd", fc2_flops, [&] { BENCH_CHECK(fc2->Forward(f1, w4, b4, f2)); });
    timed("fc2 bwd data", fc2_flops, [&] { BENCH_CHECK(fc2->BackwardData(g_f2, w4, g_f1)); });
    timed("fc2 bwd weights", fc2_flops, [&] { BENCH_CHECK(fc2->BackwardWeights(f1, g_f2, gw4, gb4)); });
    timed("softmax xent", 0,
          [&] { BENCH_CHECK(dev_->SoftmaxCrossEntropy(f2, labels, kBatch, 10, g_f2, loss)); });
    std::printf("  sum of the step's ops: %.3f ms wall -> %.0f examples/sec (cpu %.3f ms)\n", total.wall_ms,
                kBatch * 1000.0 / total.wall_ms, total.cpu_ms);

    const Timing step = Time(iters_, [&] {
      BENCH_CHECK(conv1->Forward(x, w1, b1, a1));
      BENCH_CHECK(dev_->Relu(a1, a1, n_a1));
      BENCH_CHECK(pool1->Forward(a1, h1));
      BENCH_CHECK(conv2->Forward(h1, w2, b2, a2));
      BENCH_CHECK(dev_->Relu(a2, a2, n_a2));
      BENCH_CHECK(pool2->Forward(a2, h2));
      BENCH_CHECK(fc1->Forward(h2, w3, b3, f1));
      BENCH_CHECK(dev_->Relu(f1, f1, n_f1));
      BENCH_CHECK(fc2->Forward(f1, w4, b4, f2));
      BENCH_CHECK(dev_->SoftmaxCrossEntropy(f2, labels, kBatch, 10, g_f2, loss));
      BENCH_CHECK(fc2->BackwardWeights(f1, g_f2, gw4, gb4));
      BENCH_CHECK(fc2->BackwardData(g_f2, w4, g_f1));
      BENCH_CHECK(dev_->ReluBackward(f1, g_f1, g_f1, n_f1));
      BENCH_CHECK(fc1->BackwardWeights(h2, g_f1, gw3, gb3));
      BENCH_CHECK(fc1->BackwardData(g_f1, w3, g_h2));
      BENCH_CHECK(pool2->Backward(g_h2, g_a2));
      BENCH_CHECK(dev_->ReluBackward(a2, g_a2, g_a2, n_a2));
      BENCH_CHECK(conv2->BackwardWeights(h1, g_a2, gw2, gb2));
      BENCH_CHECK(conv2->BackwardData(g_a2, w2, g_h1));
      BENCH_CHECK(pool1->Backward(g_h1, g_a1));
      BENCH_CHECK(dev_->ReluBackward(a1, g_a1, g_a1, n_a1));
      BENCH_CHECK(conv1->BackwardWeights(x, g_a1, gw1, gb1));
    });
    std::printf(
        "  full training step (fwd+bwd, no optimizer): %.3f ms wall -> %.0f examples/sec (cpu %.3f ms -> "
        "%.0f)\n\n",
        step.wall_ms, kBatch * 1000.0 / step.wall_ms, step.cpu_ms, kBatch * 1000.0 / step.cpu_ms);
    RunBinary();
  }

  // Binary at 50x14x14x64; bytes = the floats each call reads and writes.
  void RunBinary() {
    const int64_t c = 64, rows = int64_t{kBatch} * 14 * 14, n = rows * c;
    auto bcast = [&](BinaryOp op, int64_t b_row, int64_t b_col) {
      BroadcastParams p;
      p.op = op, p.rank = 2, p.dims[0] = rows, p.dims[1] = c;
      p.a_strides[0] = c, p.a_strides[1] = 1, p.b_strides[0] = b_row, p.b_strides[1] = b_col;
      return p;
    };
    struct Case {
      const char* name;
      BroadcastParams p;
    };
    const Case cases[] = {{"add same shape", bcast(BinaryOp::kAdd, c, 1)},
                          {"add per-channel bias", bcast(BinaryOp::kAdd, 0, 1)},
                          {"mul scalar", bcast(BinaryOp::kMul, 0, 0)}};
    float *a = Random(n, 40), *b = Random(n, 41), *y = Random(n, 42), *dy = Random(n, 43), *da = Random(n, 44),
          *db = Random(n, 45);
    const Timing copy = Time(iters_, [&] { BENCH_CHECK(dev_->CopyOnDevice(a, y, n)); });
    const double copy_gbs = 2.0 * n * 4 / (copy.wall_ms * 1e6);
    std::printf("  copy %lld floats            %8.3f ms wall  %6.1f GB/s\n", static_cast<long long>(n), copy.wall_ms,
                copy_gbs);
    for (const Case& k : cases) {
      auto op = Unwrap(dev_->MakeBinary(k.p), "MakeBinary");
      const int64_t nb = k.p.b_size();
      BENCH_CHECK(op->Forward(a, b, y));
      BENCH_CHECK(op->Backward(a, b, dy, da, db));
      std::vector<float> y_ref(n), da_ref(n), db_ref(nb);
      const std::vector<float> ha = Host(a, n), hb = Host(b, nb), hdy = Host(dy, n);
      reference::BinaryForward(k.p, ha.data(), hb.data(), y_ref.data());
      reference::BinaryBackward(k.p, ha.data(), hb.data(), hdy.data(), da_ref.data(), db_ref.data());
      const int64_t wrong = CompareArrays(Host(y, n), y_ref, 1e-5, 1e-6).mismatches +
                            CompareArrays(Host(da, n), da_ref, 1e-5, 1e-6).mismatches +
                            CompareArrays(Host(db, nb), db_ref, 1e-3, 1e-3).mismatches;
      const Timing fwd = Time(iters_, [&] { BENCH_CHECK(op->Forward(a, b, y)); });
      const Timing bwd = Time(iters_, [&] { BENCH_CHECK(op->Backward(a, b, dy, da, db)); });
      // Forward reads a (and b) and writes y; backward reads dy (and a, b for Mul) and writes da and db.
      const bool mul = k.p.op == BinaryOp::kMul;
      const double fwd_bytes = 4.0 * (2 * n + nb), bwd_bytes = 4.0 * (n + n + nb + (mul ? n + nb : 0));
      std::printf("  %-22s fwd %7.3f ms %6.1f GB/s (%.2f of copy)  bwd %7.3f ms %6.1f GB/s  #wrong=%lld\n", k.name,
                  fwd.wall_ms, fwd_bytes / (fwd.wall_ms * 1e6), fwd_bytes / (fwd.wall_ms * 1e6) / copy_gbs,
                  bwd.wall_ms, bwd_bytes / (bwd.wall_ms * 1e6), static_cast<long long>(wrong));
    }
    std::printf("\n");
  }

 private:
  int iters_;
  std::unique_ptr<Device> dev_;
};

}  // namespace
}  // namespace dtrain::kernels

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  if (iters <= 0) {
    std::fprintf(stderr, "usage: %s [iterations > 0]\n", argv[0]);
    return 2;
  }
  // Optional second argument: only this thread count.
  const int only = argc > 2 ? std::atoi(argv[2]) : 0;
  for (int threads : {1, 2}) {
    if (only == 0 || only == threads) dtrain::kernels::Bench(threads, iters).Run();
  }
  return 0;
}
