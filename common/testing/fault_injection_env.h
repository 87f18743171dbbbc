// FaultInjectionEnv: an Env (common/env.h) over another one that fails on request, for tests of what a full
// disk, a failed rename or a failed fsync do to code that persists state (compare leveldb's
// db/fault_injection_test.cc).
//
//   FaultInjectionEnv env(Env::Default());
//   env.FailWritesAfter(1000);     // the disk is full after 1000 more bytes: Append fails with ENOSPC
//   env.FailRenames(1);            // the next rename fails (EIO)
//   env.FailSyncs(2);              // the next two fsyncs (files or directories) fail (EIO)
//   ... exercise the code under test with &env ...
//   env.ClearFaults();             // the disk works again
//
// Failures look like the POSIX Env's (ErrnoToStatus): ResourceExhausted "... No space left on device" for the
// full disk, Internal "... Input/output error" for rename and fsync. A write that hits the limit stores the
// bytes that still fit, then fails, as a real full disk does. SleepFor records the duration and returns at
// once (tests of retry backoff do not wait); sleeps() lists them.
//
// Thread-safety: all methods may be called from any thread.
#ifndef DTRAIN_COMMON_TESTING_FAULT_INJECTION_ENV_H_
#define DTRAIN_COMMON_TESTING_FAULT_INJECTION_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace dtrain::testing {

class FaultInjectionEnv : public Env {
 public:
  // `base` (not owned) does the real work; it must outlive this Env.
  explicit FaultInjectionEnv(Env* base);

  // The disk holds `bytes` more bytes (of file data, across all files), then every Append fails with ENOSPC.
  // A negative value removes the limit.
  void FailWritesAfter(int64_t bytes);
  void FailRenames(int count);  // the next `count` RenameFile calls fail without renaming
  void FailSyncs(int count);  // the next `count` Sync / SyncDir calls fail (the data may or may not be there)
  void FailRemoves(int count);  // the next `count` RemoveFile calls fail without removing
  void ClearFaults();

  int64_t renames() const;  // RenameFile calls that succeeded
  std::vector<absl::Duration> sleeps() const;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status CreateDirs(const std::string& dir) override;
  absl::Status SyncDir(const std::string& dir) override;
  bool FileExists(const std::string& path) override;
  bool IsDirectory(const std::string& path) override;
  void SleepFor(absl::Duration d) override;

 private:
  class File;
  friend class File;

  // How many of `want` bytes the disk still takes (all of them when unlimited); counts them as written.
  int64_t Reserve(int64_t want);
  // Whether a countdown fault is due; decrements it.
  bool Take(int* count);

  Env* const base_;
  mutable absl::Mutex mu_;
  int64_t bytes_left_ ABSL_GUARDED_BY(mu_) = -1;  // < 0: unlimited
  int fail_renames_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_syncs_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_removes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t renames_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain::testing

#endif  // DTRAIN_COMMON_TESTING_FAULT_INJECTION_ENV_H_
