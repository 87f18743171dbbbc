#include "ps/tcp/receive_blocks.h"

#include <cstdint>
#include <cstring>
#include <set>

#include "gtest/gtest.h"

namespace dtrain::ps::tcp {
namespace {

TEST(ReceiveBlocksTest, ABlockStillReferredToIsNeverHandedOutAgain) {
  ReceiveBlocks blocks(int64_t{64} << 20);
  // Upload 1: three pieces, kept (as the ps keeps a step's lent gradients until it is applied).
  blocks.BeginUpload();
  std::vector<ReceiveBlocks::Room> kept;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ReceiveBlocks::Room> r = blocks.Take(1 << 20, "limit");
    ASSERT_TRUE(r.ok()) << r.status();
    std::memset(r->data, i + 1, 1 << 20);
    kept.push_back(*r);
  }
  // Upload 2 while upload 1 is held: its rooms overlap none of upload 1's.
  blocks.BeginUpload();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ReceiveBlocks::Room> r = blocks.Take(1 << 20, "limit");
    ASSERT_TRUE(r.ok());
    for (const auto& k : kept) {
      EXPECT_TRUE(r->data + (1 << 20) <= k.data || k.data + (1 << 20) <= r->data) << "overlaps a held piece";
    }
    std::memset(r->data, 0x55, 1 << 20);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(kept[i].data[12345], i + 1) << "a held piece changed";
  // Once upload 1 is let go, steady state: each upload's pieces come from one block, and at most two blocks
  // exist (the one being filled, the one whose step waits).
  kept.clear();
  for (int round = 0; round < 6; ++round) {
    blocks.BeginUpload();
    std::vector<ReceiveBlocks::Room> up;
    for (int i = 0; i < 3; ++i) up.push_back(*blocks.Take(1 << 20, "limit"));
    EXPECT_EQ(up[1].data, up[0].data + (1 << 20));
    EXPECT_EQ(up[2].data, up[1].data + (1 << 20));
  }
  EXPECT_LE(blocks.num_blocks(), 2);
  EXPECT_LE(blocks.held_bytes(), int64_t{8} << 20);
}

TEST(ReceiveBlocksTest, TheLimitIsNamedAndKeepsWhatIsHeld) {
  ReceiveBlocks blocks(int64_t{4} << 20);
  blocks.BeginUpload();
  absl::StatusOr<ReceiveBlocks::Room> a = blocks.Take(3 << 20, "--max_receive_bytes");
  ASSERT_TRUE(a.ok());
  absl::StatusOr<ReceiveBlocks::Room> b = blocks.Take(3 << 20, "--max_receive_bytes");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("--max_receive_bytes"), std::string::npos) << b.status();
  EXPECT_LE(blocks.held_bytes(), int64_t{4} << 20);
  // Released, the memory serves the next upload.
  *a = ReceiveBlocks::Room();
  blocks.BeginUpload();
  EXPECT_TRUE(blocks.Take(3 << 20, "--max_receive_bytes").ok());
}

}  // namespace
}  // namespace dtrain::ps::tcp
