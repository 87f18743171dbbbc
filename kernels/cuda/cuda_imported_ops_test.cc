// The CUDA backend's ops of imported graphs and sparse models against the CPU backend (the oracle): average
// pooling, batch normalization, broadcasting binary ops, activations, strided copies, transposes, the BatchNorm
// running-statistics delta, embedding lookups, DLRM interaction and sigmoid cross-entropy, and the tensor ops
// (strided copies, reductions, softmax, layer normalization, batched MatMul), forward and backward, several
// shapes each; their device-data errors; and steps of them captured in a CUDA graph and replayed. Every test
// skips without a usable CUDA device (the binary then exits 77).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {
namespace {

class CudaImportedOpsTest : public CudaVsCpuTest {
 protected:
  // int32 indices / offsets in a float buffer, bit for bit (GatherParams).
  Both UploadInts(const std::vector<int32_t>& v) {
    std::vector<float> bits(v.size());
    if (!v.empty()) std::memcpy(bits.data(), v.data(), v.size() * sizeof(int32_t));
    return Upload(bits);
  }
  static const int32_t* Ints(const float* p) { return reinterpret_cast<const int32_t*>(p); }
};

PoolParams AvgPoolCase(int batch, int h, int w, int c, int kh, int kw, int sh, int sw, int top, int bottom,
                       int left, int right, bool ceil_mode, bool include_pad) {
  PoolParams p{batch, h, w, c, 2, 2, Padding::kValid};
  p.window_h = kh;
  p.window_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.explicit_padding = true;
  p.pad_top = top;
  p.pad_bottom = bottom;
  p.pad_left = left;
  p.pad_right = right;
  p.ceil_mode = ceil_mode;
  p.count_include_pad = include_pad;
  return p;
}

TEST_F(CudaImportedOpsTest, AvgPoolMatchesCpu) {
  std::vector<PoolParams> cases = {
      PoolParams{2, 8, 8, 3, 2, 2, Padding::kValid},
      PoolParams{2, 7, 7, 4, 3, 2, Padding::kSame},  // TensorFlow SAME: real elements only, pad after
      AvgPoolCase(2, 7, 6, 3, 3, 3, 2, 2, 1, 1, 1, 1, false, true),
      AvgPoolCase(2, 7, 6, 3, 3, 3, 2, 2, 1, 1, 1, 1, false, false),
      AvgPoolCase(2, 6, 6, 2, 3, 3, 2, 2, 1, 1, 1, 1, true, true),    // ceil_mode overhang past the pads
      AvgPoolCase(2, 6, 6, 2, 3, 3, 2, 2, 0, 0, 0, 0, true, false),   // ceil_mode, no pads
      AvgPoolCase(2, 9, 5, 4, 3, 2, 2, 1, 0, 2, 1, 0, false, true),   // rectangular, asymmetric pads
      AvgPoolCase(3, 7, 7, 64, 7, 7, 1, 1, 0, 0, 0, 0, false, false),  // global average pooling
  };
  for (const PoolParams& p : cases) {
    SCOPED_TRACE(::testing::Message() << "in " << p.in_h << "x" << p.in_w << " window " << p.kh() << "x" << p.kw()
                                      << " stride " << p.sh() << "x" << p.sw() << " explicit " << p.explicit_padding
                                      << " ceil " << p.ceil_mode << " include_pad " << p.count_include_pad);
    auto cpu_pool = cpu_->MakeAvgPool(p);
    auto gpu_pool = gpu_->MakeAvgPool(p);
    ASSERT_TRUE(cpu_pool.ok()) << cpu_pool.status();
    ASSERT_TRUE(gpu_pool.ok()) << gpu_pool.status();
    const int64_t nx = int64_t{p.batch} * p.in_h * p.in_w * p.channels;
    const int64_t ny = int64_t{p.batch} * p.out_h() * p.out_w() * p.channels;
    Both x = Upload(Random(nx, 1)), dy = Upload(Random(ny, 2)), y = Zeros(ny), dx = Zeros(nx);
    ASSERT_TRUE((*cpu_pool)->Forward(x.cpu, y.cpu).ok());
    ASSERT_TRUE((*gpu_pool)->Forward(x.gpu, y.gpu).ok());
    EXPECT_TRUE(Same(y, 1e-5f, 1e-6f)) << "y";
    ASSERT_TRUE((*cpu_pool)->Backward(dy.cpu, dx.cpu).ok());
    ASSERT_TRUE((*gpu_pool)->Backward(dy.gpu, dx.gpu).ok());
    EXPECT_TRUE(Same(dx, 1e-5f, 1e-6f)) << "dx";
  }
}

TEST_F(CudaImportedOpsTest, BatchNormMatchesCpu) {
  for (const BatchNormParams& p : {BatchNormParams{4, 1, 3, 1e-5f}, BatchNormParams{2, 49, 16, 1e-3f},
                                   BatchNormParams{8, 1024, 64, 1e-5f}, BatchNormParams{1, 3, 5, 1e-5f}}) {
    SCOPED_TRACE(::testing::Message() << "batch " << p.batch << " spatial " << p.spatial << " channels "
                                      << p.channels);
    auto cpu_bn = cpu_->MakeBatchNorm(p);
    auto gpu_bn = gpu_->MakeBatchNorm(p);
    ASSERT_TRUE(cpu_bn.ok()) << cpu_bn.status();
    ASSERT_TRUE(gpu_bn.ok()) << gpu_bn.status();
    const int64_t n = int64_t{p.batch} * p.spatial * p.channels;
    Both x = Upload(Random(n, 3, -1.0f, 3.0f)), dy = Upload(Random(n, 4)), scale = Upload(Random(p.channels, 5));
    Both bias = Upload(Random(p.channels, 6)), y = Zeros(n), mean = Zeros(p.channels), var = Zeros(p.channels);
    Both dx = Zeros(n), dscale = Zeros(p.channels), dbias = Zeros(p.channels);
    ASSERT_TRUE((*cpu_bn)->ForwardTraining(x.cpu, scale.cpu, bias.cpu, y.cpu, mean.cpu, var.cpu).ok());
    ASSERT_TRUE((*gpu_bn)->ForwardTraining(x.gpu, scale.gpu, bias.gpu, y.gpu, mean.gpu, var.gpu).ok());
    EXPECT_TRUE(Same(mean, 1e-5f, 1e-6f)) << "batch mean";
    EXPECT_TRUE(Same(var, 1e-4f, 1e-6f)) << "batch (biased) variance";
    EXPECT_TRUE(Same(y)) << "y";
    ASSERT_TRUE(
        (*cpu_bn)->Backward(x.cpu, dy.cpu, scale.cpu, mean.cpu, var.cpu, dx.cpu, dscale.cpu, dbias.cpu).ok());
    ASSERT_TRUE(
        (*gpu_bn)->Backward(x.gpu, dy.gpu, scale.gpu, mean.gpu, var.gpu, dx.gpu, dscale.gpu, dbias.gpu).ok());
    EXPECT_TRUE(Same(dx)) << "dx";
    EXPECT_TRUE(Same(dscale)) << "dscale";
    EXPECT_TRUE(Same(dbias)) << "dbias";
    // Inference with running statistics of its own.
    Both running_mean = Upload(Random(p.channels, 7)), running_var = Upload(Random(p.channels, 8, 0.5f, 2.0f));
    ASSERT_TRUE(
        (*cpu_bn)->ForwardInference(x.cpu, scale.cpu, bias.cpu, running_mean.cpu, running_var.cpu, y.cpu).ok());
    ASSERT_TRUE(
        (*gpu_bn)->ForwardInference(x.gpu, scale.gpu, bias.gpu, running_mean.gpu, running_var.gpu, y.gpu).ok());
    EXPECT_TRUE(Same(y)) << "y (inference)";
  }
  EXPECT_EQ(gpu_->MakeBatchNorm({0, 1, 3, 1e-5f}).status().code(), absl::StatusCode::kInvalidArgument);
}

struct BroadcastCase {
  int rank;
  std::vector<int64_t> dims, a, b;
};

BroadcastParams ToParams(const BroadcastCase& c, BinaryOp op) {
  BroadcastParams p;
  p.op = op;
  p.rank = c.rank;
  for (int d = 0; d < c.rank; ++d) {
    p.dims[d] = c.dims[d];
    p.a_strides[d] = c.a[d];
    p.b_strides[d] = c.b[d];
  }
  return p;
}

TEST_F(CudaImportedOpsTest, BinaryMatchesCpu) {
  const std::vector<BroadcastCase> cases = {
      {2, {96, 16}, {16, 1}, {0, 1}},                                // NHWC + per-channel bias
      {2, {33, 7}, {1, 0}, {0, 1}},                                  // column times row
      {3, {3, 4, 5}, {20, 5, 1}, {0, 0, 0}},                         // scalar b
      {2, {5, 9}, {9, 1}, {9, 1}},                                   // same shape
      {5, {2, 3, 1, 4, 5}, {60, 20, 20, 5, 1}, {0, 5, 0, 0, 1}},     // rank 5
      {4, {2, 3, 4, 5}, {60, 20, 5, 1}, {20, 0, 5, 1}},              // broadcast in the middle
      {2, {20000, 8}, {8, 1}, {0, 1}},                               // long reduction (several chunks)
      {2, {8, 20000}, {0, 1}, {20000, 1}},                           // a broadcast over rows, long kept dim
  };
  for (const BroadcastCase& c : cases) {
    for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
      const BroadcastParams p = ToParams(c, op);
      SCOPED_TRACE(::testing::Message() << "rank " << c.rank << " dims[0] " << c.dims[0] << " op "
                                        << static_cast<int>(op));
      auto cpu_op = cpu_->MakeBinary(p);
      auto gpu_op = gpu_->MakeBinary(p);
      ASSERT_TRUE(cpu_op.ok()) << cpu_op.status();
      ASSERT_TRUE(gpu_op.ok()) << gpu_op.status();
      const int64_t n = p.out_size();
      Both a = Upload(Random(p.a_size(), 9)), b = Upload(Random(p.b_size(), 10, 0.5f, 1.5f));
      Both dy = Upload(Random(n, 11)), y = Zeros(n), da = Zeros(p.a_size()), db = Zeros(p.b_size());
      ASSERT_TRUE((*cpu_op)->Forward(a.cpu, b.cpu, y.cpu).ok());
      ASSERT_TRUE((*gpu_op)->Forward(a.gpu, b.gpu, y.gpu).ok());
      EXPECT_TRUE(Same(y, 1e-6f, 1e-7f)) << "y";
      ASSERT_TRUE((*cpu_op)->Backward(a.cpu, b.cpu, dy.cpu, da.cpu, db.cpu).ok());
      ASSERT_TRUE((*gpu_op)->Backward(a.gpu, b.gpu, dy.gpu, da.gpu, db.gpu).ok());
      EXPECT_TRUE(Same(da)) << "da";
      EXPECT_TRUE(Same(db)) << "db";
      // One gradient only, and the same result twice (fixed-order reductions).
      const std::vector<float> first = Gpu(db);
      ASSERT_TRUE(gpu_->Fill(0.0f, db.gpu, db.n).ok());
      ASSERT_TRUE((*gpu_op)->Backward(a.gpu, b.gpu, dy.gpu, nullptr, db.gpu).ok());
      EXPECT_EQ(Gpu(db), first) << "db is deterministic";
    }
  }
  // In place: y aliases a (same size and strides).
  const BroadcastParams bias = ToParams(cases[0], BinaryOp::kAdd);
  auto cpu_op = cpu_->MakeBinary(bias);
  auto gpu_op = gpu_->MakeBinary(bias);
  ASSERT_TRUE(cpu_op.ok() && gpu_op.ok());
  Both a = Upload(Random(bias.a_size(), 12)), b = Upload(Random(bias.b_size(), 13));
  ASSERT_TRUE((*cpu_op)->Forward(a.cpu, b.cpu, a.cpu).ok());
  ASSERT_TRUE((*gpu_op)->Forward(a.gpu, b.gpu, a.gpu).ok());
  EXPECT_TRUE(Same(a, 1e-6f, 1e-7f)) << "in place";
  BroadcastParams bad = bias;
  bad.dims[1] = 0;
  EXPECT_EQ(gpu_->MakeBinary(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaImportedOpsTest, ActivationsMatchCpu) {
  const int64_t n = 10007;
  std::vector<ActivationParams> kinds(4);
  kinds[0].kind = ActivationParams::Kind::kLeakyRelu;
  kinds[0].alpha = 0.2f;
  kinds[1].kind = ActivationParams::Kind::kClip;
  kinds[1].lo = -0.5f;
  kinds[1].hi = 0.75f;
  kinds[2].kind = ActivationParams::Kind::kSigmoid;
  kinds[3].kind = ActivationParams::Kind::kTanh;
  Both x = Upload(Random(n, 14, -4.0f, 4.0f)), dy = Upload(Random(n, 15));
  for (const ActivationParams& a : kinds) {
    SCOPED_TRACE(::testing::Message() << "kind " << static_cast<int>(a.kind));
    Both y = Zeros(n), dx = Zeros(n);
    ASSERT_TRUE(cpu_->Activation(a, x.cpu, y.cpu, n).ok());
    ASSERT_TRUE(gpu_->Activation(a, x.gpu, y.gpu, n).ok());
    EXPECT_TRUE(Same(y, 1e-5f, 1e-6f)) << "y";
    ASSERT_TRUE(cpu_->ActivationBackward(a, x.cpu, y.cpu, dy.cpu, dx.cpu, n).ok());
    ASSERT_TRUE(gpu_->ActivationBackward(a, x.gpu, y.gpu, dy.gpu, dx.gpu, n).ok());
    EXPECT_TRUE(Same(dx, 1e-5f, 1e-6f)) << "dx";
    // In place: y = f(y), dx = dy in the dy buffer.
    Both z = Upload(Cpu(x)), g = Upload(Cpu(dy));
    ASSERT_TRUE(gpu_->Activation(a, z.gpu, z.gpu, n).ok());
    EXPECT_EQ(Gpu(z), Gpu(y)) << "in place forward";
    ASSERT_TRUE(gpu_->ActivationBackward(a, x.gpu, y.gpu, g.gpu, g.gpu, n).ok());
    EXPECT_EQ(Gpu(g), Gpu(dx)) << "in place backward";
  }
}

TEST_F(CudaImportedOpsTest, CopyStridedAndTransposeMatchCpu) {
  // Concat of a [6, 5] and a [6, 3] block into [6, 8], then the split back, accumulating.
  const int64_t rows = 6;
  Both left = Upload(Random(rows * 5, 16)), right = Upload(Random(rows * 3, 17)), cat = Zeros(rows * 8);
  Both back = Upload(Random(rows * 3, 18));
  for (Device* d : {cpu_.get(), gpu_.get()}) {
    const bool g = d == gpu_.get();
    auto P = [g](const Both& v) { return g ? v.gpu : v.cpu; };
    ASSERT_TRUE(d->CopyStrided(P(left), 5, P(cat), 8, rows, 5, false).ok());
    ASSERT_TRUE(d->CopyStrided(P(right), 3, P(cat) + 5, 8, rows, 3, false).ok());
    ASSERT_TRUE(d->CopyStrided(P(cat) + 5, 8, P(back), 3, rows, 3, true).ok());
  }
  EXPECT_EQ(Gpu(cat), Cpu(cat)) << "concat";
  EXPECT_EQ(Gpu(back), Cpu(back)) << "accumulated split";

  for (auto [batch, r, c] : {std::tuple<int64_t, int64_t, int64_t>{3, 5, 7}, {1, 64, 33}, {2, 1, 9},
                             {4, 100, 70}, {70000, 2, 3}}) {
    SCOPED_TRACE(::testing::Message() << batch << "x" << r << "x" << c);
    const int64_t n = batch * r * c;
    Both x = Upload(Random(n, 19)), y = Zeros(n);
    ASSERT_TRUE(cpu_->Transpose(x.cpu, y.cpu, batch, r, c).ok());
    ASSERT_TRUE(gpu_->Transpose(x.gpu, y.gpu, batch, r, c).ok());
    EXPECT_EQ(Gpu(y), Cpu(y));
  }
}

TEST_F(CudaImportedOpsTest, BatchNormRunningDeltaMatchesCpu) {
  const int channels = 37;
  Both rm = Upload(Random(channels, 20)), rv = Upload(Random(channels, 21, 0.5f, 2.0f));
  Both bm = Upload(Random(channels, 22)), bv = Upload(Random(channels, 23, 0.5f, 2.0f));
  for (bool unbiased : {false, true}) {
    Both dm = Zeros(channels), dv = Zeros(channels);
    ASSERT_TRUE(cpu_->BatchNormRunningDelta(rm.cpu, rv.cpu, bm.cpu, bv.cpu, channels, 50, 0.1f, unbiased, dm.cpu,
                                            dv.cpu)
                    .ok());
    ASSERT_TRUE(gpu_->BatchNormRunningDelta(rm.gpu, rv.gpu, bm.gpu, bv.gpu, channels, 50, 0.1f, unbiased, dm.gpu,
                                            dv.gpu)
                    .ok());
    EXPECT_TRUE(Same(dm, 1e-5f, 1e-7f)) << "d_mean, unbiased " << unbiased;
    EXPECT_TRUE(Same(dv, 1e-5f, 1e-7f)) << "d_var, unbiased " << unbiased;
  }
}

TEST_F(CudaImportedOpsTest, GatherAndBackwardMatchCpu) {
  const int64_t rows = 50;
  const int dim = 24;
  Both table = Upload(Random(rows * dim, 24));
  // Plain lookups with repeats; bags with an empty one; sum and mean.
  const std::vector<int32_t> indices = {3, 7, 3, 49, 0, 12, 7, 7, 21, 3};
  const std::vector<int32_t> offsets = {0, 3, 3, 7, 10};  // bags of 3, 0, 4, 3 lookups
  Both idx = UploadInts(indices), off = UploadInts(offsets);
  GatherParams plain{rows, dim, static_cast<int64_t>(indices.size())};
  GatherParams bags = plain;
  bags.num_bags = 4;
  GatherParams mean_bags = bags;
  mean_bags.mean = true;
  for (const GatherParams& p : {plain, bags, mean_bags}) {
    SCOPED_TRACE(::testing::Message() << "bags " << p.num_bags << " mean " << p.mean);
    const int64_t out = (p.num_bags > 0 ? p.num_bags : p.count) * dim;
    Both y = Zeros(out), dy = Upload(Random(out, 25)), dtable = Zeros(rows * dim);
    ASSERT_TRUE(cpu_->Gather(p, table.cpu, Ints(idx.cpu), Ints(off.cpu), y.cpu).ok());
    ASSERT_TRUE(gpu_->Gather(p, table.gpu, Ints(idx.gpu), Ints(off.gpu), y.gpu).ok());
    EXPECT_TRUE(Same(y, 1e-6f, 1e-7f)) << "y";
    // dtable accumulates (not zeroed by the op): start both from the same non-zero values.
    const std::vector<float> start = Random(rows * dim, 26);
    dtable = Upload(start);
    ASSERT_TRUE(cpu_->GatherBackward(p, dy.cpu, Ints(idx.cpu), Ints(off.cpu), dtable.cpu).ok());
    ASSERT_TRUE(gpu_->GatherBackward(p, dy.gpu, Ints(idx.gpu), Ints(off.gpu), dtable.gpu).ok());
    EXPECT_TRUE(Same(dtable, 1e-5f, 1e-6f)) << "dtable (atomicAdd: repeated rows sum in any order)";
  }
  ASSERT_TRUE(gpu_->Synchronize().ok()) << "no device-data error for valid lookups";
}

// A bad index or bag never touches memory outside the buffers: its output is NaN and the next synchronizing call
// reports InvalidArgument naming the first bad lookup, once.
TEST_F(CudaImportedOpsTest, GatherBadIndexIsReportedAtTheNextSynchronization) {
  const int64_t rows = 10;
  const int dim = 4;
  Both table = Upload(Random(rows * dim, 27)), idx = UploadInts({1, 10, 2, -3}), y = Zeros(4 * dim);
  const GatherParams p{rows, dim, 4};
  ASSERT_TRUE(gpu_->Gather(p, table.gpu, Ints(idx.gpu), nullptr, y.gpu).ok()) << "the GPU op cannot know yet";
  const absl::Status s = gpu_->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "Gather: index 10 of lookup 1 is not a row in [0, 10)");
  const std::vector<float> got = Gpu(y);
  EXPECT_TRUE(std::isnan(got[dim])) << "lookup 1";
  EXPECT_FALSE(std::isnan(got[0])) << "lookup 0 is fine";
  EXPECT_TRUE(gpu_->Synchronize().ok()) << "reported once";

  Both dtable = Zeros(rows * dim), dy = Upload(Random(2 * dim, 28)), off = UploadInts({0, 3, 2});
  GatherParams bags{rows, dim, 4, 2};
  ASSERT_TRUE(gpu_->GatherBackward(bags, dy.gpu, Ints(idx.gpu), Ints(off.gpu), dtable.gpu).ok());
  const absl::Status b = gpu_->Synchronize();
  EXPECT_EQ(b.code(), absl::StatusCode::kInvalidArgument) << b;
  EXPECT_EQ(b.message(), "GatherBackward: bag 1 has offsets [3, 2), not an ascending range in [0, 4]");
  // The next valid call is fine.
  Both good = UploadInts({1, 2, 3, 4});
  ASSERT_TRUE(gpu_->Gather(p, table.gpu, Ints(good.gpu), nullptr, y.gpu).ok());
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

TEST_F(CudaImportedOpsTest, InteractionMatchesCpu) {
  // The last shape does not fit the 48 KiB stage: features are read from global memory.
  for (const InteractionParams& p : {InteractionParams{3, 4, 5}, InteractionParams{64, 27, 128},
                                     InteractionParams{2, 30, 512}, InteractionParams{5, 2, 1},
                                     InteractionParams{4, 1, 8}}) {
    SCOPED_TRACE(::testing::Message() << p.batch << "x" << p.features << "x" << p.dim);
    const int64_t nx = int64_t{p.batch} * p.features * p.dim, ny = p.batch * p.outputs();
    Both x = Upload(Random(nx, 29)), dy = Upload(Random(ny, 30)), y = Zeros(ny), dx = Upload(Random(nx, 31));
    ASSERT_TRUE(cpu_->Interaction(p, x.cpu, y.cpu).ok());
    ASSERT_TRUE(gpu_->Interaction(p, x.gpu, y.gpu).ok());
    EXPECT_TRUE(Same(y)) << "y";
    ASSERT_TRUE(cpu_->InteractionBackward(p, x.cpu, dy.cpu, dx.cpu).ok());
    ASSERT_TRUE(gpu_->InteractionBackward(p, x.gpu, dy.gpu, dx.gpu).ok());
    EXPECT_TRUE(Same(dx)) << "dx (overwritten)";
  }
}

TEST_F(CudaImportedOpsTest, SigmoidCrossEntropyMatchesCpu) {
  for (int batch : {1, 7, 256, 5000}) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    std::vector<float> labels(batch);
    std::mt19937 gen(32);
    for (float& l : labels) l = static_cast<float>(gen() % 2);
    Both logits = Upload(Random(batch, 33, -20.0f, 20.0f)), lab = Upload(labels), dlogits = Zeros(batch);
    Both loss = Zeros(1);
    ASSERT_TRUE(cpu_->SigmoidCrossEntropy(logits.cpu, lab.cpu, batch, dlogits.cpu, loss.cpu).ok());
    ASSERT_TRUE(gpu_->SigmoidCrossEntropy(logits.gpu, lab.gpu, batch, dlogits.gpu, loss.gpu).ok());
    EXPECT_TRUE(Same(loss, 1e-5f, 1e-6f)) << "loss";
    EXPECT_TRUE(Same(dlogits, 1e-4f, 1e-7f)) << "dlogits";
  }
}

// A label other than 0 or 1: InvalidArgument with device.h's message on both backends (from the op on the CPU,
// from the next synchronizing call on the GPU), once; the loss is NaN.
TEST_F(CudaImportedOpsTest, SigmoidCrossEntropyBadLabelIsInvalidArgumentOnBoth) {
  const int batch = 5;
  Both logits = Upload(Random(batch, 34)), lab = Upload({1, 0, 0.5f, 1, 2}), dlogits = Zeros(batch), loss = Zeros(1);
  const absl::Status cpu_status = cpu_->SigmoidCrossEntropy(logits.cpu, lab.cpu, batch, dlogits.cpu, loss.cpu);
  EXPECT_EQ(cpu_status.code(), absl::StatusCode::kInvalidArgument) << cpu_status;
  ASSERT_TRUE(gpu_->SigmoidCrossEntropy(logits.gpu, lab.gpu, batch, dlogits.gpu, loss.gpu).ok());
  float host_loss = 0.0f;
  const absl::Status gpu_status = gpu_->CopyToHost(loss.gpu, &host_loss, 1);
  EXPECT_EQ(gpu_status.code(), absl::StatusCode::kInvalidArgument) << gpu_status;
  EXPECT_EQ(gpu_status.message(), "SigmoidCrossEntropy: label 0.5 of row 2 is not 0 or 1");
  EXPECT_EQ(gpu_status.message(), cpu_status.message());
  EXPECT_TRUE(std::isnan(host_loss));
  EXPECT_TRUE(gpu_->Synchronize().ok()) << "reported once";
}

// One step through every new op (and a grouped, asymmetrically padded OIHW convolution), captured after an
// eager warm-up: the replay on new inputs gives what eager execution gives on them, bit for bit (gathered rows
// are distinct, so even GatherBackward's atomics add in a fixed order).
TEST_F(CudaImportedOpsTest, CapturedStepOfNewOpsReplaysLikeEagerExecution) {
  const int batch = 4, h = 6, w = 6, in_c = 4, out_c = 6, features = 3, dim = 8;
  Conv2DParams cp{batch, h, w, in_c, out_c, 3, 3, 1, 1, Padding::kValid};
  cp.explicit_padding = true;
  cp.pad_top = 0;
  cp.pad_bottom = 2;
  cp.pad_left = 1;
  cp.pad_right = 0;
  cp.groups = 2;
  cp.weight_layout = WeightLayout::kOIHW;
  PoolParams pp{batch, cp.out_h(), cp.out_w(), out_c, 3, 2, Padding::kValid};
  pp.explicit_padding = true;
  pp.pad_top = pp.pad_bottom = pp.pad_left = pp.pad_right = 1;
  pp.ceil_mode = true;
  const int64_t spatial = int64_t{pp.out_h()} * pp.out_w();
  const BatchNormParams bp{batch, spatial, out_c, 1e-5f};
  BroadcastParams bias_add;
  bias_add.rank = 2;
  bias_add.dims[0] = batch * spatial;
  bias_add.dims[1] = out_c;
  bias_add.a_strides[0] = out_c;
  bias_add.a_strides[1] = 1;
  bias_add.b_strides[1] = 1;
  bias_add.op = BinaryOp::kMul;
  ActivationParams sigmoid;
  sigmoid.kind = ActivationParams::Kind::kSigmoid;
  const GatherParams gp{40, dim, batch * features};
  const InteractionParams ip{batch, features, dim};

  auto conv = gpu_->MakeConv2D(cp);
  auto pool = gpu_->MakeAvgPool(pp);
  auto bn = gpu_->MakeBatchNorm(bp);
  auto mul = gpu_->MakeBinary(bias_add);
  ASSERT_TRUE(conv.ok()) << conv.status();
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_TRUE(bn.ok()) << bn.status();
  ASSERT_TRUE(mul.ok()) << mul.status();

  const int64_t nx = int64_t{batch} * h * w * in_c, nc = int64_t{batch} * cp.out_h() * cp.out_w() * out_c;
  const int64_t np = batch * spatial * out_c, ne = int64_t{batch} * features * dim, ni = batch * ip.outputs();
  Both x = Upload(Random(nx, 35)), wt = Upload(Random(cp.weights_size(), 36)), cb = Upload(Random(out_c, 37));
  Both c = Zeros(nc), p = Zeros(np), scale = Upload(Random(out_c, 38)), shift = Upload(Random(out_c, 39));
  Both bn_y = Zeros(np), mean = Zeros(out_c), var = Zeros(out_c), gate = Upload(Random(out_c, 40)), z = Zeros(np);
  Both act = Zeros(np), wide = Zeros(np * 2), tr = Zeros(np), table = Upload(Random(gp.rows * dim, 41));
  Both idx = UploadInts({0, 5, 9, 13, 17, 21, 25, 29, 33, 37, 38, 39}), emb = Zeros(ne), inter = Zeros(ni);
  Both logits = Zeros(batch), labels = Upload({0, 1, 1, 0}), dlogits = Zeros(batch), loss = Zeros(1);
  Both dinter = Zeros(ni), demb = Zeros(ne), dtable = Zeros(gp.rows * dim), dact = Zeros(np), dz = Zeros(np);
  Both dbn = Zeros(np), dgate = Zeros(out_c), dp = Zeros(np), dscale = Zeros(out_c), dshift = Zeros(out_c);
  Both dc = Zeros(nc), dx = Zeros(nx), dwt = Zeros(cp.weights_size()), dcb = Zeros(out_c);
  Both rm = Upload(Random(out_c, 42)), rv = Upload(Random(out_c, 43, 0.5f, 2.0f)), dm = Zeros(out_c),
       dv = Zeros(out_c);
  Device* d = gpu_.get();
  auto step = [&]() -> absl::Status {
    absl::Status s = (*conv)->Forward(x.gpu, wt.gpu, cb.gpu, c.gpu);
    if (s.ok()) s = (*pool)->Forward(c.gpu, p.gpu);
    if (s.ok()) s = (*bn)->ForwardTraining(p.gpu, scale.gpu, shift.gpu, bn_y.gpu, mean.gpu, var.gpu);
    if (s.ok()) s = (*mul)->Forward(bn_y.gpu, gate.gpu, z.gpu);
    if (s.ok()) s = d->Activation(sigmoid, z.gpu, act.gpu, np);
    if (s.ok()) s = d->CopyStrided(act.gpu, out_c, wide.gpu, 2 * out_c, batch * spatial, out_c, false);
    if (s.ok()) s = d->Transpose(act.gpu, tr.gpu, batch, spatial, out_c);
    if (s.ok()) s = d->Gather(gp, table.gpu, Ints(idx.gpu), nullptr, emb.gpu);
    if (s.ok()) s = d->Interaction(ip, emb.gpu, inter.gpu);
    if (s.ok()) s = d->CopyStrided(inter.gpu, ip.outputs(), logits.gpu, 1, batch, 1, false);
    if (s.ok()) s = d->SigmoidCrossEntropy(logits.gpu, labels.gpu, batch, dlogits.gpu, loss.gpu);
    if (s.ok()) s = d->Fill(0.0f, dinter.gpu, ni);
    if (s.ok()) s = d->CopyStrided(dlogits.gpu, 1, dinter.gpu, ip.outputs(), batch, 1, true);
    if (s.ok()) s = d->InteractionBackward(ip, emb.gpu, dinter.gpu, demb.gpu);
    if (s.ok()) s = d->Fill(0.0f, dtable.gpu, gp.rows * dim);
    if (s.ok()) s = d->GatherBackward(gp, demb.gpu, Ints(idx.gpu), nullptr, dtable.gpu);
    if (s.ok()) s = d->CopyStrided(wide.gpu, 2 * out_c, dact.gpu, out_c, batch * spatial, out_c, false);
    if (s.ok()) s = d->ActivationBackward(sigmoid, z.gpu, act.gpu, dact.gpu, dz.gpu, np);
    if (s.ok()) s = (*mul)->Backward(bn_y.gpu, gate.gpu, dz.gpu, dbn.gpu, dgate.gpu);
    if (s.ok()) s = (*bn)->Backward(p.gpu, dbn.gpu, scale.gpu, mean.gpu, var.gpu, dp.gpu, dscale.gpu, dshift.gpu);
    if (s.ok()) s = d->BatchNormRunningDelta(rm.gpu, rv.gpu, mean.gpu, var.gpu, out_c, batch * spatial, 0.1f, true,
                                             dm.gpu, dv.gpu);
    if (s.ok()) s = (*pool)->Backward(dp.gpu, dc.gpu);
    if (s.ok()) s = (*conv)->BackwardData(dc.gpu, wt.gpu, dx.gpu);
    if (s.ok()) s = (*conv)->BackwardWeights(x.gpu, dc.gpu, dwt.gpu, dcb.gpu);
    return s;
  };
  const std::vector<const Both*> outputs = {&loss, &dlogits, &tr, &dtable, &dgate, &dscale, &dshift,
                                            &dm,   &dv,      &dx, &dwt,    &dcb};
  auto results = [&]() {
    std::vector<std::vector<float>> r;
    for (const Both* o : outputs) r.push_back(Gpu(*o));
    return r;
  };
  ASSERT_TRUE(step().ok());  // eager warm-up (libraries load their kernels lazily)
  ASSERT_TRUE(gpu_->Synchronize().ok());
  const std::vector<std::vector<float>> first = results();

  ASSERT_TRUE(gpu_->BeginCapture().ok());
  const absl::Status captured = step();
  auto graph = gpu_->EndCapture();
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_TRUE(graph.ok()) << graph.status();

  // New inputs in the same buffers, then the replay, then eager execution on the same inputs.
  const std::vector<float> x2 = Random(nx, 44), table2 = Random(gp.rows * dim, 45);
  ASSERT_TRUE(gpu_->CopyToDevice(x2.data(), x.gpu, nx).ok());
  ASSERT_TRUE(gpu_->CopyToDevice(table2.data(), table.gpu, table.n).ok());
  ASSERT_TRUE((*graph)->Launch().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  const std::vector<std::vector<float>> replayed = results();
  ASSERT_TRUE(step().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  const std::vector<std::vector<float>> eager = results();
  for (size_t i = 0; i < outputs.size(); ++i) {
    EXPECT_EQ(replayed[i], eager[i]) << "output " << i;
    EXPECT_NE(replayed[i], first[i]) << "output " << i << " did not change with the inputs";
  }
}

// ---- the activations and tensor ops of imported graphs (transformers, torchvision models) ----

TEST_F(CudaImportedOpsTest, ImportedActivationsMatchCpu) {
  using K = ActivationParams::Kind;
  auto kind = [](K k, float alpha = 0.01f, float beta = 0.5f, float exponent = 2.0f) {
    ActivationParams p;
    p.kind = k;
    p.alpha = alpha;
    p.beta = beta;
    p.exponent = exponent;
    return p;
  };
  // (params, input range): Sqrt and fractional powers on positive inputs only.
  const std::vector<std::tuple<ActivationParams, float, float>> cases = {
      {kind(K::kHardSigmoid, 0.2f, 0.5f), -5.0f, 5.0f}, {kind(K::kHardSigmoid, 1.0f / 6.0f, 0.5f), -5.0f, 5.0f},
      {kind(K::kHardSwish), -5.0f, 5.0f},               {kind(K::kGelu), -5.0f, 5.0f},
      {kind(K::kSilu), -8.0f, 8.0f},                    {kind(K::kErf), -3.0f, 3.0f},
      {kind(K::kSqrt), 0.01f, 4.0f},                    {kind(K::kPow, 0, 0, 2.0f), -3.0f, 3.0f},
      {kind(K::kPow, 0, 0, 3.0f), -3.0f, 3.0f},         {kind(K::kPow, 0, 0, 0.5f), 0.01f, 4.0f},
  };
  const int64_t n = 10007;
  const Both dy = Upload(Random(n, 50));
  for (const auto& [a, lo, hi] : cases) {
    SCOPED_TRACE(::testing::Message() << ActivationName(a.kind) << " alpha " << a.alpha << " exponent "
                                      << a.exponent);
    std::vector<float> xs = Random(n, 51, lo, hi);
    if (lo < -3.0f && hi > 3.0f) {  // the kinks themselves
      xs[0] = -3.0f;
      xs[1] = 3.0f;
      xs[2] = -2.5f;
      xs[3] = 2.5f;
      xs[4] = 0.0f;
    }
    Both x = Upload(xs), y = Zeros(n), dx = Zeros(n);
    ASSERT_TRUE(cpu_->Activation(a, x.cpu, y.cpu, n).ok());
    ASSERT_TRUE(gpu_->Activation(a, x.gpu, y.gpu, n).ok());
    EXPECT_TRUE(Same(y, 1e-5f, 1e-6f)) << "y";
    ASSERT_TRUE(cpu_->ActivationBackward(a, x.cpu, y.cpu, dy.cpu, dx.cpu, n).ok());
    ASSERT_TRUE(gpu_->ActivationBackward(a, x.gpu, y.gpu, dy.gpu, dx.gpu, n).ok());
    EXPECT_TRUE(Same(dx, 1e-5f, 1e-6f)) << "dx";
    // In place: y = f(y), dx = dy in the dy buffer.
    Both z = Upload(xs), g = Upload(Cpu(dy));
    ASSERT_TRUE(gpu_->Activation(a, z.gpu, z.gpu, n).ok());
    EXPECT_EQ(Gpu(z), Gpu(y)) << "in place forward";
    ASSERT_TRUE(gpu_->ActivationBackward(a, x.gpu, y.gpu, g.gpu, g.gpu, n).ok());
    EXPECT_EQ(Gpu(g), Gpu(dx)) << "in place backward";
  }
  // Sqrt's backward reads y only; the others read x only.
  Both x = Upload(Random(16, 52, 0.5f, 2.0f)), y = Zeros(16), dx = Zeros(16);
  EXPECT_TRUE(gpu_->ActivationBackward(kind(K::kSqrt), nullptr, y.gpu, dy.gpu, dx.gpu, 16).ok());
  EXPECT_EQ(gpu_->ActivationBackward(kind(K::kSqrt), x.gpu, nullptr, dy.gpu, dx.gpu, 16).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(gpu_->ActivationBackward(kind(K::kGelu), x.gpu, nullptr, dy.gpu, dx.gpu, 16).ok());
  EXPECT_EQ(gpu_->ActivationBackward(kind(K::kHardSwish), nullptr, y.gpu, dy.gpu, dx.gpu, 16).code(),
            absl::StatusCode::kInvalidArgument);
}

StridedCopyParams CopyParams(const std::vector<int64_t>& dims, const std::vector<int64_t>& src,
                             const std::vector<int64_t>& dst) {
  StridedCopyParams p;
  p.rank = static_cast<int>(dims.size());
  for (int k = 0; k < p.rank; ++k) {
    p.dims[k] = dims[k];
    p.src_strides[k] = src[k];
    p.dst_strides[k] = dst[k];
  }
  return p;
}

// Dense strides of `dims` laid out in the order `perm` (outermost first).
std::vector<int64_t> PermutedStrides(const std::vector<int64_t>& dims, const std::vector<int>& perm) {
  std::vector<int64_t> strides(dims.size());
  int64_t s = 1;
  for (int i = static_cast<int>(perm.size()) - 1; i >= 0; --i) {
    strides[perm[i]] = s;
    s *= dims[perm[i]];
  }
  return strides;
}

TEST_F(CudaImportedOpsTest, StridedCopyMatchesCpu) {
  std::vector<StridedCopyParams> cases = {
      CopyParams({7, 5}, {1, 7}, {5, 1}),                     // transpose
      CopyParams({6, 3}, {8, 1}, {3, 1}),                     // slice
      CopyParams({3, 4}, {0, 1}, {4, 1}),                     // broadcast a row
      CopyParams({5, 1}, {1, 0}, {1, 1}),                     // size-1 dims
      CopyParams({0, 4}, {4, 1}, {4, 1}),                     // empty
      CopyParams({8, 197, 12, 64}, {151296, 64, 12608, 1}, {151296, 768, 64, 1}),  // attention heads
      CopyParams({4, 96, 7, 7}, {96, 1, 0, 0}, {4704, 49, 7, 1}),                  // [4, 96] over 7x7
  };
  // Random permutations and broadcasts of ranks 1 to 6.
  std::mt19937 gen(53);
  for (int c = 0; c < 12; ++c) {
    const int rank = 1 + c % 6;
    std::vector<int64_t> dims(rank);
    for (int64_t& d : dims) d = 1 + gen() % 6;
    std::vector<int> src_perm(rank), dst_perm(rank);
    for (int k = 0; k < rank; ++k) src_perm[k] = dst_perm[k] = k;
    std::shuffle(src_perm.begin(), src_perm.end(), gen);
    std::shuffle(dst_perm.begin(), dst_perm.end(), gen);
    std::vector<int64_t> src = PermutedStrides(dims, src_perm), dst = PermutedStrides(dims, dst_perm);
    for (int64_t& s : src) {
      if (gen() % 4 == 0) s = 0;  // broadcast along this dim
    }
    cases.push_back(CopyParams(dims, src, dst));
  }
  for (const StridedCopyParams& p : cases) {
    SCOPED_TRACE(Describe(p));
    const int64_t offset = 3;  // both views start inside their buffers
    Both src = Upload(Random(p.src_span() + offset, 54));
    for (bool accumulate : {false, true}) {
      Both dst = Upload(Random(p.dst_span() + offset, 55));
      ASSERT_TRUE(cpu_->StridedCopy(p, src.cpu + offset, dst.cpu + offset, accumulate).ok());
      ASSERT_TRUE(gpu_->StridedCopy(p, src.gpu + offset, dst.gpu + offset, accumulate).ok());
      EXPECT_EQ(Gpu(dst), Cpu(dst)) << "accumulate " << accumulate;
    }
  }
  Both a = Zeros(16), b = Zeros(16);
  const absl::Status twice = gpu_->StridedCopy(CopyParams({4, 4}, {4, 1}, {1, 1}), a.gpu, b.gpu, false);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument) << twice;
  EXPECT_NE(twice.message().find("StridedCopy"), std::string::npos) << twice;
  EXPECT_EQ(gpu_->StridedCopy(CopyParams({4}, {-1}, {1}), a.gpu, b.gpu, false).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaImportedOpsTest, ReduceMatchesCpu) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {4, 49, 96},  // ViT-style mean over tokens: reduce in the middle
      {6, 768, 1},  // over the last axis: a warp per output
      {1, 1000, 1}, {64, 1, 5}, {3, 17, 1}, {1, 5, 300}, {2, 3000, 3},
  };
  for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean, ReduceKind::kMax}) {
    for (const auto& [outer, reduce, inner] : shapes) {
      const ReduceParams p{kind, outer, reduce, inner};
      SCOPED_TRACE(Describe(p));
      auto cpu_op = cpu_->MakeReduce(p);
      auto gpu_op = gpu_->MakeReduce(p);
      ASSERT_TRUE(cpu_op.ok()) << cpu_op.status();
      ASSERT_TRUE(gpu_op.ok()) << gpu_op.status();
      const int64_t nx = outer * reduce * inner, ny = outer * inner;
      Both x = Upload(Random(nx, 56, -2.0f, 2.0f)), dy = Upload(Random(ny, 57)), y = Zeros(ny);
      Both dx = Upload(Random(nx, 58));  // overwritten
      ASSERT_TRUE((*cpu_op)->Forward(x.cpu, y.cpu).ok());
      ASSERT_TRUE((*gpu_op)->Forward(x.gpu, y.gpu).ok());
      // Float sums in different orders: the absolute error grows with the terms summed.
      EXPECT_TRUE(Same(y, 1e-4f, 1e-5f + 1e-6f * static_cast<float>(reduce))) << "y";
      ASSERT_TRUE((*cpu_op)->Backward(dy.cpu, dx.cpu).ok());
      ASSERT_TRUE((*gpu_op)->Backward(dy.gpu, dx.gpu).ok());
      EXPECT_TRUE(Same(dx, 1e-6f, 0.0f)) << "dx";
    }
  }
  EXPECT_EQ(gpu_->MakeReduce({ReduceKind::kSum, 0, 3, 4}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaImportedOpsTest, SoftmaxAndLogSoftmaxMatchCpu) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {96, 197, 1},  // attention rows
      {4, 10, 49},   // along a middle axis
      {2, 1000, 1}, {1, 3, 7}, {5, 1, 1}, {3, 40, 2},
  };
  for (bool log : {false, true}) {
    for (const auto& [outer, n, inner] : shapes) {
      const SoftmaxParams p{outer, n, inner, log};
      SCOPED_TRACE(Describe(p));
      auto cpu_op = cpu_->MakeSoftmax(p);
      auto gpu_op = gpu_->MakeSoftmax(p);
      ASSERT_TRUE(cpu_op.ok()) << cpu_op.status();
      ASSERT_TRUE(gpu_op.ok()) << gpu_op.status();
      const int64_t size = outer * n * inner;
      Both x = Upload(Random(size, 59, -6.0f, 6.0f)), dy = Upload(Random(size, 60)), y = Zeros(size);
      Both dx = Zeros(size);
      ASSERT_TRUE((*cpu_op)->Forward(x.cpu, y.cpu).ok());
      ASSERT_TRUE((*gpu_op)->Forward(x.gpu, y.gpu).ok());
      EXPECT_TRUE(Same(y, 1e-4f, 1e-6f)) << "y";
      ASSERT_TRUE((*cpu_op)->Backward(y.cpu, dy.cpu, dx.cpu).ok());
      ASSERT_TRUE((*gpu_op)->Backward(y.gpu, dy.gpu, dx.gpu).ok());
      EXPECT_TRUE(Same(dx, 1e-3f, 1e-5f)) << "dx";
      // In place: dx in dy's buffer.
      ASSERT_TRUE((*gpu_op)->Backward(y.gpu, dy.gpu, dy.gpu).ok());
      EXPECT_EQ(Gpu(dy), Gpu(dx)) << "dx aliasing dy";
    }
  }
  EXPECT_EQ(gpu_->MakeSoftmax({2, 0, 1, false}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaImportedOpsTest, LayerNormMatchesCpu) {
  for (const LayerNormParams& p : {LayerNormParams{394, 768, 1e-6f, true}, LayerNormParams{7, 33, 1e-5f, false},
                                   LayerNormParams{1000, 3, 1e-5f, true}, LayerNormParams{2, 2000, 1e-5f, true},
                                   LayerNormParams{5, 1, 1e-5f, false}}) {
    SCOPED_TRACE(Describe(p));
    auto cpu_op = cpu_->MakeLayerNorm(p);
    auto gpu_op = gpu_->MakeLayerNorm(p);
    ASSERT_TRUE(cpu_op.ok()) << cpu_op.status();
    ASSERT_TRUE(gpu_op.ok()) << gpu_op.status();
    const int64_t n = p.rows * p.cols;
    Both x = Upload(Random(n, 61, -2.0f, 3.0f)), dy = Upload(Random(n, 62)), y = Zeros(n);
    Both scale = Upload(Random(p.cols, 63, 0.5f, 1.5f)), bias = Upload(Random(p.cols, 64));
    Both mean = Zeros(p.rows), var = Zeros(p.rows), dx = Zeros(n), dscale = Zeros(p.cols), dbias = Zeros(p.cols);
    const float* b_cpu = p.has_bias ? bias.cpu : nullptr;
    const float* b_gpu = p.has_bias ? bias.gpu : nullptr;
    ASSERT_TRUE((*cpu_op)->Forward(x.cpu, scale.cpu, b_cpu, y.cpu, mean.cpu, var.cpu).ok());
    ASSERT_TRUE((*gpu_op)->Forward(x.gpu, scale.gpu, b_gpu, y.gpu, mean.gpu, var.gpu).ok());
    EXPECT_TRUE(Same(mean, 1e-5f, 1e-6f)) << "mean";
    EXPECT_TRUE(Same(var, 1e-4f, 1e-6f)) << "var";
    EXPECT_TRUE(Same(y)) << "y";
    ASSERT_TRUE((*cpu_op)
                    ->Backward(x.cpu, dy.cpu, scale.cpu, mean.cpu, var.cpu, dx.cpu, dscale.cpu,
                               p.has_bias ? dbias.cpu : nullptr)
                    .ok());
    ASSERT_TRUE((*gpu_op)
                    ->Backward(x.gpu, dy.gpu, scale.gpu, mean.gpu, var.gpu, dx.gpu, dscale.gpu,
                               p.has_bias ? dbias.gpu : nullptr)
                    .ok());
    EXPECT_TRUE(Same(dx)) << "dx";
    EXPECT_TRUE(Same(dscale)) << "dscale";
    if (p.has_bias) {
      EXPECT_TRUE(Same(dbias)) << "dbias";
    }
  }
  EXPECT_EQ(gpu_->MakeLayerNorm({4, 0, 1e-5f, true}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaImportedOpsTest, MatMulMatchesCpu) {
  for (const auto& [batch, m, n, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 17, 9, 33},
                                       {24, 197, 64, 197},  // attention: q k^T and softmax(.) v
                                       {1, 1, 5, 7}, {2, 64, 1, 3}}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        MatMulParams p;
        p.batch = batch;
        p.m = m;
        p.n = n;
        p.k = k;
        p.trans_a = trans_a;
        p.trans_b = trans_b;
        SCOPED_TRACE(Describe(p));
        auto cpu_op = cpu_->MakeMatMul(p);
        auto gpu_op = gpu_->MakeMatMul(p);
        ASSERT_TRUE(cpu_op.ok()) << cpu_op.status();
        ASSERT_TRUE(gpu_op.ok()) << gpu_op.status();
        const int64_t na = batch * m * k, nb = batch * k * n, ny = batch * m * n;
        Both a = Upload(Random(na, 65)), b = Upload(Random(nb, 66)), dy = Upload(Random(ny, 67)), y = Zeros(ny);
        Both da = Zeros(na), db = Zeros(nb);
        ASSERT_TRUE((*cpu_op)->Forward(a.cpu, b.cpu, y.cpu).ok());
        ASSERT_TRUE((*gpu_op)->Forward(a.gpu, b.gpu, y.gpu).ok());
        EXPECT_TRUE(Same(y)) << "y";
        ASSERT_TRUE((*cpu_op)->BackwardA(dy.cpu, b.cpu, da.cpu).ok());
        ASSERT_TRUE((*gpu_op)->BackwardA(dy.gpu, b.gpu, da.gpu).ok());
        EXPECT_TRUE(Same(da)) << "da";
        ASSERT_TRUE((*cpu_op)->BackwardB(a.cpu, dy.cpu, db.cpu).ok());
        ASSERT_TRUE((*gpu_op)->BackwardB(a.gpu, dy.gpu, db.gpu).ok());
        EXPECT_TRUE(Same(db)) << "db";
      }
    }
  }
  MatMulParams bad;
  bad.m = 0;
  bad.n = bad.k = 4;
  const absl::Status s = gpu_->MakeMatMul(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("MakeMatMul"), std::string::npos) << s;
}

// A transformer block's tensor ops, captured after an eager warm-up: the replay on new inputs gives what eager
// execution gives on them, bit for bit (no op allocates or synchronizes after Make*).
TEST_F(CudaImportedOpsTest, CapturedTensorOpsReplayLikeEagerExecution) {
  const int64_t batch = 2, tokens = 10, heads = 2, head_dim = 8, dim = heads * head_dim;
  const int64_t rows = batch * tokens, bh = batch * heads, n = rows * dim, scores = bh * tokens * tokens;
  auto ln = gpu_->MakeLayerNorm({rows, dim, 1e-6f, true});
  MatMulParams qk;
  qk.batch = bh;
  qk.m = qk.n = tokens;
  qk.k = head_dim;
  qk.trans_b = true;
  auto mm = gpu_->MakeMatMul(qk);
  auto sm = gpu_->MakeSoftmax({bh * tokens, tokens, 1, false});
  auto red = gpu_->MakeReduce({ReduceKind::kMax, batch, tokens, dim});
  ASSERT_TRUE(ln.ok() && mm.ok() && sm.ok() && red.ok());
  // [batch, tokens, heads, head_dim] -> [batch, heads, tokens, head_dim].
  const StridedCopyParams split = CopyParams({batch, heads, tokens, head_dim},
                                             {tokens * dim, head_dim, dim, 1},
                                             {heads * tokens * head_dim, tokens * head_dim, head_dim, 1});
  ActivationParams gelu;
  gelu.kind = ActivationParams::Kind::kGelu;
  Both x = Upload(Random(n, 68)), scale = Upload(Random(dim, 69)), bias = Upload(Random(dim, 70));
  Both h = Zeros(n), mean = Zeros(rows), var = Zeros(rows), g = Zeros(n), q = Zeros(n), s = Zeros(scores);
  Both p = Zeros(scores), dp = Upload(Random(scores, 71)), ds = Zeros(scores), dq = Zeros(n), dk = Zeros(n);
  Both pooled = Zeros(batch * dim), dpooled = Upload(Random(batch * dim, 72)), dg = Zeros(n), dh = Zeros(n);
  Both dx = Zeros(n), dscale = Zeros(dim), dbias = Zeros(dim), acc = Zeros(n);
  auto step = [&]() -> absl::Status {
    absl::Status st = (*ln)->Forward(x.gpu, scale.gpu, bias.gpu, h.gpu, mean.gpu, var.gpu);
    if (st.ok()) st = gpu_->Activation(gelu, h.gpu, g.gpu, n);
    if (st.ok()) st = gpu_->StridedCopy(split, g.gpu, q.gpu, false);
    if (st.ok()) st = (*mm)->Forward(q.gpu, q.gpu, s.gpu);
    if (st.ok()) st = (*sm)->Forward(s.gpu, p.gpu);
    if (st.ok()) st = (*sm)->Backward(p.gpu, dp.gpu, ds.gpu);
    if (st.ok()) st = (*mm)->BackwardA(ds.gpu, q.gpu, dq.gpu);
    if (st.ok()) st = (*mm)->BackwardB(q.gpu, ds.gpu, dk.gpu);
    if (st.ok()) st = (*red)->Forward(g.gpu, pooled.gpu);
    if (st.ok()) st = (*red)->Backward(dpooled.gpu, dg.gpu);
    if (st.ok()) st = gpu_->ActivationBackward(gelu, h.gpu, g.gpu, dg.gpu, dh.gpu, n);
    if (st.ok()) st = (*ln)->Backward(x.gpu, dh.gpu, scale.gpu, mean.gpu, var.gpu, dx.gpu, dscale.gpu, dbias.gpu);
    if (st.ok()) st = gpu_->Fill(0.0f, acc.gpu, n);
    if (st.ok()) st = gpu_->StridedCopy(split, dq.gpu, acc.gpu, true);
    return st;
  };
  const std::vector<const Both*> outputs = {&p, &dq, &dk, &pooled, &dx, &dscale, &dbias, &acc};
  auto results = [&]() {
    std::vector<std::vector<float>> r;
    for (const Both* o : outputs) r.push_back(Gpu(*o));
    return r;
  };
  ASSERT_TRUE(step().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  const std::vector<std::vector<float>> first = results();
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  const absl::Status captured = step();
  auto graph = gpu_->EndCapture();
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_TRUE(graph.ok()) << graph.status();
  const std::vector<float> x2 = Random(n, 73);
  ASSERT_TRUE(gpu_->CopyToDevice(x2.data(), x.gpu, n).ok());
  ASSERT_TRUE((*graph)->Launch().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  const std::vector<std::vector<float>> replayed = results();
  ASSERT_TRUE(step().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  const std::vector<std::vector<float>> eager = results();
  for (size_t i = 0; i < outputs.size(); ++i) {
    EXPECT_EQ(replayed[i], eager[i]) << "output " << i;
    EXPECT_NE(replayed[i], first[i]) << "output " << i << " did not change with the inputs";
  }
}

}  // namespace
}  // namespace dtrain::kernels::cuda
