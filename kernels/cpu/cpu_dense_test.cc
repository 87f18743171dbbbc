#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

class DenseTest : public CpuDeviceTest {};

TEST_P(DenseTest, MatchesReferenceAndFiniteDifferences) {
  for (const DenseParams& p :
       {DenseParams{3, 7, 5}, DenseParams{4, 33, 17}, DenseParams{50, 64, 10}, DenseParams{1, 16, 1}}) {
    SCOPED_TRACE(::testing::Message() << "batch=" << p.batch << " in=" << p.in << " out=" << p.out);
    const int64_t nx = int64_t{p.batch} * p.in, nw = int64_t{p.in} * p.out, ny = int64_t{p.batch} * p.out;
    auto op = dev_->MakeDense(p);
    ASSERT_TRUE(op.ok()) << op.status();
    const std::vector<float> x = RandomVector(nx, 1), w = RandomVector(nw, 2), b = RandomVector(p.out, 3);
    const std::vector<float> r = RandomVector(ny, 4);
    float *dx = Upload(x), *dw = Upload(w), *db = Upload(b), *dy = Zeros(ny), *dr = Upload(r);
    float *dgx = Upload(RandomVector(nx, 5)), *dgw = Upload(RandomVector(nw, 6)),
          *dgb = Upload(RandomVector(p.out, 7));
    ASSERT_TRUE((*op)->Forward(dx, dw, db, dy).ok());
    ASSERT_TRUE((*op)->BackwardData(dr, dw, dgx).ok());
    ASSERT_TRUE((*op)->BackwardWeights(dx, dr, dgw, dgb).ok());

    std::vector<float> y_ref(ny), gx_ref(nx), gw_ref(nw), gb_ref(p.out);
    reference::DenseForward(p, x.data(), w.data(), b.data(), y_ref.data());
    reference::DenseBackwardData(p, r.data(), w.data(), gx_ref.data());
    reference::DenseBackwardWeights(p, x.data(), r.data(), gw_ref.data(), gb_ref.data());
    const std::vector<float> gx = Download(dgx, nx), gw = Download(dgw, nw), gb = Download(dgb, p.out);
    EXPECT_ARRAYS_NEAR(Download(dy, ny), y_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(gx, gx_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(gw, gw_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(gb, gb_ref, 1e-4, 1e-4);

    auto loss = [&](float* x_dev, float* w_dev, float* b_dev) {
      EXPECT_TRUE((*op)->Forward(x_dev, w_dev, b_dev, dy).ok());
      return Dot(Download(dy, ny), r);
    };
    float* probe = Zeros(std::max({nx, nw, int64_t{p.out}}));
    EXPECT_GRADIENT_OK(CheckGradient(x, gx, [&](const std::vector<float>& v) {
      Write(v, probe);
      return loss(probe, dw, db);
    }));
    EXPECT_GRADIENT_OK(CheckGradient(w, gw, [&](const std::vector<float>& v) {
      Write(v, probe);
      return loss(dx, probe, db);
    }));
    EXPECT_GRADIENT_OK(CheckGradient(b, gb, [&](const std::vector<float>& v) {
      Write(v, probe);
      return loss(dx, dw, probe);
    }));
  }
}

TEST_P(DenseTest, RejectsBadParams) {
  EXPECT_EQ(dev_->MakeDense({0, 3, 4}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeDense({2, 3, -1}).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, DenseTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
