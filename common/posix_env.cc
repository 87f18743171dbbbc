// Env::Default(): the POSIX file system (open/write/fsync/rename, std::filesystem for directories).
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace dtrain {
namespace {

// What a use of a closed file returns.
absl::Status ClosedError(absl::string_view op, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat("cannot ", op, " '", path, "': already closed"));
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0) return Closed("write");
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, absl::StrCat("cannot write '", path_, "'"));
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed("fsync");
    if (::fsync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("cannot fsync '", path_, "'"));
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return Closed("close");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("cannot close '", path_, "'"));
    return absl::OkStatus();
  }

 private:
  absl::Status Closed(absl::string_view op) const { return ClosedError(op, path_); }

  const std::string path_;
  int fd_;
};

// A file opened with O_DIRECT: appends gather in an aligned buffer, written (pwrite at an aligned offset) each
// time it fills; Sync writes the partial buffer padded to the block size and cuts the file to its length (the
// partial block stays in the buffer: later appends rewrite it). The buffer is the thread's, kept between files
// (its pages stay resident: a fresh buffer per file would pay for its pages each time).
class DirectWritableFile : public WritableFile {
 public:
  static constexpr size_t kAlign = 4096;
  static constexpr size_t kBufferBytes = size_t{4} << 20;

  DirectWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~DirectWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0) return Closed("write");
    char* buf = Buffer();
    while (!data.empty()) {
      const size_t n = std::min(data.size(), kBufferBytes - used_);
      std::memcpy(buf + used_, data.data(), n);
      used_ += n;
      tail_written_ = false;
      data.remove_prefix(n);
      if (used_ == kBufferBytes) {
        RETURN_IF_ERROR(WriteAt(kBufferBytes));
        written_ += static_cast<off_t>(kBufferBytes);
        used_ = 0;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed("fsync");
    RETURN_IF_ERROR(WriteTail());
    if (::fsync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("cannot fsync '", path_, "'"));
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return Closed("close");
    absl::Status tail = WriteTail();  // what was appended reaches the file, synced or not
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && tail.ok()) return ErrnoToStatus(errno, absl::StrCat("cannot close '", path_, "'"));
    return tail;
  }

 private:
  static char* Buffer() {
    thread_local std::unique_ptr<char, decltype(&std::free)> buffer(
        static_cast<char*>(std::aligned_alloc(kAlign, kBufferBytes)), &std::free);
    return buffer.get();
  }
  // The partial buffer, padded with zeros to a whole block, at the file's end; then the file cut to its length.
  absl::Status WriteTail() {
    if (used_ == 0 || tail_written_) return absl::OkStatus();
    const size_t padded = (used_ + kAlign - 1) / kAlign * kAlign;
    std::memset(Buffer() + used_, 0, padded - used_);
    RETURN_IF_ERROR(WriteAt(padded));
    if (::ftruncate(fd_, written_ + static_cast<off_t>(used_)) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("cannot truncate '", path_, "'"));
    }
    tail_written_ = true;
    return absl::OkStatus();
  }
  // The buffer's first `bytes` (a multiple of kAlign) at offset written_.
  absl::Status WriteAt(size_t bytes) {
    const char* p = Buffer();
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pwrite(fd_, p + done, bytes - done, written_ + static_cast<off_t>(done));
      if (n < 0) {
        if (errno == EINTR) continue;
        // A file system that opens O_DIRECT but wants another alignment: the rest goes through the page cache.
        if (errno == EINVAL && !buffered_) {
          const int flags = ::fcntl(fd_, F_GETFL);
          if (flags >= 0 && ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) == 0) {
            buffered_ = true;
            continue;
          }
        }
        return ErrnoToStatus(errno, absl::StrCat("cannot write '", path_, "'"));
      }
      if (n == 0 || (!buffered_ && static_cast<size_t>(n) % kAlign != 0)) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot write '", path_, "': a short write (disk full?)"));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status Closed(absl::string_view op) const { return ClosedError(op, path_); }

  const std::string path_;
  int fd_;
  size_t used_ = 0;     // bytes in the buffer, from offset written_ of the file
  off_t written_ = 0;   // bytes of the file written from whole buffers
  bool tail_written_ = false;
  bool buffered_ = false;  // O_DIRECT was refused at the first write and turned off
};

class PosixEnv : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    // A file system without O_DIRECT (tmpfs) refuses it: the file is written through the page cache instead.
    if (fd < 0 && errno == EINVAL) return NewWritableFile(path);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot create '", path, "'"));
    return std::unique_ptr<WritableFile>(new DirectWritableFile(path, fd));
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot create '", path, "'"));
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot open '", path, "' for reading"));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      return ErrnoToStatus(EISDIR, absl::StrCat("cannot read '", path, "'"));
    }
    std::string out;
    if (st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
    char buf[64 * 1024];
    while (true) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    namespace fs = std::filesystem;
    std::vector<std::string> names;
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot list directory '", dir, "'"));
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot list directory '", dir, "'"));
      names.push_back(it->path().filename().string());
    }
    if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot list directory '", dir, "'"));
    return names;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, absl::StrCat("cannot delete '", path, "'"));
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("cannot rename '", from, "' to '", to, "'"));
    }
    return absl::OkStatus();
  }

  absl::Status CreateDirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot create directory '", dir, "'"));
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("cannot open directory '", dir, "'"));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoToStatus(err, absl::StrCat("cannot fsync directory '", dir, "'"));
    return absl::OkStatus();
  }

  bool FileExists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv;  // never deleted: usable from static destructors and other threads
  return env;
}

}  // namespace dtrain
