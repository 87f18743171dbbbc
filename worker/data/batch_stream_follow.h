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
// Bad files (FollowOptions::bad_files, the worker's --bad_records): a file that cannot be read or parsed (a line
// with the wrong number of fields, a field that is not a number, a truncated gzip or TFRecord, no permission,
// features other than the first file's) is, with kSkip (the default), set aside whole: one WARNING names it,
// the line and what is wrong, and how many lines (examples) of it are not trained on; the stream goes on with
// the next file, and SetAsideCounts counts it. A whole file rather than its bad lines: a bad line is rarely
// alone (a producer that wrote the file in place, a crash halfway, another version of the producer), and the
// rest of such a file is no fair sample of its hour; training on its good half would hide the fault. With kFail
// the stream ends: Next() returns an empty batch and status() the error (naming the file and line).
//
// Unfinished files: a producer that writes in place, without a temporary name, leaves a file that is read while
// it grows; its last line is then typically cut short. A file whose read fails while it may still be written (its
// size or modification time moved during the read, or it was modified less than a second before) is read again
// once it has stopped changing, for up to `unfinished_wait`; only then is it bad (either setting). This saves
// a file that fails mid-write; it cannot tell a file that was read whole at a moment its writer paused at the
// end of a line, which is why producers should still rename finished files into the directory.
//
// A set-aside file leaves the position alone (no example of it was taken; batch indices run on): a restore
// from a position before it reads it again, and sets it aside again while it is still bad.
//
// Errors: with kFail a bad file ends the stream (above); with either setting, so does a file a Restore names that
// can no longer be read (some of its examples were trained on). Next() also returns an empty batch (status() OK)
// when the stream ended by idleness or stop.
//
// Thread-safety: as BatchStream (one consumer thread); the stream reads files and builds batches on a thread of
// its own.
#ifndef DTRAIN_WORKER_DATA_BATCH_STREAM_FOLLOW_H_
#define DTRAIN_WORKER_DATA_BATCH_STREAM_FOLLOW_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/data/dataset.h"

namespace dtrain::data {

// What a stream set aside so far (FollowOptions::bad_files = kSkip). Thread-safe: the stream's thread counts, any
// thread reads.
struct SetAsideCounts {
  std::atomic<int64_t> files{0};
  std::atomic<int64_t> lines{0};  // of the plain-text files among them (a gzip or TFRecord file's are not counted)
};

struct FollowOptions {
  std::string dir;
  DataFormat format = DataFormat::kCriteo;  // kCriteo or kTfRecord (kAuto: TFRecord when a *.tfrecords file is
                                            // there first, else Criteo)
  absl::Duration poll = absl::Seconds(1);   // how often the directory is listed while no new file is known
  absl::Duration idle_timeout = absl::InfiniteDuration();  // the stream ends after this long without a new file
  std::function<bool()> stop;               // polled: the stream ends when it returns true (may be null)
  BadExamples bad_files = BadExamples::kSkip;  // a file that cannot be read: set aside, or end the stream
  absl::Duration unfinished_wait = absl::Seconds(60);  // how long a failing file that still changes is waited for
  SetAsideCounts* set_aside = nullptr;      // counts the files set aside (may be null; must outlive the stream)
};

// A stream over the files of o.dir. Waits for the first file (up to idle_timeout), reads it and returns the
// stream; *shape gets its features (num_dense, num_sparse, num_classes; no examples) for sizing the model.
// InvalidArgument for bad options or a format other than Criteo/TFRecord CTR examples; NotFound when no file
// came within idle_timeout (or stop); the first file's read error with kFail (with kSkip a bad first file is set
// aside and the next one waited for).
absl::StatusOr<std::unique_ptr<BatchStream>> FollowFiles(const FollowOptions& o, const BatchStreamOptions& b,
                                                         Dataset* shape);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_BATCH_STREAM_FOLLOW_H_
