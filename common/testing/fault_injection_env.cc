#include "common/testing/fault_injection_env.h"

#include <errno.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace dtrain::testing {

class FaultInjectionEnv::File : public WritableFile {
 public:
  File(FaultInjectionEnv* env, std::string path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}

  absl::Status Append(absl::string_view data) override {
    const int64_t fits = env_->Reserve(static_cast<int64_t>(data.size()));
    if (fits > 0) {
      absl::Status s = base_->Append(data.substr(0, static_cast<size_t>(fits)));
      if (!s.ok()) return s;
    }
    if (fits < static_cast<int64_t>(data.size())) {
      return ErrnoToStatus(ENOSPC, absl::StrCat("cannot write '", path_, "' (injected)"));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    {
      absl::MutexLock lock(&env_->mu_);
      if (env_->Take(&env_->fail_syncs_)) {
        return ErrnoToStatus(EIO, absl::StrCat("cannot fsync '", path_, "' (injected)"));
      }
    }
    return base_->Sync();
  }

  absl::Status Close() override { return base_->Close(); }

 private:
  FaultInjectionEnv* const env_;
  const std::string path_;
  std::unique_ptr<WritableFile> base_;
};

FaultInjectionEnv::FaultInjectionEnv(Env* base) : base_(base) {}

void FaultInjectionEnv::FailWritesAfter(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes_left_ = bytes;
}
void FaultInjectionEnv::FailRenames(int count) {
  absl::MutexLock lock(&mu_);
  fail_renames_ = count;
}
void FaultInjectionEnv::FailSyncs(int count) {
  absl::MutexLock lock(&mu_);
  fail_syncs_ = count;
}
void FaultInjectionEnv::FailRemoves(int count) {
  absl::MutexLock lock(&mu_);
  fail_removes_ = count;
}
void FaultInjectionEnv::ClearFaults() {
  absl::MutexLock lock(&mu_);
  bytes_left_ = -1;
  fail_renames_ = fail_syncs_ = fail_removes_ = 0;
}

int64_t FaultInjectionEnv::renames() const {
  absl::MutexLock lock(&mu_);
  return renames_;
}

std::vector<absl::Duration> FaultInjectionEnv::sleeps() const {
  absl::MutexLock lock(&mu_);
  return sleeps_;
}

int64_t FaultInjectionEnv::Reserve(int64_t want) {
  absl::MutexLock lock(&mu_);
  if (bytes_left_ < 0) return want;
  const int64_t fits = std::min(want, bytes_left_);
  bytes_left_ -= fits;
  return fits;
}

bool FaultInjectionEnv::Take(int* count) {
  if (*count <= 0) return false;
  --*count;
  return true;
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  absl::StatusOr<std::unique_ptr<WritableFile>> base = base_->NewWritableFile(path);
  if (!base.ok()) return base.status();
  return std::unique_ptr<WritableFile>(new File(this, path, *std::move(base)));
}

absl::StatusOr<std::string> FaultInjectionEnv::ReadFile(const std::string& path) {
  return base_->ReadFile(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionEnv::GetChildren(const std::string& dir) {
  return base_->GetChildren(dir);
}

absl::Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  {
    absl::MutexLock lock(&mu_);
    if (Take(&fail_removes_))
      return ErrnoToStatus(EIO, absl::StrCat("cannot delete '", path, "' (injected)"));
  }
  return base_->RemoveFile(path);
}

absl::Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  {
    absl::MutexLock lock(&mu_);
    if (Take(&fail_renames_)) {
      return ErrnoToStatus(EIO, absl::StrCat("cannot rename '", from, "' to '", to, "' (injected)"));
    }
  }
  absl::Status s = base_->RenameFile(from, to);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    ++renames_;
  }
  return s;
}

absl::Status FaultInjectionEnv::CreateDirs(const std::string& dir) { return base_->CreateDirs(dir); }

absl::Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  {
    absl::MutexLock lock(&mu_);
    if (Take(&fail_syncs_)) {
      return ErrnoToStatus(EIO, absl::StrCat("cannot fsync directory '", dir, "' (injected)"));
    }
  }
  return base_->SyncDir(dir);
}

bool FaultInjectionEnv::FileExists(const std::string& path) { return base_->FileExists(path); }
bool FaultInjectionEnv::IsDirectory(const std::string& path) { return base_->IsDirectory(path); }

void FaultInjectionEnv::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  sleeps_.push_back(d);
}

}  // namespace dtrain::testing
