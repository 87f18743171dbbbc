#include "ps/client/placement.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

std::vector<VariableInfo> MnistCnn() {
  return {{"conv1/weights", 5 * 5 * 1 * 32}, {"conv1/biases", 32},   {"conv2/weights", 5 * 5 * 32 * 64},
          {"conv2/biases", 64},             {"fc1/weights", 3136 * 1024}, {"fc1/biases", 1024},
          {"fc2/weights", 1024 * 10},       {"fc2/biases", 10}};
}

int64_t TotalFloats(const std::vector<VariableInfo>& vars) {
  int64_t total = 0;
  for (const VariableInfo& v : vars) total += v.size;
  return total;
}

// Slices in key order tile [0, total) exactly, each inside its variable, and every slice is on one task.
void ExpectValidPlacement(const Placement& p, const std::vector<VariableInfo>& vars, int num_ps) {
  ASSERT_EQ(p.task_slices.size(), static_cast<size_t>(num_ps));
  ASSERT_EQ(p.task_of_slice.size(), p.slices.size());
  int64_t offset = 0;
  size_t var = 0;
  int64_t var_start = 0;
  for (size_t k = 0; k < p.slices.size(); ++k) {
    const SliceSpec& s = p.slices[k];
    EXPECT_EQ(s.key, k);
    EXPECT_EQ(s.flat_offset, offset) << "gap or overlap before slice " << k;
    EXPECT_GT(s.length, 0);
    while (var < vars.size() && var_start + vars[var].size <= s.flat_offset) var_start += vars[var++].size;
    ASSERT_LT(var, vars.size());
    EXPECT_EQ(s.variable, vars[var].name);
    EXPECT_LE(s.flat_offset + s.length, var_start + vars[var].size) << "slice " << k << " crosses a variable";
    offset += s.length;
  }
  EXPECT_EQ(offset, TotalFloats(vars));
  std::set<uint32_t> seen;
  int64_t bytes_sum = 0;
  for (int t = 0; t < num_ps; ++t) {
    int64_t bytes = 0;
    for (const SliceSpec& s : p.task_slices[t]) {
      EXPECT_TRUE(seen.insert(s.key).second) << "slice " << s.key << " on two tasks";
      EXPECT_EQ(p.task_of_slice[s.key], t);
      EXPECT_EQ(p.slices[s.key], s);
      bytes += s.length * 4;
    }
    EXPECT_TRUE(std::is_sorted(p.task_slices[t].begin(), p.task_slices[t].end(),
                               [](const SliceSpec& a, const SliceSpec& b) { return a.key < b.key; }));
    EXPECT_EQ(bytes, p.task_bytes[t]);
    bytes_sum += bytes;
  }
  EXPECT_EQ(seen.size(), p.slices.size());
  EXPECT_EQ(bytes_sum, TotalFloats(vars) * 4);
}

TEST(PlacementTest, OnePsTaskSplitsNothing) {
  const std::vector<VariableInfo> vars = MnistCnn();
  Placement p = *PlaceVariables(vars, 1);
  ExpectValidPlacement(p, vars, 1);
  EXPECT_EQ(p.slices.size(), vars.size());
  EXPECT_EQ(p.task_slices[0].size(), vars.size());
}

TEST(PlacementTest, MnistCnnOnTwoPsTasksIsBalanced) {
  const std::vector<VariableInfo> vars = MnistCnn();
  Placement p = *PlaceVariables(vars, 2);
  ExpectValidPlacement(p, vars, 2);
  // Only fc1/weights (12.8 MB) is >= 512 KB: it becomes two halves, one per task.
  ASSERT_EQ(p.slices.size(), vars.size() + 1);
  EXPECT_EQ(p.slices[4].variable, "fc1/weights");
  EXPECT_EQ(p.slices[5].variable, "fc1/weights");
  EXPECT_EQ(p.slices[4].length, 3136 * 1024 / 2);
  EXPECT_NE(p.task_of_slice[4], p.task_of_slice[5]);
  const double a = p.task_bytes[0], b = p.task_bytes[1];
  EXPECT_LT(std::abs(a - b) / std::max(a, b), 0.10) << FormatPlacement(p);
}

TEST(PlacementTest, SplitsIntoAtMostNumPsSlicesOfAtLeastMinSize) {
  PlacementOptions options;
  options.min_slice_bytes = 1000;  // 250 floats
  const std::vector<VariableInfo> vars = {{"small", 499}, {"mid", 500}, {"big", 1001}, {"huge", 100000}};
  Placement p = *PlaceVariables(vars, 3, options);
  ExpectValidPlacement(p, vars, 3);
  std::map<std::string, std::vector<int64_t>> lengths;
  for (const SliceSpec& s : p.slices) lengths[s.variable].push_back(s.length);
  EXPECT_EQ(lengths["small"], std::vector<int64_t>({499}));        // < 2 * 250 floats: whole
  EXPECT_EQ(lengths["mid"], std::vector<int64_t>({250, 250}));     // 2000 bytes / 1000 = 2 pieces
  EXPECT_EQ(lengths["big"], std::vector<int64_t>({334, 334, 333}));  // min(3, 4) pieces, remainder first
  EXPECT_EQ(lengths["huge"].size(), 3u);
}

// --channels_per_ps: large variables are cut into up to num_ps x pieces_per_task slices, even on one task.
TEST(PlacementTest, PiecesPerTaskCutLargeVariablesFiner) {
  const std::vector<VariableInfo> vars = MnistCnn();
  PlacementOptions options;
  options.pieces_per_task = 3;
  Placement one = *PlaceVariables(vars, 1, options);
  ExpectValidPlacement(one, vars, 1);
  ASSERT_EQ(one.slices.size(), vars.size() + 2);  // fc1/weights in three
  EXPECT_EQ(one.slices[4].variable, "fc1/weights");
  EXPECT_EQ(one.slices[6].variable, "fc1/weights");
  Placement two = *PlaceVariables(vars, 2, options);
  ExpectValidPlacement(two, vars, 2);
  EXPECT_EQ(two.slices.size(), vars.size() + 5);  // in six, three a task
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(std::count_if(two.task_slices[t].begin(), two.task_slices[t].end(),
                            [](const SliceSpec& s) { return s.variable == "fc1/weights"; }),
              3)
        << FormatPlacement(two);
  }
  for (int bad : {0, 65}) {
    options.pieces_per_task = bad;
    absl::StatusOr<Placement> refused = PlaceVariables(vars, 1, options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find("--channels_per_ps"), std::string::npos) << refused.status();
  }
}

TEST(PlacementTest, GreedyLargestFirstWithLowestTaskOnTies) {
  PlacementOptions options;
  options.min_slice_bytes = 0;  // no splitting: place whole variables
  const std::vector<VariableInfo> vars = {{"a", 10}, {"b", 40}, {"c", 30}, {"d", 20}, {"e", 20}};
  Placement p = *PlaceVariables(vars, 2, options);
  ExpectValidPlacement(p, vars, 2);
  // Order b(40) c(30) d(20, lower key than e) e(20) a(10); loads in floats:
  // b->0 [40,0] (tie: lowest task); c->1 [40,30]; d->1 [40,50]; e->0 [60,50]; a->1 [60,60]
  EXPECT_EQ(p.task_of_slice, std::vector<int>({1, 0, 1, 1, 0}));
  EXPECT_EQ(p.task_bytes, std::vector<int64_t>({240, 240}));
}

TEST(PlacementTest, IsDeterministic) {
  const std::vector<VariableInfo> vars = MnistCnn();
  for (int num_ps : {1, 2, 3, 5}) {
    Placement a = *PlaceVariables(vars, num_ps), b = *PlaceVariables(vars, num_ps);
    ExpectValidPlacement(a, vars, num_ps);
    EXPECT_EQ(a.slices, b.slices);
    EXPECT_EQ(a.task_of_slice, b.task_of_slice);
    EXPECT_EQ(FormatPlacement(a), FormatPlacement(b));
  }
}

TEST(PlacementTest, MorePsTasksThanSlicesLeavesSomeEmpty) {
  const std::vector<VariableInfo> vars = {{"w", 10}, {"b", 2}};
  Placement p = *PlaceVariables(vars, 4);
  ExpectValidPlacement(p, vars, 4);
  EXPECT_EQ(p.task_slices[2].size(), 0u);
  EXPECT_EQ(p.task_bytes[3], 0);
}

TEST(PlacementTest, RejectsBadInput) {
  EXPECT_EQ(PlaceVariables({{"w", 10}}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceVariables({{"w", 0}}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceVariables({{"w", 1}, {"w", 2}}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceVariables({{"", 1}}, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlacementTest, FormatNamesEveryTaskAndVariable) {
  const std::vector<VariableInfo> vars = MnistCnn();
  Placement p = *PlaceVariables(vars, 2);
  const std::string table = FormatPlacement(p);
  for (const VariableInfo& v : vars) EXPECT_NE(table.find(v.name), std::string::npos) << v.name;
  EXPECT_NE(table.find("task 0: "), std::string::npos);
  EXPECT_NE(table.find("task 1: "), std::string::npos);
  EXPECT_NE(table.find("[0, 800)"), std::string::npos) << table;
}

}  // namespace
}  // namespace dtrain::ps
