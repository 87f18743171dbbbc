// libFuzzer harness for the Criteo text reader (ParseCriteo), plain or gzip. A file that parses must give a
// consistent CTR Dataset: labels 0/1, finite non-negative dense values, non-negative ids; one that does not
// must say so with DataLoss.
//
// Input: a first byte choosing the layout (even: the standard 13 + 26; odd: (b >> 1) % 4 integer and
// (b >> 3) % 4 + 1 categorical fields, so that short inputs can parse), then the file's bytes.
// Seeds: fuzz/seeds/criteo_fuzzer/.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "worker/data/criteo.h"
#include "worker/data/ctr_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain::data;  // NOLINT
  if (size < 1) return 0;
  CriteoLayout layout;
  if (data[0] % 2 == 1) layout = CriteoLayout{(data[0] >> 1) % 4, (data[0] >> 3) % 4 + 1};
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<Dataset> d = ParseCriteo(bytes, "fuzz", layout);
  if (!d.ok()) {
    CHECK(absl::IsDataLoss(d.status())) << d.status();
    return 0;
  }
  CHECK_GT(d->count(), 0);
  CHECK_EQ(d->num_dense, layout.num_dense);
  CHECK_EQ(d->num_sparse, layout.num_sparse);
  CHECK(d->id_offsets.empty());
  const absl::Status consistent = CheckCtrDataset(*d);
  CHECK(consistent.ok()) << consistent;
  for (float v : d->dense) CHECK(std::isfinite(v) && v >= 0) << v;
  for (int64_t id : d->ids) CHECK_GE(id, 0);
  return 0;
}
