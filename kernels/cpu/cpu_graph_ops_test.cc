// The CPU backend's stateless ops of imported graphs and sparse models against the reference loops, with
// central-difference checks of every backward: activations, strided copies, transposes, the BatchNorm
// running-statistics delta, embedding Gather (bags), DLRM interaction and sigmoid cross-entropy.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

class GraphOpsTest : public CpuDeviceTest {
 protected:
  // int32 values in a device buffer of floats (one int32 per float), as the ops read indices and offsets.
  int32_t* UploadInts(const std::vector<int32_t>& v) {
    std::vector<float> bits(v.size());
    std::memcpy(bits.data(), v.data(), v.size() * sizeof(int32_t));
    return reinterpret_cast<int32_t*>(Upload(bits));
  }
};

using Kind = ActivationParams::Kind;

ActivationParams Act(Kind kind) {
  ActivationParams p;
  p.kind = kind;
  if (kind == Kind::kLeakyRelu) p.alpha = 0.2f;
  if (kind == Kind::kClip) p.lo = -0.5f, p.hi = 0.75f;
  if (kind == Kind::kHardSigmoid) p.alpha = 1.0f / 6.0f, p.beta = 0.5f;
  if (kind == Kind::kPow) p.exponent = 2.5f;
  return p;
}

const Kind kKinds[] = {Kind::kLeakyRelu, Kind::kClip,  Kind::kSigmoid, Kind::kTanh, Kind::kHardSigmoid, Kind::kHardSwish,
                       Kind::kGelu,      Kind::kSilu,  Kind::kErf,     Kind::kSqrt, Kind::kPow};

// Where the kind is defined: Sqrt and a fractional Pow only for positive inputs.
bool PositiveOnly(Kind kind) { return kind == Kind::kSqrt || kind == Kind::kPow; }

// The points where the kind's derivative jumps.
std::vector<float> Kinks(const ActivationParams& p) {
  switch (p.kind) {
    case Kind::kLeakyRelu: return {0.0f};
    case Kind::kClip: return {p.lo, p.hi};
    case Kind::kHardSigmoid: return {-p.beta / p.alpha, (1.0f - p.beta) / p.alpha};
    case Kind::kHardSwish: return {-3.0f, 3.0f};
    default: return {};
  }
}

TEST_P(GraphOpsTest, ActivationsMatchReferenceInPlaceToo) {
  for (Kind kind : kKinds) {
    const ActivationParams p = Act(kind);
    for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{200003}}) {
      SCOPED_TRACE(::testing::Message() << ActivationName(kind) << " n=" << n);
      const std::vector<float> x = RandomVector(n, 1, PositiveOnly(kind) ? 0.1f : -4.0f, 4.0f);
      const std::vector<float> dy = RandomVector(n, 2);
      float *dx = Upload(x), *dyy = Zeros(n), *ddy = Upload(dy), *dgx = Upload(RandomVector(n, 3));
      ASSERT_TRUE(dev_->Activation(p, dx, dyy, n).ok());
      ASSERT_TRUE(dev_->ActivationBackward(p, dx, dyy, ddy, dgx, n).ok());
      std::vector<float> y_ref(n), gx_ref(n);
      reference::Activation(p, x.data(), y_ref.data(), n);
      reference::ActivationBackward(p, x.data(), y_ref.data(), dy.data(), gx_ref.data(), n);
      EXPECT_ARRAYS_NEAR(Download(dyy, n), y_ref, 2e-6, 1e-6);
      EXPECT_ARRAYS_NEAR(Download(dgx, n), gx_ref, 1e-5, 2e-6);
      ASSERT_TRUE(dev_->ActivationBackward(p, dx, dyy, ddy, ddy, n).ok());  // dx == dy
      EXPECT_ARRAYS_NEAR(Download(ddy, n), gx_ref, 1e-5, 2e-6);
      ASSERT_TRUE(dev_->Activation(p, dx, dx, n).ok());  // y == x
      EXPECT_ARRAYS_NEAR(Download(dx, n), y_ref, 2e-6, 1e-6);
    }
  }
}

TEST_P(GraphOpsTest, ActivationGradientsByFiniteDifferences) {
  const int64_t n = 300;
  for (Kind kind : kKinds) {
    SCOPED_TRACE(ActivationName(kind));
    const ActivationParams p = Act(kind);
    std::vector<float> x = RandomVector(n, 4, PositiveOnly(kind) ? 0.2f : -4.0f, 4.0f);
    // Keep every coordinate farther than the step from the kinks.
    for (float& v : x) {
      for (float kink : Kinks(p)) {
        if (std::fabs(v - kink) < 0.05f) v = kink + (v >= kink ? 0.05f : -0.05f);
      }
    }
    const std::vector<float> r = RandomVector(n, 5);
    float *dx = Upload(x), *dy = Zeros(n), *dr = Upload(r), *dgx = Zeros(n), *probe = Zeros(n);
    ASSERT_TRUE(dev_->Activation(p, dx, dy, n).ok());
    ASSERT_TRUE(dev_->ActivationBackward(p, dx, dy, dr, dgx, n).ok());
    GradCheckOptions opt;
    opt.step = 1e-2;
    opt.max_coords = 100;
    EXPECT_GRADIENT_OK(CheckGradient(
        x, Download(dgx, n),
        [&](const std::vector<float>& v) {
          Write(v, probe);
          EXPECT_TRUE(dev_->Activation(p, probe, dy, n).ok());
          return Dot(Download(dy, n), r);
        },
        opt));
  }
}

TEST_P(GraphOpsTest, CopyStridedConcatAndSplit) {
  // Two blocks [rows, 3] and [rows, 5] concatenated into [rows, 8], then split back with accumulate.
  for (int64_t rows : {int64_t{7}, int64_t{20001}}) {
    SCOPED_TRACE(rows);
    const std::vector<float> a = RandomVector(rows * 3, 1), b = RandomVector(rows * 5, 2);
    const std::vector<float> base = RandomVector(rows * 8, 3);
    float *da = Upload(a), *db = Upload(b), *dcat = Upload(base);
    ASSERT_TRUE(dev_->CopyStrided(da, 3, dcat, 8, rows, 3, false).ok());
    ASSERT_TRUE(dev_->CopyStrided(db, 5, dcat + 3, 8, rows, 5, false).ok());
    std::vector<float> want = base;
    reference::CopyStrided(a.data(), 3, want.data(), 8, rows, 3, false);
    reference::CopyStrided(b.data(), 5, want.data() + 3, 8, rows, 5, false);
    const std::vector<float> cat = Download(dcat, rows * 8);
    EXPECT_ARRAYS_NEAR(cat, want, 0, 0);
    // The split (Concat's backward) adds into existing gradients.
    const std::vector<float> ga0 = RandomVector(rows * 5, 4);
    float* dga = Upload(ga0);
    ASSERT_TRUE(dev_->CopyStrided(dcat + 3, 8, dga, 5, rows, 5, true).ok());
    std::vector<float> ga_want = ga0;
    reference::CopyStrided(cat.data() + 3, 8, ga_want.data(), 5, rows, 5, true);
    EXPECT_ARRAYS_NEAR(Download(dga, rows * 5), ga_want, 0, 0);
  }
  EXPECT_EQ(dev_->CopyStrided(nullptr, 1, nullptr, 4, 2, 3, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->CopyStrided(nullptr, 3, nullptr, 3, -1, 3, false).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(GraphOpsTest, TransposeMatchesReferenceAndFiniteDifferences) {
  for (auto shape : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {2, 7, 5}, {3, 49, 64}, {2, 33, 300},
                     {64, 40, 30}}) {
    const auto [batch, rows, cols] = shape;
    SCOPED_TRACE(::testing::Message() << batch << "x" << rows << "x" << cols);
    const int64_t n = batch * rows * cols;
    const std::vector<float> x = RandomVector(n, 1), r = RandomVector(n, 2);
    float *dx = Upload(x), *dy = Zeros(n), *dr = Upload(r), *dgx = Upload(RandomVector(n, 3));
    ASSERT_TRUE(dev_->Transpose(dx, dy, batch, rows, cols).ok());
    std::vector<float> y_ref(n);
    reference::Transpose(x.data(), y_ref.data(), batch, rows, cols);
    EXPECT_ARRAYS_NEAR(Download(dy, n), y_ref, 0, 0);
    // The backward of a transpose is the transpose back.
    ASSERT_TRUE(dev_->Transpose(dr, dgx, batch, cols, rows).ok());
    float* probe = Zeros(n);
    EXPECT_GRADIENT_OK(CheckGradient(x, Download(dgx, n), [&](const std::vector<float>& v) {
      Write(v, probe);
      EXPECT_TRUE(dev_->Transpose(probe, dy, std::get<0>(shape), std::get<1>(shape), std::get<2>(shape)).ok());
      return Dot(Download(dy, n), r);
    }));
  }
}

TEST_P(GraphOpsTest, BatchNormRunningDelta) {
  const int C = 9;
  const std::vector<float> rm = RandomVector(C, 1), rv = RandomVector(C, 2, 0.5f, 2.0f);
  const std::vector<float> bm = RandomVector(C, 3), bv = RandomVector(C, 4, 0.5f, 2.0f);
  float *drm = Upload(rm), *drv = Upload(rv), *dbm = Upload(bm), *dbv = Upload(bv);
  for (bool unbiased : {false, true}) {
    SCOPED_TRACE(unbiased);
    float *ddm = Upload(RandomVector(C, 5)), *ddv = Upload(RandomVector(C, 6));
    ASSERT_TRUE(dev_->BatchNormRunningDelta(drm, drv, dbm, dbv, C, 10, 0.1f, unbiased, ddm, ddv).ok());
    std::vector<float> dm_ref(C), dv_ref(C);
    reference::BatchNormRunningDelta(rm.data(), rv.data(), bm.data(), bv.data(), C, 10, 0.1f, unbiased,
                                     dm_ref.data(), dv_ref.data());
    const std::vector<float> dm = Download(ddm, C), dv = Download(ddv, C);
    EXPECT_ARRAYS_NEAR(dm, dm_ref, 1e-6, 1e-7);
    EXPECT_ARRAYS_NEAR(dv, dv_ref, 1e-6, 1e-7);
    // PyTorch's update: running - d = 0.9 running + 0.1 batch (variance unbiased by 10 / 9).
    for (int c = 0; c < C; ++c) {
      EXPECT_NEAR(rm[c] - dm[c], 0.9 * rm[c] + 0.1 * bm[c], 1e-6);
      EXPECT_NEAR(rv[c] - dv[c], 0.9 * rv[c] + 0.1 * bv[c] * (unbiased ? 10.0 / 9.0 : 1.0), 1e-6);
    }
  }
  // The unbiased variance of one element per channel is undefined.
  EXPECT_EQ(dev_->BatchNormRunningDelta(drm, drv, dbm, dbv, C, 1, 0.1f, true, drm, drv).code(),
            absl::StatusCode::kInvalidArgument);
}

struct GatherCase {
  std::string name;
  GatherParams p;
  std::vector<int32_t> indices, offsets;
};

GatherParams G(int64_t rows, int dim, int64_t count, int64_t num_bags = 0, bool mean = false) {
  GatherParams p;
  p.rows = rows, p.dim = dim, p.count = count, p.num_bags = num_bags, p.mean = mean;
  return p;
}

// Indices with repeats (so that the backward's rows collide), count of them in [0, rows).
std::vector<int32_t> Indices(int64_t count, int64_t rows, uint64_t seed) {
  std::vector<int32_t> v(count);
  std::mt19937_64 gen(seed);
  for (int32_t& i : v) i = static_cast<int32_t>(gen() % rows);
  if (count > 2) v[count - 1] = v[0];
  return v;
}

TEST_P(GraphOpsTest, GatherAndBagsMatchReferenceAndFiniteDifferences) {
  const std::vector<GatherCase> cases = {
      {"plain", G(10, 4, 7), Indices(7, 10, 1), {}},
      {"plain_large", G(1000, 64, 3000), Indices(3000, 1000, 2), {}},
      {"bags_sum_with_empty", G(12, 5, 9, 4), Indices(9, 12, 3), {0, 3, 3, 8, 9}},
      {"bags_mean_with_empty", G(12, 5, 9, 5, true), Indices(9, 12, 4), {0, 0, 2, 6, 6, 9}},
      {"bags_mean_large", G(500, 48, 4000, 1000, true), Indices(4000, 500, 5), {}},
      {"no_lookups", G(5, 3, 0, 2), {}, {0, 0, 0}},
  };
  for (GatherCase c : cases) {
    SCOPED_TRACE(c.name);
    const GatherParams& p = c.p;
    if (p.num_bags > 0 && c.offsets.empty()) {  // bags of 0 to 7 lookups, summing to count
      c.offsets.push_back(0);
      for (int64_t b = 1; b < p.num_bags; ++b) c.offsets.push_back(static_cast<int32_t>(p.count * b / p.num_bags));
      c.offsets.push_back(static_cast<int32_t>(p.count));
    }
    const int64_t out_rows = p.num_bags > 0 ? p.num_bags : p.count;
    const int64_t ny = out_rows * p.dim, nt = p.rows * p.dim;
    const std::vector<float> table = RandomVector(nt, 1), r = RandomVector(ny, 2), g0 = RandomVector(nt, 3);
    float *dtable = Upload(table), *dy = Upload(RandomVector(std::max<int64_t>(ny, 1), 4)), *dr = Upload(r);
    float* dg = Upload(g0);
    int32_t *didx = UploadInts(c.indices.empty() ? std::vector<int32_t>{0} : c.indices),
            *doff = p.num_bags > 0 ? UploadInts(c.offsets) : nullptr;
    ASSERT_TRUE(dev_->Gather(p, dtable, didx, doff, dy).ok());
    ASSERT_TRUE(dev_->GatherBackward(p, dr, didx, doff, dg).ok());
    std::vector<float> y_ref(ny), g_ref = g0;
    reference::Gather(p, table.data(), c.indices.data(), c.offsets.data(), y_ref.data());
    reference::GatherBackward(p, r.data(), c.indices.data(), c.offsets.data(), g_ref.data());
    EXPECT_ARRAYS_NEAR(Download(dy, ny), y_ref, 1e-6, 1e-6);
    // GatherBackward adds into dtable (g0 is not cleared).
    EXPECT_ARRAYS_NEAR(Download(dg, nt), g_ref, 1e-5, 1e-5);
    if (ny == 0) continue;

    float* dzero = Zeros(nt);
    ASSERT_TRUE(dev_->GatherBackward(p, dr, didx, doff, dzero).ok());
    float* probe = Zeros(nt);
    EXPECT_GRADIENT_OK(CheckGradient(table, Download(dzero, nt), [&](const std::vector<float>& v) {
      Write(v, probe);
      EXPECT_TRUE(dev_->Gather(p, probe, didx, doff, dy).ok());
      return Dot(Download(dy, ny), r);
    }));
  }
}

TEST_P(GraphOpsTest, GatherRejectsBadIndicesAndOffsets) {
  float *table = Zeros(12), *y = Zeros(12);
  const GatherParams p = G(4, 3, 3);
  int32_t* bad = UploadInts({0, 4, 1});
  absl::Status s = dev_->Gather(p, table, bad, nullptr, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "Gather: index 4 of lookup 1 is not a row in [0, 4)");
  EXPECT_EQ(dev_->GatherBackward(p, y, UploadInts({0, -1, 1}), nullptr, table).code(),
            absl::StatusCode::kInvalidArgument);
  int32_t* ok = UploadInts({0, 1, 2});
  EXPECT_EQ(dev_->Gather(G(4, 3, 3, 2), table, ok, UploadInts({0, 2, 2}), y).code(),
            absl::StatusCode::kInvalidArgument);  // the last offset must be the count
  EXPECT_EQ(dev_->Gather(G(4, 3, 3, 2), table, ok, UploadInts({0, 3, 2}), y).code(),
            absl::StatusCode::kInvalidArgument);  // decreasing
  EXPECT_EQ(dev_->Gather(G(4, 0, 3), table, ok, nullptr, y).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(GraphOpsTest, InteractionMatchesReferenceAndFiniteDifferences) {
  for (InteractionParams p : {InteractionParams{1, 2, 1}, InteractionParams{3, 5, 4}, InteractionParams{4, 27, 16},
                              InteractionParams{64, 9, 33}}) {
    SCOPED_TRACE(::testing::Message() << p.batch << "x" << p.features << "x" << p.dim);
    const int64_t nx = int64_t{p.batch} * p.features * p.dim, ny = p.batch * p.outputs();
    const std::vector<float> x = RandomVector(nx, 1), r = RandomVector(ny, 2);
    float *dx = Upload(x), *dy = Zeros(ny), *dr = Upload(r), *dgx = Upload(RandomVector(nx, 3));
    ASSERT_TRUE(dev_->Interaction(p, dx, dy).ok());
    ASSERT_TRUE(dev_->InteractionBackward(p, dx, dr, dgx).ok());
    std::vector<float> y_ref(ny), gx_ref(nx);
    reference::Interaction(p, x.data(), y_ref.data());
    reference::InteractionBackward(p, x.data(), r.data(), gx_ref.data());
    const std::vector<float> gx = Download(dgx, nx);
    EXPECT_ARRAYS_NEAR(Download(dy, ny), y_ref, 1e-5, 1e-5);
    EXPECT_ARRAYS_NEAR(gx, gx_ref, 1e-4, 1e-5);
    float* probe = Zeros(nx);
    EXPECT_GRADIENT_OK(CheckGradient(x, gx, [&](const std::vector<float>& v) {
      Write(v, probe);
      EXPECT_TRUE(dev_->Interaction(p, probe, dy).ok());
      return Dot(Download(dy, ny), r);
    }));
  }
  // Order: z1.z0, z2.z0, z2.z1.
  const InteractionParams p{1, 3, 2};
  float *dx = Upload({1, 2, 3, 4, 5, 6}), *dy = Zeros(3);
  ASSERT_TRUE(dev_->Interaction(p, dx, dy).ok());
  EXPECT_EQ(Download(dy, 3), (std::vector<float>{11, 17, 39}));
}

TEST_P(GraphOpsTest, SigmoidCrossEntropyMatchesReferenceAndFiniteDifferences) {
  for (int batch : {1, 7, 100003}) {
    SCOPED_TRACE(batch);
    std::vector<float> z = RandomVector(batch, 1, -6.0f, 6.0f), t(batch);
    if (batch > 1000) z[0] = 120.0f, z[1] = -120.0f;  // the loss must stay finite (no exp overflow)
    std::mt19937_64 gen(2);
    for (float& v : t) v = static_cast<float>(gen() % 2);
    float *dz = Upload(z), *dt = Upload(t), *dg = Upload(RandomVector(batch, 3)), *dloss = Zeros(1);
    ASSERT_TRUE(dev_->SigmoidCrossEntropy(dz, dt, batch, dg, dloss).ok());
    std::vector<float> g_ref(batch);
    const double loss_ref = reference::SigmoidCrossEntropy(z.data(), t.data(), batch, g_ref.data());
    const float loss = Download(dloss, 1)[0];
    EXPECT_NEAR(loss, loss_ref, 1e-5 * std::max(1.0, std::fabs(loss_ref)));
    const std::vector<float> g = Download(dg, batch);
    EXPECT_ARRAYS_NEAR(g, g_ref, 1e-5, 1e-9);
    if (batch > 1000) continue;
    float *probe = Zeros(batch), *scratch = Zeros(batch);
    // The loss comes back as a float: its rounding (~1e-7) over the step bounds the absolute error.
    GradCheckOptions opt;
    opt.abs_tol = 3e-5;
    EXPECT_GRADIENT_OK(CheckGradient(
        z, g,
        [&](const std::vector<float>& v) {
          Write(v, probe);
          EXPECT_TRUE(dev_->SigmoidCrossEntropy(probe, dt, batch, scratch, dloss).ok());
          return static_cast<double>(Download(dloss, 1)[0]);
        },
        opt));
  }
}

TEST_P(GraphOpsTest, SigmoidCrossEntropyRejectsLabelsOtherThanZeroOrOne) {
  float *dz = Zeros(3), *dt = Upload({1, 0.5f, 0}), *dg = Zeros(3), *dloss = Zeros(1);
  absl::Status s = dev_->SigmoidCrossEntropy(dz, dt, 3, dg, dloss);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "SigmoidCrossEntropy: label 0.5 of row 1 is not 0 or 1");
  EXPECT_EQ(dev_->SigmoidCrossEntropy(dz, Upload({0, 1, 2}), 3, dg, dloss).message(),
            "SigmoidCrossEntropy: label 2 of row 2 is not 0 or 1");
  EXPECT_EQ(dev_->SigmoidCrossEntropy(dz, dt, 0, dg, dloss).code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, GraphOpsTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
