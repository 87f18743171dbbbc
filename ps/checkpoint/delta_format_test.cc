// The delta format: a round trip keeps every bit, a damaged file never parses (every byte flipped, every
// truncation), applying a delta removes and sets rows and takes the dense state whole, and deltas that do not
// fit the state are refused by name.
#include "ps/checkpoint/delta_format.h"

#include <algorithm>
#include <map>

#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_test_util.h"

namespace dtrain::ps {
namespace {

using testing::AddTables;
using testing::ExpectSame;
using testing::MakeData;

DeltaData MakeDelta(int64_t prev, int64_t step) {
  DeltaData d;
  d.prev_step = prev;
  d.state = MakeData(2, 1, /*averages=*/true, step);
  AddTables(&d.state, 4);
  d.state.input_positions = {{0, "pos0"}, {3, "pos3"}};
  d.removed = {{11, -22, 33}, {}};
  return d;
}

TEST(DeltaFormatTest, RoundTripKeepsEveryBit) {
  const DeltaData d = MakeDelta(1100, 1200);
  const std::string bytes = SerializeDelta(d);
  absl::StatusOr<DeltaData> back = ParseDelta(bytes, "d");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->prev_step, 1100);
  EXPECT_EQ(back->removed, d.removed);
  ExpectSame(back->state, d.state);
  absl::StatusOr<DeltaHeader> h = ParseDeltaHeader(bytes, "d");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->step, 1200);
  EXPECT_EQ(h->prev_step, 1100);
  // A fresh start's first delta.
  const DeltaData fresh = MakeDelta(-1, 3);
  EXPECT_EQ(ParseDelta(SerializeDelta(fresh), "f")->prev_step, -1);
}

TEST(DeltaFormatTest, DamagedBytesNeverParse) {
  const std::string bytes = SerializeDelta(MakeDelta(10, 20));
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    const absl::Status s = ParseDelta(bad, "d").status();
    ASSERT_FALSE(s.ok()) << "byte " << i;
    ASSERT_TRUE(absl::IsDataLoss(s) || absl::IsFailedPrecondition(s)) << "byte " << i << ": " << s;
  }
  for (size_t n = 0; n < bytes.size(); n += 7) {
    const absl::Status s = ParseDelta(bytes.substr(0, n), "d").status();
    ASSERT_TRUE(absl::IsDataLoss(s)) << n << ": " << s;
  }
  EXPECT_EQ(ParseDelta("DTRNCKPT........................", "x").status().message(), "x: bad magic: not a dtrain delta");
  std::string newer = bytes;
  newer[8] = 2;
  EXPECT_TRUE(absl::IsFailedPrecondition(ParseDelta(newer, "d").status()));
}

TEST(DeltaFormatTest, ApplyRemovesThenSetsRowsAndTakesTheDenseStateWhole) {
  CheckpointData state = MakeData(2, 1, true, 100);
  AddTables(&state, 6);  // ids (i - 3) * 1234567891011 for i in 0..5
  DeltaData d = MakeDelta(100, 130);
  // Table 0: remove two held ids and one never held; set one held id (index 2 of the delta) and new ones.
  const int64_t a = -3 * 1234567891011LL, b = 2 * 1234567891011LL, c = 0;
  d.state.tables[0].ids = {a + 1, c, b + 1, 99};
  d.removed = {{a, b, 424242}, {}};
  d.state.slices[0].values[0] = 123.0f;
  ASSERT_TRUE(ApplyDelta(d, &state).ok());
  EXPECT_EQ(state.global_step, 130);
  EXPECT_EQ(state.slices[0].values[0], 123.0f);
  EXPECT_EQ(state.input_positions, d.state.input_positions);
  std::map<int64_t, std::vector<float>> rows;
  const SparseTableState& t = state.tables[0];
  ASSERT_EQ(t.values.size(), t.ids.size() * 3);
  ASSERT_EQ(t.slots[0].size(), t.ids.size() * 3);
  for (size_t i = 0; i < t.ids.size(); ++i) {
    rows[t.ids[i]] = {t.values[3 * i], t.values[3 * i + 1], t.values[3 * i + 2], t.slots[0][3 * i]};
  }
  EXPECT_EQ(rows.size(), 6u - 2 + 3);  // 6 held, 2 removed, c set again, 3 new
  EXPECT_EQ(rows.count(a), 0u);
  EXPECT_EQ(rows.count(b), 0u);
  const SparseTableState& from = d.state.tables[0];
  EXPECT_TRUE(testing::SameBits(rows[c], {from.values[3], from.values[4], from.values[5], from.slots[0][3]}));
  EXPECT_EQ(rows[99], std::vector<float>({from.values[9], from.values[10], from.values[11], from.slots[0][9]}));
  EXPECT_EQ(rows[1 * 1234567891011LL][3], 0.1f + 4);  // untouched rows keep their values and slots
  // Not twice, not to another task's state, not across a gap.
  EXPECT_TRUE(absl::IsFailedPrecondition(ApplyDelta(d, &state)));
  CheckpointData early = MakeData(2, 1, true, 50);
  AddTables(&early);
  EXPECT_EQ(ApplyDelta(d, &early).message(),
            "delta of step 130 (after step 100) does not apply to the state of step 50: it applies to steps [100, 130)");
  CheckpointData other = MakeData(2, 1, true, 110);
  AddTables(&other);
  other.task_index = 0;
  EXPECT_TRUE(absl::IsFailedPrecondition(ApplyDelta(d, &other)));
}

TEST(DeltaFormatTest, FileNames) {
  EXPECT_EQ(DeltaPath("/c", 12, 1, 3), "/c/model.delta-12.ps1-of-3");
  DeltaFile f;
  ASSERT_TRUE(ParseDeltaFileName("model.delta-12.ps1-of-3", &f));
  EXPECT_EQ(f.step, 12);
  EXPECT_EQ(f.task, 1);
  EXPECT_EQ(f.num_ps, 3);
  for (const char* bad : {"model.ckpt-12.ps1-of-3", "model.delta-12.ps3-of-3", "model.delta-x.ps0-of-1",
                          "model.delta-12.ps0-of-1.tmp.5.1", "model.delta-.ps0-of-1"}) {
    EXPECT_FALSE(ParseDeltaFileName(bad, &f)) << bad;
  }
}

}  // namespace
}  // namespace dtrain::ps
