// The CUDA backend's ops of imported graphs and sparse models against the CPU backend (the oracle): average
// pooling, batch normalization, broadcasting binary ops, activations, strided copies, transposes, the BatchNorm
// running-statistics delta, embedding lookups, DLRM interaction and sigmoid cross-entropy, forward and backward,
// several shapes each; their device-data errors; and one step of all of them captured in a CUDA graph and
// replayed. Every test skips without a usable CUDA device (the binary then exits 77).
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

}  // namespace
}  // namespace dtrain::kernels::cuda
