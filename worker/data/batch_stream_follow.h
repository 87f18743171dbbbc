// A BatchStream that follows a directory where data files keep arriving (--follow): hourly partitions of Criteo
// text or TFRecord CTR examples, read once each in the order of their names, each worker taking its shard of
// every file (example i of a file when i % num_shards == shard_index). A batch may span two files. Training
// goes on as files arrive; the stream ends when no new file came for `idle_timeout`, or when `stop` says so.
//
// Files: every regular file of the directory except hidden ones (".x"), "_x" markers, criteo_layout.txt and
// unfinished writes (common/env.h's temporary names, "*.tmp"); for TFRecord only "*.tfrecords"/"*.tfrecord".
// Producers should write a file elsewhere (or under a temporary name) and rename it into the directory: a file is
// read as soon as it is listed. A file whose name sorts before the newest one read arrives too late: it is
// skipped, with a warning (the position is the newest name read).
//
// Order: a file's shard in file order, or with BatchStreamOptions::shuffle shuffled within the file (seeded by
// the seed, the file's name and the shard): time order across files either way.
//
// Position (SaveState/Restore, kept in checkpoints like BatchStream's): the file being read, how many of its
// shard's examples were taken, and the batch index; versioned and checksummed ("DTRNFPOS"). A restore reads on
// from that file and example (FailedPrecondition when the file is gone or the stream's options differ).
//
// Errors: a file that cannot be read ends the stream: Next() returns an empty batch and status() the error
// (naming the file). Next() also returns an empty batch (status() OK) when the stream ended by idleness or stop.
//
// Thread-safety: as BatchStream (one consumer thread); the stream reads files and builds batches on a thread of
// its own.
#ifndef DTRAIN_WORKER_DATA_BATCH_STREAM_FOLLOW_H_
#define DTRAIN_WORKER_DATA_BATCH_STREAM_FOLLOW_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/data/dataset.h"

namespace dtrain::data {

struct FollowOptions {
  std::string dir;
  DataFormat format = DataFormat::kCriteo;  // kCriteo or kTfRecord (kAuto: TFRecord when a *.tfrecords file is
                                            // there first, else Criteo)
  absl::Duration poll = absl::Seconds(1);   // how often the directory is listed while no new file is known
  absl::Duration idle_timeout = absl::InfiniteDuration();  // the stream ends after this long without a new file
  std::function<bool()> stop;               // polled: the stream ends when it returns true (may be null)
};

// A stream over the files of o.dir. Waits for the first file (up to idle_timeout), reads it and returns the
// stream; *shape gets its features (num_dense, num_sparse, num_classes; no examples) for sizing the model.
// InvalidArgument for bad options or a format other than Criteo/TFRecord CTR examples; NotFound when no file
// came within idle_timeout (or stop); the first file's read error.
absl::StatusOr<std::unique_ptr<BatchStream>> FollowFiles(const FollowOptions& o, const BatchStreamOptions& b,
                                                         Dataset* shape);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_BATCH_STREAM_FOLLOW_H_
