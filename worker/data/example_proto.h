// Hand-rolled protobuf wire codec for the tf.train.Example shapes the pipelines use (images; click-through-rate
// examples), so the data library needs neither TensorFlow nor generated protos.
//
// The messages (tensorflow/core/example/{example,feature}.proto):
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }          // map entry: key = 1, value = 2
//   Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }   Int64List { repeated int64 value = 1 [packed]; }
//   FloatList { repeated float value = 1 [packed]; }
// The decoders accept packed and unpacked lists and skip unknown fields and features.
//
// Thread-safety: the functions are stateless and thread-safe.
#ifndef DTRAIN_WORKER_DATA_EXAMPLE_PROTO_H_
#define DTRAIN_WORKER_DATA_EXAMPLE_PROTO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain::data {

// The features TensorFlow's MNIST convert_to_records.py writes ("pixels" is our addition, as older
// readers expect it). An absent int64 feature reads as -1.
struct ImageExample {
  std::string image_raw;  // "image_raw": uint8 HWC bytes
  // "image_float": float_list, HWC: examples that are not bytes (float arrays, CSV rows), in place of image_raw.
  std::vector<float> image_float;
  int64_t label = -1;     // "label"
  int64_t height = -1, width = -1, depth = -1;  // "height", "width", "depth"
  int64_t pixels = -1;    // "pixels" = height * width * depth
};

// Serializes an Example holding the features that are set (>= 0; image_float when not empty, else image_raw).
std::string EncodeImageExample(const ImageExample& e);

// Parses a serialized Example. InvalidArgument on malformed wire data or a feature of the wrong kind
// (e.g. "label" as a bytes_list); missing both "image_raw" and "image_float", or "label", is InvalidArgument too.
absl::StatusOr<ImageExample> DecodeImageExample(absl::string_view bytes);

// A click-through-rate example (dataset.h's CTR data), with the features
//   "label":    int64_list or float_list; its first value, 0 or 1
//   "dense":    float_list: the dense features (absent: none)
//   "sparse_0" ... "sparse_{k-1}": int64_list each: the bag of ids of sparse feature i (may be empty)
// Other features are ignored.
struct CtrExample {
  int64_t label = -1;
  std::vector<float> dense;
  std::vector<int64_t> ids;         // the bags one after another
  std::vector<int64_t> id_offsets;  // num_sparse() + 1: bag i is ids[id_offsets[i] .. id_offsets[i + 1])
  int num_sparse() const { return id_offsets.empty() ? 0 : static_cast<int>(id_offsets.size()) - 1; }
};

// Whether a serialized Example holds a CTR example: "dense" or "sparse_0" and no "image_raw" (false for
// malformed bytes, which the image decoder then reports).
bool IsCtrExample(absl::string_view bytes);

// Serializes "label" (int64), "dense" (when there are dense features) and "sparse_i" (packed lists).
std::string EncodeCtrExample(const CtrExample& e);

// Parses a serialized CTR example into *e, reusing its vectors' memory. InvalidArgument on malformed wire data,
// a feature of the wrong kind, no "label" or one other than 0 or 1, a gap in the sparse_i numbers (the message
// names the missing one) or more than kMaxCtrSparseFeatures of them.
inline constexpr int kMaxCtrSparseFeatures = 10000;
absl::Status DecodeCtrExample(absl::string_view bytes, CtrExample* e);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_EXAMPLE_PROTO_H_
