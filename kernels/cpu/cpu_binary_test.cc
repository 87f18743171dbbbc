#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

class BinaryTest : public CpuDeviceTest {};

BroadcastParams Bcast(std::vector<int64_t> dims, std::vector<int64_t> a_strides, std::vector<int64_t> b_strides) {
  BroadcastParams p;
  p.rank = static_cast<int>(dims.size());
  for (int d = 0; d < p.rank; ++d) {
    p.dims[d] = dims[d], p.a_strides[d] = a_strides[d], p.b_strides[d] = b_strides[d];
  }
  return p;
}

struct BinaryCase {
  std::string name;
  BroadcastParams p;
};

// Sizes below and above the parallel threshold (65536 outputs), each input broadcast in turn.
const std::vector<BinaryCase>& Cases() {
  static const auto* cases = new std::vector<BinaryCase>{
      {"same_shape_small", Bcast({37}, {1}, {1})},
      {"same_shape_large", Bcast({200003}, {1}, {1})},
      {"same_shape_nhwc", Bcast({2, 5, 7, 3}, {105, 21, 3, 1}, {105, 21, 3, 1})},
      {"per_channel_bias", Bcast({77, 13}, {13, 1}, {0, 1})},
      {"per_channel_bias_large", Bcast({3000, 33}, {33, 1}, {0, 1})},
      {"per_channel_a", Bcast({6, 5, 9}, {0, 0, 1}, {45, 9, 1})},
      {"scalar_b", Bcast({1001}, {1}, {0})},
      {"scalar_a_large", Bcast({70001}, {0}, {1})},
      {"scalar_both", Bcast({1}, {0}, {0})},
      {"middle_broadcast", Bcast({4, 5, 6}, {30, 6, 1}, {6, 0, 1})},
      {"per_row", Bcast({50, 7}, {7, 1}, {1, 0})},
      {"per_row_large", Bcast({40000, 3}, {3, 1}, {1, 0})},
      {"outer_product", Bcast({9, 11}, {1, 0}, {0, 1})},
      {"batch_broadcast_large", Bcast({2, 300, 128}, {38400, 128, 1}, {0, 128, 1})},
      {"rank5_permuted_a", Bcast({2, 3, 4, 5, 2}, {120, 2, 6, 24, 1}, {0, 1, 0, 3, 0})},
      {"size_one_dims", Bcast({1, 8, 1, 6}, {0, 6, 0, 1}, {0, 0, 0, 1})},
      {"strided_a_with_gaps", Bcast({6, 4}, {10, 2}, {4, 1})},
      {"overlapping_a_view", Bcast({3, 4}, {1, 1}, {4, 1})},
  };
  return *cases;
}

const char* Name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "add";
    case BinaryOp::kSub:
      return "sub";
    case BinaryOp::kMul:
      return "mul";
    case BinaryOp::kDiv:
      return "div";
  }
  return "?";
}

TEST_P(BinaryTest, MatchesReferenceAndFiniteDifferences) {
  for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
    for (const BinaryCase& c : Cases()) {
      SCOPED_TRACE(::testing::Message() << Name(op) << " " << c.name);
      BroadcastParams p = c.p;
      p.op = op;
      const int64_t ny = p.out_size(), na = p.a_size(), nb = p.b_size();
      auto bin = dev_->MakeBinary(p);
      ASSERT_TRUE(bin.ok()) << bin.status();
      const std::vector<float> a = RandomVector(na, 1);
      // Divisors away from zero.
      const std::vector<float> b = op == BinaryOp::kDiv ? RandomVector(nb, 2, 0.5f, 1.5f) : RandomVector(nb, 2);
      const std::vector<float> r = RandomVector(ny, 3);
      float *da = Upload(a), *db = Upload(b), *dy = Zeros(ny), *dr = Upload(r);
      // Gradient buffers start with garbage: overwritten, not accumulated.
      float *dga = Upload(RandomVector(na, 4)), *dgb = Upload(RandomVector(nb, 5));
      ASSERT_TRUE((*bin)->Forward(da, db, dy).ok());
      ASSERT_TRUE((*bin)->Backward(da, db, dr, dga, dgb).ok());

      std::vector<float> y_ref(ny), ga_ref(na), gb_ref(nb);
      reference::BinaryForward(p, a.data(), b.data(), y_ref.data());
      reference::BinaryBackward(p, a.data(), b.data(), r.data(), ga_ref.data(), gb_ref.data());
      const std::vector<float> ga = Download(dga, na), gb = Download(dgb, nb);
      EXPECT_ARRAYS_NEAR(Download(dy, ny), y_ref, 1e-6, 1e-7);
      EXPECT_ARRAYS_NEAR(ga, ga_ref, 1e-4, 1e-4);
      EXPECT_ARRAYS_NEAR(gb, gb_ref, 1e-4, 1e-4);

      auto loss = [&](float* a_dev, float* b_dev) {
        EXPECT_TRUE((*bin)->Forward(a_dev, b_dev, dy).ok());
        return Dot(Download(dy, ny), r);
      };
      float* probe = Zeros(std::max(na, nb));
      GradCheckOptions opt;
      opt.max_coords = 24;
      EXPECT_GRADIENT_OK(CheckGradient(
          a, ga,
          [&](const std::vector<float>& v) {
            Write(v, probe);
            return loss(probe, db);
          },
          opt));
      EXPECT_GRADIENT_OK(CheckGradient(
          b, gb,
          [&](const std::vector<float>& v) {
            Write(v, probe);
            return loss(da, probe);
          },
          opt));
    }
  }
}

TEST_P(BinaryTest, InPlaceAndOneSidedBackward) {
  for (int64_t n : {int64_t{37}, int64_t{100003}}) {
    SCOPED_TRACE(n);
    BroadcastParams p = Bcast({n}, {1}, {1});
    p.op = BinaryOp::kAdd;
    auto add = dev_->MakeBinary(p);
    ASSERT_TRUE(add.ok()) << add.status();
    const std::vector<float> a = RandomVector(n, 1), b = RandomVector(n, 2);
    std::vector<float> want(n);
    reference::BinaryForward(p, a.data(), b.data(), want.data());
    float *da = Upload(a), *db = Upload(b);
    ASSERT_TRUE((*add)->Forward(da, db, da).ok());  // y aliases a (a residual connection's sum in place)
    EXPECT_ARRAYS_NEAR(Download(da, n), want, 0, 0);
    // Add reads neither input in its backward (both may be null), and either gradient may be skipped.
    float* dg = Upload(RandomVector(n, 3));
    ASSERT_TRUE((*add)->Backward(nullptr, nullptr, db, nullptr, dg).ok());
    EXPECT_ARRAYS_NEAR(Download(dg, n), b, 0, 0);
  }
  // A per-channel bias: only db.
  BroadcastParams p = Bcast({5, 3}, {3, 1}, {0, 1});
  p.op = BinaryOp::kAdd;
  auto add = dev_->MakeBinary(p);
  ASSERT_TRUE(add.ok());
  float *dy = Upload(std::vector<float>(15, 1.0f)), *dgb = Upload({7, 7, 7});
  ASSERT_TRUE((*add)->Backward(nullptr, nullptr, dy, nullptr, dgb).ok());
  EXPECT_EQ(Download(dgb, 3), (std::vector<float>{5, 5, 5}));
}

TEST_P(BinaryTest, RejectsBadParams) {
  BroadcastParams p = Bcast({4}, {1}, {1});
  p.rank = 0;
  EXPECT_EQ(dev_->MakeBinary(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.rank = kMaxBroadcastRank + 1;
  EXPECT_EQ(dev_->MakeBinary(p).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeBinary(Bcast({0}, {1}, {1})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeBinary(Bcast({4}, {-1}, {1})).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, BinaryTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
