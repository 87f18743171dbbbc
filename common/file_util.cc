#include "common/file_util.h"

#include <errno.h>
#include <string.h>

#include "absl/strings/str_cat.h"
#include "common/env.h"

namespace dtrain {

absl::Status ErrnoToStatus(int errno_value, absl::string_view context) {
  std::string message = absl::StrCat(context, ": ", strerror(errno_value));
  switch (errno_value) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EISDIR:
    case ENOTDIR:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  return WriteFileAtomically(Env::Default(), path, bytes);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) { return Env::Default()->ReadFile(path); }

}  // namespace dtrain
