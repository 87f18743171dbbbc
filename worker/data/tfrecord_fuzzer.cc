// libFuzzer harness for the TFRecord reader and the tf.train.Example codec (ParseTfRecordExamples,
// DecodeImageExample, DecodeCtrExample). Beyond "no crash, no sanitizer report", a data set that parses must be
// consistent, and a decoded example must survive re-encoding.
//
// Input: a first byte; even: the rest is a TFRecord file; odd: the rest is one serialized tf.train.Example
// (decoded as an image example and as a CTR example).
// Seeds: dtrain_fuzz_seeds (fuzz/make_seeds.cc).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "worker/data/ctr_dataset.h"
#include "worker/data/dataset.h"
#include "worker/data/example_proto.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain::data;  // NOLINT
  if (size < 1) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 1) {
    CtrExample ctr, ctr_again;
    if (absl::Status s = DecodeCtrExample(rest, &ctr); s.ok()) {
      CHECK(ctr.label == 0 || ctr.label == 1) << ctr.label;
      const absl::Status again = DecodeCtrExample(EncodeCtrExample(ctr), &ctr_again);
      CHECK(again.ok()) << again;
      CHECK_EQ(ctr_again.label, ctr.label);
      CHECK_EQ(ctr_again.dense.size(), ctr.dense.size());  // NaN payloads survive, but NaN != NaN
      CHECK(ctr_again.ids == ctr.ids);
      CHECK(ctr_again.id_offsets == ctr.id_offsets);
    } else {
      CHECK(absl::IsInvalidArgument(s)) << s;
    }
    absl::StatusOr<ImageExample> e = DecodeImageExample(rest);
    if (!e.ok()) {
      CHECK(absl::IsInvalidArgument(e.status())) << e.status();
      return 0;
    }
    CHECK_GE(e->label, 0);
    absl::StatusOr<ImageExample> again = DecodeImageExample(EncodeImageExample(*e));
    CHECK(again.ok()) << again.status();
    CHECK(again->image_raw == e->image_raw);
    CHECK_EQ(again->label, e->label);
    for (auto [a, b] : {std::pair{again->height, e->height},
                        {again->width, e->width},
                        {again->depth, e->depth},
                        {again->pixels, e->pixels}}) {
      // Encode writes only the features that are set (>= 0); a negative one reads back as absent (-1).
      CHECK_EQ(a, b < 0 ? -1 : b);
    }
    return 0;
  }
  absl::StatusOr<Dataset> d = ParseTfRecordExamples(rest);
  if (!d.ok()) {
    CHECK(!d.status().message().empty());
    return 0;
  }
  if (d->kind() == DataKind::kCtr) {
    CHECK_GT(d->count(), 0);
    const absl::Status consistent = CheckCtrDataset(*d);
    CHECK(consistent.ok()) << consistent;
    return 0;
  }
  CHECK(d->height > 0 && d->width > 0 && d->channels > 0);
  CHECK_GT(d->count(), 0);
  CHECK_EQ(static_cast<int64_t>(d->pixels.size()), d->count() * d->image_size());
  for (int32_t label : d->labels) CHECK(label >= 0 && label < d->num_classes) << label;
  return 0;
}
