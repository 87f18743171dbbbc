#include "ps/core/gradient_buffers.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

std::unique_ptr<SliceStore> Store() {
  OptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.learning_rate = 0.1f;
  return std::move(SliceStore::Create({{3, "w", 0, 8}, {7, "b", 8, 2}}, sgd, 0.0f).value());
}

// A slice lent in pieces that follow one another in the lender's memory stays lent (no copy); a piece from
// elsewhere copies what was lent before it, and every float is there either way.
TEST(GradientBuffersTest, ASliceLentInContiguousPiecesStaysLent) {
  std::unique_ptr<SliceStore> store = Store();
  GradientBuffers buffers(1, *store);
  std::vector<float> memory = {1, 2, 3, 4, 5, 6, 7, 8};
  auto keep = std::make_shared<int>(0);
  {
    GradientBuffers::Locked b = buffers.Lock(0);
    b->Claim(0, 1);
    ASSERT_TRUE(b->Borrow(0, 0, 3, memory.data(), keep, true, 9).ok());
    EXPECT_EQ(b->received(0), 3);
    EXPECT_FALSE(b->complete(0));
    ASSERT_TRUE(b->Borrow(0, 3, 5, memory.data() + 3, keep, true, 9).ok());
    EXPECT_TRUE(b->complete(0));
    EXPECT_EQ(b->data(0), memory.data());  // lent, not copied
  }
  // The same pieces, the second from other memory: copied, the lent part too.
  std::vector<float> other = {40, 50, 60, 70, 80};
  {
    GradientBuffers::Locked b = buffers.Lock(0);
    b->Claim(1, 2);
    ASSERT_TRUE(b->Borrow(0, 0, 3, memory.data(), keep, true, 10).ok());
    ASSERT_TRUE(b->Borrow(0, 3, 5, other.data(), keep, true, 10).ok());
    EXPECT_TRUE(b->complete(0));
    EXPECT_NE(b->data(0), memory.data());
    EXPECT_EQ(std::vector<float>(b->data(0), b->data(0) + 8), std::vector<float>({1, 2, 3, 40, 50, 60, 70, 80}));
  }
  // Another attempt's continuation is not taken for this one's, and a NaN in a later piece is seen.
  memory[5] = std::numeric_limits<float>::quiet_NaN();
  {
    GradientBuffers::Locked b = buffers.Lock(0);
    b->Claim(2, 3);
    ASSERT_TRUE(b->Borrow(0, 0, 3, memory.data(), keep, true, 11).ok());
    ASSERT_TRUE(b->Borrow(0, 3, 5, memory.data() + 3, keep, true, 12).ok());
    EXPECT_NE(b->data(0), memory.data());
    EXPECT_EQ(b->nonfinite_slice(), "w");
  }
  // A piece out of order is refused, as by Write.
  {
    GradientBuffers::Locked b = buffers.Lock(0);
    b->Claim(3, 4);
    ASSERT_TRUE(b->Borrow(0, 0, 3, memory.data(), keep, true, 13).ok());
    EXPECT_FALSE(b->Borrow(0, 5, 3, memory.data() + 5, keep, true, 13).ok());
  }
}

}  // namespace
}  // namespace dtrain::ps
