// Small, careful file helpers: whole-file reads and crash-safe whole-file writes on the POSIX file system
// (Env::Default(), common/env.h; code that tests inject faults into takes an Env* instead).
//
//   RETURN_IF_ERROR(WriteFileAtomically("/ckpt/latest", "step-1200\n"));
//   ASSIGN_OR_RETURN(std::string text, ReadFileToString("/ckpt/latest"));
//
// Errors name the path and the operation, and carry the errno text. Codes follow errno: ENOENT →
// NotFound, EACCES/EPERM/EROFS → PermissionDenied, ENOSPC/EDQUOT → ResourceExhausted, EISDIR/ENOTDIR →
// FailedPrecondition, anything else → Internal.
//
// Thread-safety: the functions are thread-safe; concurrent writers of the same path from different
// processes each use their own temporary file, and the last rename wins.
#ifndef DTRAIN_COMMON_FILE_UTIL_H_
#define DTRAIN_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// Replaces `path` with `bytes` so that a reader (or a crash) sees either the old content or the new,
// never a mix: writes `path.tmp.<pid>.<n>`, fsyncs it, renames it over `path`, then fsyncs the directory.
// The parent directory must exist. On failure the temporary file is removed and `path` is untouched.
// Same as WriteFileAtomically(Env::Default(), path, bytes) (common/env.h).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

// Reads the whole file at `path`.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// `path` made absolute against the current directory and lexically normalised ("data/./x" -> "/run/data/x", "."
// -> "/run", without a trailing '/'); symbolic links are kept. An absolute path is only normalised; an empty one stays empty. For a path kept to be
// read later from elsewhere (a checkpoint's record of --data_dir).
std::string AbsolutePath(const std::string& path);

// An absl::Status for a failed system call: `context` (e.g. "cannot open '/x' for reading") followed
// by strerror(errno_value), with the code mapped as described above.
absl::Status ErrnoToStatus(int errno_value, absl::string_view context);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_FILE_UTIL_H_
