// Hand-rolled protobuf wire codec for the one tf.train.Example shape the image pipelines use, so the data
// library needs neither TensorFlow nor generated protos.
//
// The messages (tensorflow/core/example/{example,feature}.proto):
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }          // map entry: key = 1, value = 2
//   Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }   Int64List { repeated int64 value = 1 [packed]; }
// The decoder accepts packed and unpacked int64 lists and skips unknown fields and features.
//
// Thread-safety: the functions are stateless and thread-safe.
#ifndef DTRAIN_WORKER_DATA_EXAMPLE_PROTO_H_
#define DTRAIN_WORKER_DATA_EXAMPLE_PROTO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

// The features TensorFlow's MNIST convert_to_records.py writes ("pixels" is our addition, as older
// readers expect it). An absent int64 feature reads as -1.
struct ImageExample {
  std::string image_raw;  // "image_raw": uint8 HWC bytes
  int64_t label = -1;     // "label"
  int64_t height = -1, width = -1, depth = -1;  // "height", "width", "depth"
  int64_t pixels = -1;    // "pixels" = height * width * depth
};

// Serializes an Example holding the features that are set (>= 0; image_raw always).
std::string EncodeImageExample(const ImageExample& e);

// Parses a serialized Example. InvalidArgument on malformed wire data or a feature of the wrong kind
// (e.g. "label" as a bytes_list); missing "image_raw" or "label" is InvalidArgument too.
absl::StatusOr<ImageExample> DecodeImageExample(absl::string_view bytes);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_EXAMPLE_PROTO_H_
