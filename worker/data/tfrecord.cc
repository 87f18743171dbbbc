// Dataset <-> TFRecord files of tf.train.Example, as TensorFlow's MNIST convert_to_records.py writes them (CTR
// examples: ctr_dataset.cc).
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/ctr_dataset.h"
#include "worker/data/dataset.h"
#include "worker/data/example_proto.h"
#include "worker/data/record_io.h"

namespace dtrain::data {
namespace {

// Bounds that keep a hostile example's geometry from overflowing image_size() (h * w * c) or the square root
// below; the largest real image data sets are far inside them.
constexpr int64_t kMaxSide = 1 << 14;
constexpr int64_t kMaxDepth = 1 << 10;

// Geometry of one example: explicit height/width/depth if present, else "pixels" (or the byte count)
// read as a square single-channel image, which is what the oldest MNIST converters wrote.
absl::Status ExampleGeometry(const ImageExample& e, int* h, int* w, int* c) {
  if (e.height > 0 && e.width > 0 && e.depth > 0) {
    if (e.height > kMaxSide || e.width > kMaxSide || e.depth > kMaxDepth) {
      return absl::InvalidArgumentError(absl::StrCat("implausible image size ", e.height, "x", e.width, "x",
                                                     e.depth, " (at most ", kMaxSide, "x", kMaxSide, "x",
                                                     kMaxDepth, ")"));
    }
    *h = static_cast<int>(e.height);
    *w = static_cast<int>(e.width);
    *c = static_cast<int>(e.depth);
    return absl::OkStatus();
  }
  const int64_t pixels = e.pixels > 0 ? e.pixels : static_cast<int64_t>(e.image_raw.size());
  if (pixels > kMaxSide * kMaxSide) {
    return absl::InvalidArgumentError(absl::StrCat("implausible image size: ", pixels, " pixels (at most ",
                                                   kMaxSide, "x", kMaxSide, ")"));
  }
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(pixels))));
  if (side <= 0 || side * side != pixels) {
    return absl::InvalidArgumentError(absl::StrCat("no height/width/depth features and ", pixels,
                                                   " pixels is not a square image"));
  }
  *h = *w = static_cast<int>(side);
  *c = 1;
  return absl::OkStatus();
}

// Every record of `reader` as an image example; `path` names the file in errors.
absl::StatusOr<Dataset> ReadExamples(TfRecordReader& reader, const std::string& path) {
  Dataset d;
  d.num_classes = 10;
  std::string record;
  for (int64_t index = 0;; ++index) {
    const int64_t offset = reader.offset();
    ASSIGN_OR_RETURN(bool got, reader.Read(&record));
    if (!got) break;
    if (index == 0 && IsCtrExample(record)) return ReadCtrRecords(reader, record, path);
    auto where = [&] { return absl::StrCat(path, ": record ", index, " at byte offset ", offset, ": "); };
    auto example = DecodeImageExample(record);
    if (!example.ok()) return absl::DataLossError(absl::StrCat(where(), example.status().message()));
    int h = 0, w = 0, c = 0;
    if (absl::Status s = ExampleGeometry(*example, &h, &w, &c); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), s.message()));
    }
    if (index == 0) {
      d.height = h;
      d.width = w;
      d.channels = c;
    } else if (h != d.height || w != d.width || c != d.channels) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "image is ", h, "x", w, "x", c,
                                                     " but earlier ones are ", d.height, "x", d.width, "x",
                                                     d.channels));
    }
    if (static_cast<int64_t>(example->image_raw.size()) != d.image_size()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "image_raw has ", example->image_raw.size(),
                                                     " bytes, expected ", d.image_size()));
    }
    if (example->label >= d.num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "label ", example->label, " is not below num_classes=", d.num_classes));
    }
    d.labels.push_back(static_cast<int32_t>(example->label));
    d.pixels.insert(d.pixels.end(), example->image_raw.begin(), example->image_raw.end());
  }
  if (d.count() == 0) return absl::DataLossError(absl::StrCat(path, ": holds no records"));
  LOG(INFO) << "Read " << d.count() << " " << d.height << "x" << d.width << "x" << d.channels
            << " examples from " << path;
  return d;
}

}  // namespace

absl::StatusOr<Dataset> ReadTfRecordExamples(const std::string& path) {
  TfRecordReader reader;
  RETURN_IF_ERROR(reader.Open(path));
  return ReadExamples(reader, path);
}

absl::StatusOr<Dataset> ParseTfRecordExamples(absl::string_view bytes, const std::string& name) {
  TfRecordReader reader;
  reader.OpenBytes(bytes, name);
  return ReadExamples(reader, name);
}

absl::Status WriteTfRecordExamples(const Dataset& data, const std::string& path) {
  if (data.kind() == DataKind::kCtr) return WriteCtrRecords(data, path);
  if (static_cast<int64_t>(data.pixels.size()) != data.count() * data.image_size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteTfRecordExamples(", path, "): ", data.pixels.size(),
                                                   " pixel bytes for ", data.count(), " images of ",
                                                   data.image_size(), " bytes"));
  }
  TfRecordWriter writer;
  RETURN_IF_ERROR(writer.Open(path));
  ImageExample e;
  e.height = data.height;
  e.width = data.width;
  e.depth = data.channels;
  e.pixels = data.image_size();
  const size_t image_size = static_cast<size_t>(data.image_size());
  for (int64_t i = 0; i < data.count(); ++i) {
    e.label = data.labels[i];
    e.image_raw.assign(reinterpret_cast<const char*>(data.pixels.data()) + i * image_size, image_size);
    RETURN_IF_ERROR(writer.Write(EncodeImageExample(e)));
  }
  return writer.Close();
}

}  // namespace dtrain::data
