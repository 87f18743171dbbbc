// libFuzzer harness for the checkpoint reader (ParseCheckpoint; in the fuzzing build it accepts wrong CRCs,
// see common/crc32c.h, so the fields behind them are reached as a hostile file with valid CRCs would reach
// them) and for what dtrain_eval does with a parsed file (AssembleFlatBuffer, ReadSparseTables,
// AssembleFixedTable). A file that parses must
// re-encode to a file that parses to the same data. Input: one checkpoint file. Seeds: dtrain_fuzz_seeds.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "ps/checkpoint/checkpoint_format.h"
#include "ps/checkpoint/checkpoint_set.h"

namespace {

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp of an empty vector's data() (maybe null) would be undefined even with length 0.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain::ps;  // NOLINT
  absl::StatusOr<CheckpointData> d =
      ParseCheckpoint(absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!d.ok()) {
    CHECK(absl::IsDataLoss(d.status()) || absl::IsFailedPrecondition(d.status())) << d.status();
    return 0;
  }
  absl::StatusOr<CheckpointData> again = ParseCheckpoint(SerializeCheckpoint(*d), "again");
  CHECK(again.ok()) << again.status();
  CHECK_EQ(again->global_step, d->global_step);
  CHECK_EQ(again->slices.size(), d->slices.size());
  for (size_t i = 0; i < d->slices.size(); ++i) {
    CHECK(again->slices[i].spec == d->slices[i].spec);
    CHECK(SameBits(again->slices[i].values, d->slices[i].values));
    CHECK(SameBits(again->slices[i].moving_average, d->slices[i].moving_average));
  }
  CHECK_EQ(again->tables.size(), d->tables.size());
  for (size_t t = 0; t < d->tables.size(); ++t) {
    CHECK(again->tables[t].spec == d->tables[t].spec);
    CHECK(again->tables[t].ids == d->tables[t].ids);
    CHECK(SameBits(again->tables[t].values, d->tables[t].values));
  }
  // The tables as dtrain_eval reads them: a clean answer, never a crash, whatever ids the file holds.
  absl::StatusOr<std::vector<SparseTableRows>> tables = ReadSparseTables({*d});
  if (tables.ok()) {
    for (const SparseTableRows& t : *tables) {
      if (t.spec.rows > 0 && t.spec.dim > 0 && t.spec.rows <= (int64_t{1} << 14) / t.spec.dim) {
        absl::StatusOr<std::vector<float>> dense = AssembleFixedTable(t);
        if (dense.ok()) CHECK_EQ(static_cast<int64_t>(dense->size()), t.spec.rows * t.spec.dim);
      }
    }
  }
  // Reassembling the model as dtrain_eval does, for a model of about the slices' extent (at most 16K floats):
  // a clean answer, never a crash, whatever offsets the file claims.
  int64_t extent = 0;
  for (const SliceState& s : d->slices) extent = std::max(extent, s.spec.flat_offset);
  const int64_t total = std::min<int64_t>(extent, int64_t{1} << 14) + 8;
  for (bool averages : {false, true}) {
    absl::StatusOr<std::vector<float>> flat = AssembleFlatBuffer({*d}, total, averages);
    if (flat.ok()) CHECK_EQ(static_cast<int64_t>(flat->size()), total);
  }
  return 0;
}
