// Data sets and input pipelines for the workers.
//
// A Dataset is an in-memory set of examples (uint8 pixels, HWC, plus int labels; or the dense and sparse
// features of click-through-rate data) read from files, or the labels of examples read as they are needed (an
// ExampleSource: image folders decoded per read, memory-mapped NumPy arrays, CSV tables); a BatchStream cuts a
// worker's shard of it into shuffled, preprocessed float batches on a prefetching thread (sources: on a pool of
// threads, several batches ahead).
//
// Thread-safety: Dataset is immutable after loading (safe to share). BatchStream: Next(), SaveState() and
// Restore() are called by one consumer thread; the stream owns its prefetching thread and stops it in its
// destructor.
//
// Example:
//   ASSIGN_OR_RETURN(DatasetPair data, LoadDataset("/usr/share/datasets/fashion-mnist", DataFormat::kAuto));
//   BatchStreamOptions o{.batch_size = 100, .shard_index = 0, .num_shards = 2, .seed = 1};
//   ASSIGN_OR_RETURN(auto stream, BatchStream::Create(data.train, o));
//   const Batch& b = stream->Next();   // blocks until a batch is ready
#ifndef DTRAIN_WORKER_DATA_DATASET_H_
#define DTRAIN_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dtrain::data {

class ExampleSource;  // example_source.h

// Images (pixels + class labels) or click-through-rate examples (dense + sparse features, 0/1 labels).
enum class DataKind { kImage, kCtr };

struct Dataset {
  int height = 0, width = 0, channels = 0;  // of the stored images
  int num_classes = 10;
  std::vector<uint8_t> pixels;              // count * height * width * channels, HWC per image
  std::vector<int32_t> labels;              // count
  int64_t count() const { return static_cast<int64_t>(labels.size()); }
  int64_t image_size() const { return static_cast<int64_t>(height) * width * channels; }

  // Click-through-rate (CTR) data, e.g. Criteo (criteo.h); num_classes = 2, labels 0 (no click) or 1, no pixels.
  //   dense:      count * num_dense floats, example-major, already transformed (Criteo's integer features x
  //               become log(1 + max(x, 0)), an empty field 0).
  //   ids:        the sparse features' int64 ids, example-major then feature: a bag of ids per (example,
  //               feature), possibly empty.
  //   id_offsets: count * num_sparse + 1 offsets into ids: the bag of example e, feature f is
  //               ids[id_offsets[e * num_sparse + f] .. id_offsets[e * num_sparse + f + 1]); id_offsets[0] = 0.
  //               EMPTY when every bag holds exactly one id (Criteo text): the bag is then ids[e * num_sparse + f],
  //               which halves the memory. Read bags through Bag(), which knows both layouts.
  int num_dense = 0, num_sparse = 0;
  std::vector<float> dense;
  std::vector<int64_t> ids;
  std::vector<int64_t> id_offsets;
  DataKind kind() const { return num_dense > 0 || num_sparse > 0 ? DataKind::kCtr : DataKind::kImage; }
  absl::Span<const int64_t> Bag(int64_t e, int f) const {
    const int64_t i = e * num_sparse + f;
    if (id_offsets.empty()) return absl::Span<const int64_t>(ids.data() + i, 1);
    return absl::Span<const int64_t>(ids.data() + id_offsets[i], id_offsets[i + 1] - id_offsets[i]);
  }

  // Examples read as they are needed (image folders, arrays: example_source.h): pixels is empty, labels holds
  // every example's label, height x width x channels is the shape the source writes (floats, not bytes).
  std::shared_ptr<const ExampleSource> source;
  std::vector<std::string> class_names;  // image folders: the class folder of each label (sorted, as ImageFolder)
};

struct DatasetPair {
  Dataset train, test;
  std::string format;  // "mnist-idx", "cifar10-bin", "tfrecord", "criteo", "image-folder", "npy", "csv"
};

enum class DataFormat { kAuto, kMnistIdx, kCifar10Bin, kTfRecord, kCriteo, kImageFolder, kNpy, kCsv };

// "auto", "mnist-idx", "cifar10-bin", "tfrecord", "criteo", "image_folder" (or "image-folder"), "npy" (or "npz")
// or "csv" (what --data_format / --input_format take); InvalidArgument naming the choices otherwise.
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);

// How arrays of rank 3 beyond the examples' axis are laid out (array_source.h).
enum class ArrayLayout {
  kAuto,  // [N, H, W, C] when the last axis has 1, 3 or 4 entries, else [N, C, H, W] when the first has
  kNhwc,
  kNchw,  // transposed to HWC as it is read
};

// What LoadDataset needs beyond a directory for image folders, arrays and CSV (the other formats ignore it).
struct LoadOptions {
  // Image folders (image_folder.h): the side of the square images the model takes, and evaluation's shorter
  // side before the centre crop (0: image_size * 256 / 224, torchvision's 256 for 224).
  int image_size = 224;
  int resize_size = 0;
  // A data set without a test part (an image folder without val/, arrays or CSV without test files): this
  // fraction of the training examples, evenly spaced (per class for image folders), is the test set; 0: none,
  // and such a data set is refused naming what is missing.
  double validation_split = 0;
  // CSV: the column holding the labels, by header name or 0-based index (integers, or class names: sorted,
  // they become 0, 1, ...); every other column is a numeric feature.
  std::string label_column = "label";
  // NumPy .npz files: the names of the examples' and the labels' arrays.
  std::string x_name = "x", y_name = "y";
  ArrayLayout layout = ArrayLayout::kAuto;
};
// Reads a data directory. kAuto detects by file names:
//   MNIST IDX: train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-... (magic 2051 / 2049 checked)
//   CIFAR-10 binary: data_batch_1..5.bin, test_batch.bin (also inside a cifar-10-batches-bin/ subfolder)
//   TFRecord: train.tfrecords, test.tfrecords (tf.train.Example with image_raw, label, pixels features; or CTR
//             examples with label, dense, sparse_0 ... sparse_{k-1}: example_proto.h)
//   Criteo: train.txt[.gz], test.txt[.gz] (criteo.h; 13 integer + 26 categorical features per line unless a
//           criteo_layout.txt beside them says otherwise)
//   NumPy: train.npz + test.npz (arrays x and y), a .npz with x_train, y_train, x_test, y_test (Keras's), or
//          x_train.npy, y_train.npy, x_test.npy, y_test.npy (array_source.h; memory-mapped)
//   CSV: train.csv and test.csv (or val.csv) (array_source.h)
//   Image folder: train/<class>/*.jpg|png and val/ (or validation/, test/) (image_folder.h)
// Errors name the file and what is wrong (NotFound, DataLoss for corrupt/truncated content with byte offset).
absl::StatusOr<DatasetPair> LoadDataset(const std::string& dir, DataFormat format = DataFormat::kAuto,
                                        const LoadOptions& options = {});

// Individual readers (also used by dtrain_convert and the tests).
absl::StatusOr<Dataset> ReadMnistIdx(const std::string& images_path, const std::string& labels_path);
absl::StatusOr<Dataset> ReadCifar10Bin(const std::vector<std::string>& paths);
absl::StatusOr<Dataset> ReadTfRecordExamples(const std::string& path);
// Writes image examples (image_raw, or image_float for examples that are not bytes), or CTR examples. A data set
// with a source is written as evaluation reads it (image folders: Resize + CenterCrop to image_size), its
// examples decoded on every core; one that fails to read is left out (logged).
absl::Status WriteTfRecordExamples(const Dataset& data, const std::string& path);

// The same readers over bytes in memory (what the files hold; the fuzzers use them): the same checks and
// errors, with `name` where the file readers put the path. ParseMnistIdx takes raw or gzip bytes, like the
// files; ParseCifar10Bin one batch file.
absl::StatusOr<Dataset> ParseMnistIdx(absl::string_view images, absl::string_view labels,
                                      const std::string& images_name = "images",
                                      const std::string& labels_name = "labels");
absl::StatusOr<Dataset> ParseCifar10Bin(absl::string_view bytes, const std::string& name = "cifar10");
absl::StatusOr<Dataset> ParseTfRecordExamples(absl::string_view bytes, const std::string& name = "tfrecord");

// The pipeline's preprocessing of one image into floats.
enum class Preprocess {
  kScale01,          // pixel / 255 (MNIST-like)
  kCifarTrain,       // random crop to crop_h x crop_w, random flip, brightness +-63, contrast 0.2..1.8,
                     // per-image standardization (the CIFAR-10 tutorial's distorted inputs)
  kCifarEval,        // central crop to crop_h x crop_w, per-image standardization
};

// Per-channel normalization after the preprocessing (kScale01's pixels in [0, 1]): x = (x - mean[c]) / stddev[c]
// (--input_mean/--input_std, for models trained on normalized inputs, e.g. torchvision's
// transforms.Normalize). One value applies to every channel; empty: none.
struct Normalization {
  std::vector<float> mean, stddev;
  bool empty() const { return mean.empty() && stddev.empty(); }
};

// "0.4914,0.4822,0.4465" and "0.247,0.243,0.261" (either may be empty: mean 0, stddev 1). InvalidArgument for
// a value that is not a number, a stddev <= 0, or lists of different lengths (besides one value).
absl::StatusOr<Normalization> ParseNormalization(const std::string& mean, const std::string& stddev);
// InvalidArgument unless each list has 0, 1 or `channels` values.
absl::Status CheckNormalization(const Normalization& n, int channels);

// What a stream does with an example of a source (an image file) that fails to read; for a followed directory's
// files (--bad_records, batch_stream_follow.h) what it does with a file that fails to read.
enum class BadExamples {
  kSkip,  // log its path once and go on: a training batch takes the next readable example of the epoch's order
          // in its place, evaluation leaves it out
  kFail,  // stop: the stream's status() names the file
};

// "skip" or "fail" (--bad_images); InvalidArgument otherwise.
absl::StatusOr<BadExamples> ParseBadExamples(absl::string_view name);

// WriteTfRecordExamples with a choice for a source's examples that fail to read (kFail: the error naming the
// file; what was written so far stays in the file).
absl::Status WriteTfRecordExamples(const Dataset& data, const std::string& path, BadExamples bad_examples);

// "auto", "nhwc" or "nchw" (--array_layout); InvalidArgument otherwise.
absl::StatusOr<ArrayLayout> ParseArrayLayout(absl::string_view name);

struct BatchStreamOptions {
  int batch_size = 100;
  int shard_index = 0;   // this worker's shard: examples i with i % num_shards == shard_index
  int num_shards = 1;
  uint64_t seed = 1;     // shuffling (reshuffled every epoch) and distortions
  bool shuffle = true;
  Preprocess preprocess = Preprocess::kScale01;
  int crop_h = 24, crop_w = 24;  // for the CIFAR modes
  int prefetch = 4;      // batches prepared ahead
  Normalization normalize;  // after the preprocessing (CheckNormalization'ed by Create)
  // Data sets with a source (example_source.h; `preprocess` and the crops do not apply, the source transforms):
  // the threads reading examples, together on the `prefetch` batches ahead (0: one per core); whether training
  // reads augment (image folders: random resized crop + flip); what a failed read does.
  int threads = 0;
  bool augment = true;
  BadExamples bad_examples = BadExamples::kSkip;
};

struct Batch {
  int batch = 0, height = 0, width = 0, channels = 0;
  std::vector<float> images;  // batch * height * width * channels (NHWC)
  std::vector<float> labels;  // class indices as floats
  int64_t epoch = 0;          // epoch the batch's first example belongs to

  // CTR batches (a Dataset of kind kCtr; images empty, labels 0/1): the examples' features in batch order.
  //   dense:      batch * num_dense floats.
  //   ids:        the batch's ids, example-major then feature.
  //   id_offsets: batch * num_sparse + 1, relative to this batch (id_offsets[0] = 0, always filled): the bag of
  //               example i, feature f is ids[id_offsets[i * num_sparse + f] .. id_offsets[i * num_sparse + f + 1]).
  int num_dense = 0, num_sparse = 0;
  std::vector<float> dense;
  std::vector<int64_t> ids;
  std::vector<int32_t> id_offsets;
};

// Batches are deterministic in (data, options), whatever the threads: batch k of a shard holds the shard's stream positions
// [k*batch_size, (k+1)*batch_size), where positions run through epoch 0's order, then epoch 1's, ... (a batch
// may straddle two epochs). Each epoch's order is the shard shuffled with an RNG seeded by (seed, epoch,
// shard), or ascending when shuffle=false; kCifarTrain distortions use an RNG seeded by (seed, shard, k), a
// source's augmentation one seeded by (seed, shard, stream position).
// prefetch = 0 builds batches on the consumer thread inside Next(). Over CTR data the batches carry the features
// (Batch's CTR fields), with the same order, sharding and positions; preprocess and the crops are not used.
//
// The position can be saved with a checkpoint and restored on resume (format: batch_stream_state.h):
//   std::string position = stream->SaveState();     // after the Next() calls whose batches were trained on
//   ...                                               // a new process, the same data and options:
//   RETURN_IF_ERROR(stream->Restore(position));       // Next() now returns what the saved stream returned next
class BatchStream {
 public:
  // InvalidArgument for a bad batch size, shard, crop or an inconsistent Dataset. `data` is not copied:
  // it must outlive the stream.
  static absl::StatusOr<std::unique_ptr<BatchStream>> Create(const Dataset& data, const BatchStreamOptions& o);
  virtual ~BatchStream() = default;
  // Blocks until the next batch is ready. The reference is valid until the next call. A stream that failed
  // (a source's read with BadExamples::kFail, or no readable example left in the shard) returns an empty batch
  // (batch == 0) from then on, and status() says why. A stream that can end (batch_stream_follow.h: files that
  // stop arriving) returns an empty batch once it has, with status() OK when it ended as asked.
  virtual const Batch& Next() = 0;
  virtual absl::Status status() const { return absl::OkStatus(); }
  virtual int64_t shard_size() const = 0;  // examples in this shard
  // Batches Next() has returned (or Restore set): the index of the batch the next call returns.
  virtual int64_t batches_read() const = 0;

  // The position after the batches Next() has returned so far (epoch, offset in the epoch's order, batch
  // index), with the seed and shard that define the order: a versioned, checksummed blob.
  virtual std::string SaveState() const = 0;
  // Continues from a SaveState() of a stream over the same data with the same options (batches prepared ahead
  // are dropped). DataLoss for a corrupt or truncated state, FailedPrecondition for one of another stream
  // (seed, shard, data set size, batch size, shuffling or preprocessing differ; the message names which) or of
  // a newer format; the position is unchanged then.
  virtual absl::Status Restore(absl::string_view state) = 0;
};

// Fixed, unshuffled, preprocessed (and normalized) batches over the whole set (evaluation). The last batch may
// be smaller. Preconditions (CHECKed): batch_size > 0; for the CIFAR modes the crop fits the images; CTR data
// consistent; CheckNormalization(normalize, data.channels) for images. A source's examples are all read (on
// every core), those that fail left out: for large sets, EvalBatchSet reads them batch by batch instead.
std::vector<Batch> EvalBatches(const Dataset& data, int batch_size, Preprocess preprocess, int crop_h = 24,
                               int crop_w = 24, const Normalization& normalize = {});

struct EvalBatchOptions {
  int batch_size = 500;
  Preprocess preprocess = Preprocess::kScale01;  // in-memory images (as EvalBatches)
  int crop_h = 24, crop_w = 24;
  Normalization normalize;
  int threads = 0;  // sources: reading threads (0: one per core)
  BadExamples bad_examples = BadExamples::kSkip;
};

// The evaluation batches of a test set of any size, as EvalBatches makes them: an in-memory data set's are made
// once and kept; a source's are read while they are visited (a few batches ahead, on `threads` threads), so
// that a test set larger than memory evaluates.
//
// Thread-safety: ForEach from one thread at a time. The data set must outlive the object.
class EvalBatchSet {
 public:
  // InvalidArgument for a bad batch size, crop or normalization.
  static absl::StatusOr<std::unique_ptr<EvalBatchSet>> Create(const Dataset& data, const EvalBatchOptions& o);
  virtual ~EvalBatchSet() = default;
  // Calls `fn` on every batch in order and returns its first error. A source's example that fails to read is
  // left out (kSkip, its path logged once) or ends the visit with the error naming it (kFail).
  virtual absl::Status ForEach(const std::function<absl::Status(const Batch&)>& fn) const = 0;
};

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_DATASET_H_
