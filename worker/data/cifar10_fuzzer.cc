// libFuzzer harness for the CIFAR-10 binary reader (ParseCifar10Bin). Input: one batch file. A batch that
// parses must hold whole 32x32x3 images with labels below 10. Seeds: dtrain_fuzz_seeds (fuzz/make_seeds.cc).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "worker/data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<dtrain::data::Dataset> d =
      dtrain::data::ParseCifar10Bin(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!d.ok()) {
    CHECK(absl::IsDataLoss(d.status())) << d.status();
    return 0;
  }
  CHECK(d->height == 32 && d->width == 32 && d->channels == 3);
  CHECK_EQ(static_cast<size_t>(d->count()) * 3073, size);
  CHECK_EQ(static_cast<int64_t>(d->pixels.size()), d->count() * d->image_size());
  for (int32_t label : d->labels) CHECK(label >= 0 && label < 10) << label;
  return 0;
}
