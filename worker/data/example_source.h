// Examples read as they are needed instead of held in a Dataset's pixels: image folders (decoded and augmented
// per read, image_folder.h) and arrays (memory-mapped .npy/.npz, CSV tables: array_source.h). A Dataset with a
// source (dataset.h) keeps only its labels in memory; BatchStream reads its examples on a pool of threads
// (source_batch_stream.h).
//
// Thread-safety: implementations are immutable after creation and Read() is called from many threads at once.
#ifndef DTRAIN_WORKER_DATA_EXAMPLE_SOURCE_H_
#define DTRAIN_WORKER_DATA_EXAMPLE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dtrain::data {

class ExampleSource {
 public:
  virtual ~ExampleSource() = default;

  // Examples in the source (the Dataset's labels has as many).
  virtual int64_t size() const = 0;

  // Writes example i (0 <= i < size()) as floats in the Dataset's height x width x channels (HWC) into `out`:
  // pixels (bytes) scaled to [0, 1], other values as stored. augment: the training-time augmentation, drawn from
  // `rng` (image folders: random resized crop and flip); else the evaluation transform (deterministic).
  // Errors name what was read (a file's path): InvalidArgument for bytes that do not decode (a truncated JPEG,
  // a text file named .png), NotFound / PermissionDenied / DataLoss for a file that cannot be read. `out` is
  // unspecified after an error.
  virtual absl::Status Read(int64_t i, bool augment, std::mt19937_64* rng, float* out) const = 0;

  // True when every value Read writes is a byte / 255 (conversions store the bytes again: round(v * 255)).
  virtual bool bytes() const = 0;

  // Whether Read can fail for single examples (files on disk), so that a stream may skip them.
  virtual bool can_fail() const = 0;

  // What example i is read from ("DIR/train/cat/1.jpg"; "x.npy[17]"), for messages.
  virtual std::string Name(int64_t i) const = 0;
};

// The examples `indices` of `source`, in that order (a split of a data set into train and validation parts).
// Preconditions (CHECKed): every index in [0, source->size()).
std::shared_ptr<const ExampleSource> SubsetSource(std::shared_ptr<const ExampleSource> source,
                                                  std::vector<int64_t> indices);

// A validation split: of n examples, those at evenly spaced positions (i such that floor((i + 1) * fraction) >
// floor(i * fraction): every 10th for 0.1) go to *held, the others to *kept, both ascending. Deterministic, and
// stratified when applied per class.
void SplitEvenly(int64_t n, double fraction, std::vector<int64_t>* kept, std::vector<int64_t>* held);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_EXAMPLE_SOURCE_H_
