// libFuzzer harness for the MNIST IDX reader (ParseMnistIdx: raw or gzip images and labels files). Beyond "no
// crash, no sanitizer report, no huge allocation", a data set that parses must be consistent.
//
// Input: u32 big-endian length L of the images file (clamped to what there is), its L bytes, then the labels
// file. Seeds: dtrain_fuzz_seeds (fuzz/make_seeds.cc).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "worker/data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t images_len = std::min<size_t>(
      size - 4, (size_t{data[0]} << 24) | (size_t{data[1]} << 16) | (size_t{data[2]} << 8) | size_t{data[3]});
  const absl::string_view images(reinterpret_cast<const char*>(data) + 4, images_len);
  const absl::string_view labels(reinterpret_cast<const char*>(data) + 4 + images_len, size - 4 - images_len);
  absl::StatusOr<dtrain::data::Dataset> d = dtrain::data::ParseMnistIdx(images, labels);
  if (!d.ok()) {
    CHECK(!d.status().message().empty());
    return 0;
  }
  CHECK_EQ(d->channels, 1);
  CHECK(d->height > 0 && d->width > 0);
  CHECK_EQ(static_cast<int64_t>(d->pixels.size()), d->count() * d->image_size());
  for (int32_t label : d->labels) CHECK(label >= 0 && label < d->num_classes) << label;
  return 0;
}
