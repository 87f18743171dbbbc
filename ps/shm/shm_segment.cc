#include "ps/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace dtrain::ps::shm {
namespace {

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

int64_t PageRound(int64_t bytes) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  return (bytes + page - 1) / page * page;
}

absl::Status Errno(const std::string& what) {
  const int e = errno;
  const std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  if (e == ENOMEM || e == ENOSPC || e == EMFILE || e == ENFILE) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError(absl::StrCat("shared-memory segment of ", bytes, " bytes"));
  const int64_t size = PageRound(bytes);
  const int fd = memfd_create(kSegmentName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, size) != 0) {
    absl::Status s = Errno(absl::StrCat("sizing a shared-memory segment to ", size, " bytes"));
    close(fd);
    return s;
  }
  if (fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    absl::Status s = Errno("sealing a shared-memory segment");
    close(fd);
    return s;
  }
  void* p = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    absl::Status s = Errno(absl::StrCat("mapping a shared-memory segment of ", size, " bytes"));
    close(fd);
    return s;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(static_cast<char*>(p), size, fd));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Map(int fd, int64_t bytes) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status s = Errno("fstat of a shared segment");
    close(fd);
    return s;
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (!S_ISREG(st.st_mode) || seals < 0 || (static_cast<unsigned>(seals) & kSeals) != kSeals) {
    close(fd);
    return absl::FailedPreconditionError("a shared segment that is not a sealed memory file");
  }
  if (bytes <= 0 || st.st_size != bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("a shared segment of ", st.st_size, " bytes announced as ", bytes));
  }
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Errno(absl::StrCat("mapping a shared segment of ", bytes, " bytes"));
  return std::unique_ptr<ShmSegment>(new ShmSegment(static_cast<char*>(p), bytes, -1));
}

ShmSegment::~ShmSegment() {
  munmap(data_, static_cast<size_t>(size_));
  if (fd_ >= 0) close(fd_);
}

SharedHostMemory* SharedHostMemory::Default() {
  static SharedHostMemory* memory = new SharedHostMemory();
  return memory;
}

absl::StatusOr<float*> SharedHostMemory::Allocate(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("allocation of ", n, " floats"));
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(std::max<int64_t>(1, n) * 4);
  if (!seg.ok()) return seg.status();
  char* base = (*seg)->data();
  absl::MutexLock lock(&mu_);
  segments_[base] = std::shared_ptr<ShmSegment>(std::move(*seg));
  return reinterpret_cast<float*>(base);  // zero-filled by the kernel
}

void SharedHostMemory::Free(float* p) {
  if (p == nullptr) return;
  absl::MutexLock lock(&mu_);
  segments_.erase(reinterpret_cast<const char*>(p));
}

std::shared_ptr<ShmSegment> SharedHostMemory::Find(const void* p, int64_t bytes, int64_t* offset) const {
  const char* c = static_cast<const char*>(p);
  absl::MutexLock lock(&mu_);
  auto it = segments_.upper_bound(c);
  if (it == segments_.begin()) return nullptr;
  --it;
  if (!it->second->Contains(p, bytes)) return nullptr;
  *offset = c - it->second->data();
  return it->second;
}

int CountSegments(int pid) {
  const std::string proc = absl::StrCat("/proc/", pid);
  const std::string tag = absl::StrCat("/memfd:", kSegmentName);
  std::set<ino_t> inodes;
  std::ifstream maps(proc + "/maps");
  if (!maps) return -1;
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(tag) == std::string::npos) continue;
    std::istringstream fields(line);
    std::string range, perms, offset, dev;
    unsigned long inode = 0;
    fields >> range >> perms >> offset >> dev >> inode;
    inodes.insert(static_cast<ino_t>(inode));
  }
  if (DIR* dir = opendir((proc + "/fd").c_str())) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      const std::string path = absl::StrCat(proc, "/fd/", e->d_name);
      char target[256];
      const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      if (std::string(target).find(tag) == std::string::npos) continue;
      struct stat st;
      if (stat(path.c_str(), &st) == 0) inodes.insert(st.st_ino);
    }
    closedir(dir);
  }
  return static_cast<int>(inodes.size());
}

}  // namespace dtrain::ps::shm
