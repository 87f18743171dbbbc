#include "common/env.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dtrain {

std::string ParentDir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string TemporaryFileName(const std::string& path) {
  // The pid keeps processes apart, the counter threads of one process.
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
}

bool IsTemporaryFileName(absl::string_view name) {
  const size_t tmp = name.rfind(".tmp.");
  if (tmp == absl::string_view::npos) return false;
  absl::string_view rest = name.substr(tmp + 5);
  const size_t dot = rest.find('.');
  if (dot == absl::string_view::npos || dot == 0 || dot + 1 == rest.size()) return false;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (i != dot && !absl::ascii_isdigit(static_cast<unsigned char>(rest[i]))) return false;
  }
  return true;
}

absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::string_view bytes) {
  if (path.empty()) return absl::InvalidArgumentError("WriteFileAtomically: empty path");
  const std::string tmp = TemporaryFileName(path);
  absl::Status status;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        bytes.size() >= kDirectWriteBytes ? env->NewDirectWritableFile(tmp) : env->NewWritableFile(tmp);
    if (!file.ok()) return file.status();  // nothing was created
    status = (*file)->Append(bytes);
    if (status.ok()) status = (*file)->Sync();
    // Close even after a failure, before the removal below.
    absl::Status closed = (*file)->Close();
    if (status.ok()) status = closed;
  }
  if (status.ok()) status = env->RenameFile(tmp, path);
  if (!status.ok()) {
    absl::Status removed = env->RemoveFile(tmp);
    if (!removed.ok() && !absl::IsNotFound(removed)) {
      return absl::Status(status.code(), absl::StrCat(status.message(),
                                                      "; and the temporary file could not be "
                                                      "removed: ",
                                                      removed.message()));
    }
    return status;
  }
  // The rename is durable only once the directory entry is on disk.
  return env->SyncDir(ParentDir(path));
}

}  // namespace dtrain
