// Env: the file-system operations dtrain's durable state (checkpoints) needs, behind an interface in the
// manner of leveldb's Env, so that tests can put a fault-injecting implementation underneath
// (common/testing/fault_injection_env.h: a full disk after N bytes, a failed rename, a failed fsync).
//
//   Env* env = Env::Default();                                   // POSIX; never deleted
//   RETURN_IF_ERROR(WriteFileAtomically(env, "/ckpt/model.ckpt-100.ps0-of-1", bytes));
//   ASSIGN_OR_RETURN(std::string back, env->ReadFile("/ckpt/model.ckpt-100.ps0-of-1"));
//   ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren("/ckpt"));
//
// Errors name the path and the operation and carry the errno text; codes follow errno as ErrnoToStatus
// (common/file_util.h) maps them: ENOENT → NotFound, EACCES/EPERM/EROFS → PermissionDenied, ENOSPC/EDQUOT →
// ResourceExhausted, EISDIR/ENOTDIR → FailedPrecondition, anything else → Internal.
//
// Thread-safety: every Env method may be called concurrently from any thread. A WritableFile belongs to one
// thread at a time.
#ifndef DTRAIN_COMMON_ENV_H_
#define DTRAIN_COMMON_ENV_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dtrain {

// A file being written from its start. The destructor closes it (without syncing) if Close() was not called.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  virtual absl::Status Sync() = 0;   // data on stable storage (fsync)
  virtual absl::Status Close() = 0;  // once; further calls return FailedPrecondition
};

class Env {
 public:
  virtual ~Env() = default;

  // The POSIX file system. A process-wide object, never deleted; callers do not own it.
  static Env* Default();

  // Creates or truncates `path`. The parent directory must exist.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // The same for a large file written once and synced (a checkpoint, a delta): written around the page cache
  // where the file system allows it (POSIX: O_DIRECT, through an aligned buffer the file keeps; else as
  // NewWritableFile). The bytes reach the disk without being copied into fresh page-cache pages, which on a
  // virtual machine with shadow page tables cost more than the write itself. The default: NewWritableFile.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) {
    return NewWritableFile(path);
  }
  // The whole content of `path`.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // The names (not paths) of the entries of `dir`, without "." and "..", in no particular order.
  // NotFound if `dir` does not exist.
  virtual absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Atomically replaces `to` (if it exists) by `from`.
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Creates `dir` and its missing parents; OK if it exists already.
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  // Makes the entries of `dir` (a rename into it, a new file) durable (fsync of the directory).
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // Blocks the calling thread (retry backoff goes through here so that tests need not wait).
  virtual void SleepFor(absl::Duration d) = 0;
};

// Replaces `path` with `bytes` so that a reader, or a crash at any point, sees either the old content or the
// new, never a mix: writes a temporary file beside it (TemporaryFileName; NewDirectWritableFile from
// kDirectWriteBytes on, NewWritableFile below), syncs and closes it, renames it
// over `path`, then syncs the directory. The parent directory must exist. On failure the temporary file is
// removed and `path` is untouched; the error names the step that failed (a removal that fails too is appended
// to the message). Concurrent writers of one path, in one process or several, each use their own temporary
// file; the last rename wins.
absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::string_view bytes);
inline constexpr size_t kDirectWriteBytes = size_t{1} << 20;

// "<path>.tmp.<pid>.<n>", unique within the process; and whether a file name (without directory) is such a
// temporary file, i.e. contains ".tmp." followed by digits, a '.', digits, to the end.
std::string TemporaryFileName(const std::string& path);
bool IsTemporaryFileName(absl::string_view name);

// The parent directory of `path` ("." for a bare name, "/" for "/x").
std::string ParentDir(const std::string& path);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_ENV_H_
