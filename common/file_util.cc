#include "common/file_util.h"

#include <errno.h>
#include <string.h>

#include <filesystem>
#include <system_error>

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

std::string AbsolutePath(const std::string& path) {
  if (path.empty()) return path;
  std::error_code error;  // only when the current directory is gone: then the path as given
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  if (error) return path;
  std::string normal = absolute.lexically_normal().string();
  if (normal.size() > 1 && normal.back() == '/') normal.pop_back();  // "run/." and "data/" name a directory
  return normal;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  return WriteFileAtomically(Env::Default(), path, bytes);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) { return Env::Default()->ReadFile(path); }

}  // namespace dtrain
