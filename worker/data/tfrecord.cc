// Dataset <-> TFRecord files of tf.train.Example, as TensorFlow's MNIST convert_to_records.py writes them (CTR
// examples: ctr_dataset.cc).
#include <algorithm>
#include <cmath>
#include <memory>
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
#include "worker/data/array_source.h"
#include "worker/data/example_source.h"
#include "worker/data/record_io.h"
#include "worker/data/source_batch_stream.h"

namespace dtrain::data {
namespace {

// Bounds that keep a hostile example's geometry from overflowing image_size() (h * w * c) or the square root
// below; the largest real image data sets are far inside them.
constexpr int64_t kMaxSide = 1 << 14;
constexpr int64_t kMaxDepth = 1 << 10;
constexpr int64_t kMaxClasses = 1 << 24;

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

// Every record of `reader` as an image example; `path` names the file in errors. Examples of floats
// ("image_float") are kept behind an array source (array_source.h).
absl::StatusOr<Dataset> ReadExamples(TfRecordReader& reader, const std::string& path) {
  Dataset d;
  d.num_classes = 10;
  auto floats = std::make_shared<std::vector<float>>();
  bool are_floats = false;
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
    const bool is_float = !example->image_float.empty();
    if (index == 0) {
      d.height = h;
      d.width = w;
      d.channels = c;
      are_floats = is_float;
    } else if (is_float != are_floats) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "holds ", is_float ? "image_float" : "image_raw",
                                                     " but earlier records hold ", are_floats ? "image_float" : "image_raw"));
    } else if (h != d.height || w != d.width || c != d.channels) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "image is ", h, "x", w, "x", c,
                                                     " but earlier ones are ", d.height, "x", d.width, "x",
                                                     d.channels));
    }
    const int64_t values = is_float ? static_cast<int64_t>(example->image_float.size())
                                    : static_cast<int64_t>(example->image_raw.size());
    if (values != d.image_size()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), is_float ? "image_float has " : "image_raw has ",
                                                     values, is_float ? " values" : " bytes", ", expected ",
                                                     d.image_size()));
    }
    if (example->label >= kMaxClasses) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "label ", example->label, " is not below ", kMaxClasses));
    }
    // At least 10 classes (MNIST's, CIFAR-10's), more when the labels say so.
    d.num_classes = std::max<int>(d.num_classes, static_cast<int>(example->label) + 1);
    d.labels.push_back(static_cast<int32_t>(example->label));
    if (is_float) {
      floats->insert(floats->end(), example->image_float.begin(), example->image_float.end());
    } else {
      d.pixels.insert(d.pixels.end(), example->image_raw.begin(), example->image_raw.end());
    }
  }
  if (d.count() == 0) return absl::DataLossError(absl::StrCat(path, ": holds no records"));
  if (are_floats) {
    NpyArray x, y;
    x.type = NpyType::kF32;
    x.shape = {d.count(), d.height, d.width, d.channels};
    x.data = reinterpret_cast<const char*>(floats->data());
    y.type = NpyType::kI32;
    y.shape = {d.count()};
    y.data = reinterpret_cast<const char*>(d.labels.data());
    const int num_classes = d.num_classes;
    ASSIGN_OR_RETURN(Dataset f, ArrayDataset(x, y, floats, ArrayLayout::kNhwc, path));
    f.num_classes = num_classes;
    d = std::move(f);
  }
  LOG(INFO) << "Read " << d.count() << " " << d.height << "x" << d.width << "x" << d.channels
            << " examples from " << path;
  return d;
}

// A source's examples as the evaluation pass reads them (image folders: resized and centre-cropped), decoded on
// every core: bytes (round(v * 255)) as image_raw, other values as image_float.
absl::Status WriteSourceRecords(const Dataset& data, const std::string& path, BadExamples bad_examples) {
  RETURN_IF_ERROR(CheckSourceDataset(data));
  TfRecordWriter writer;
  RETURN_IF_ERROR(writer.Open(path));
  EvalBatchOptions o;
  o.batch_size = 64;
  o.bad_examples = bad_examples;
  std::unique_ptr<BatchStream> stream = CreateSourceEvalStream(data, o);
  const bool bytes = data.source->bytes();
  ImageExample e;
  e.height = data.height;
  e.width = data.width;
  e.depth = data.channels;
  e.pixels = data.image_size();
  const int64_t size = data.image_size();
  for (int64_t first = 0; first < data.count(); first += o.batch_size) {
    const Batch& b = stream->Next();
    RETURN_IF_ERROR(stream->status());
    for (int i = 0; i < b.batch; ++i) {
      const float* v = b.images.data() + i * size;
      e.label = static_cast<int64_t>(b.labels[i]);
      if (bytes) {
        e.image_raw.resize(size);
        for (int64_t k = 0; k < size; ++k) {
          e.image_raw[k] = static_cast<char>(static_cast<uint8_t>(std::lround(std::clamp(v[k], 0.0f, 1.0f) * 255)));
        }
      } else {
        e.image_float.assign(v, v + size);
      }
      RETURN_IF_ERROR(writer.Write(EncodeImageExample(e)));
    }
  }
  return writer.Close();
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
  return WriteTfRecordExamples(data, path, BadExamples::kSkip);
}

absl::Status WriteTfRecordExamples(const Dataset& data, const std::string& path, BadExamples bad_examples) {
  if (data.kind() == DataKind::kCtr) return WriteCtrRecords(data, path);
  if (data.source != nullptr) return WriteSourceRecords(data, path, bad_examples);
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
