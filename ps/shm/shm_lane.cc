#include "ps/shm/shm_lane.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dtrain::ps::shm {
namespace {

// The address of abstract socket `name` (sun_path starts with a NUL byte; no file is made).
socklen_t AbstractAddress(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr->sun_path) - 1);
  std::memcpy(addr->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// Milliseconds poll() should wait until `deadline` (-1: for ever), at most `cap_ms` when cap_ms >= 0.
int PollMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Lane>> Lane::Connect(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("unix socket: ", std::strerror(errno)));
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(name, &addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int e = errno;
    close(fd);
    if (e == ECONNREFUSED || e == ENOENT) {
      return absl::UnavailableError(absl::StrCat(
          "nothing listens on the ps's shared-memory socket '@", name,
          "' from here (the ps is in another network namespace or container, or has just exited)"));
    }
    return absl::UnavailableError(absl::StrCat("connecting to '@", name, "': ", std::strerror(e)));
  }
  return std::make_unique<Lane>(fd);
}

Lane::Lane(int fd) : fd_(fd), buffer_(kFrameHeaderBytes + kMaxFramePayload, '\0') {}

Lane::~Lane() { close(fd_); }

void Lane::Shutdown() {
  dead_.store(true, std::memory_order_release);
  shutdown(fd_, SHUT_RDWR);
}

bool Lane::PeerClosed() const {
  pollfd p{fd_, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

absl::Status Lane::PeerCredentials(pid_t* pid, uid_t* uid) const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::UnavailableError(absl::StrCat("SO_PEERCRED: ", std::strerror(errno)));
  }
  *pid = cred.pid;
  *uid = cred.uid;
  return absl::OkStatus();
}

bool Lane::Readable() const {
  if (peer_ != nullptr) return peer_->load(std::memory_order_acquire) > received_;
  pollfd p{fd_, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

absl::Status Lane::Send(FrameType type, absl::string_view payload, int fd, absl::Time deadline) {
  if (dead()) return absl::UnavailableError("shared-memory lane closed");
  if (payload.size() > kMaxFramePayload) {
    return absl::ResourceExhaustedError(absl::StrCat("shared-memory frame ", FrameTypeName(type), " of ",
                                                     payload.size(), " bytes, more than ", kMaxFramePayload));
  }
  const std::string frame = EncodeFrame(type, payload);
  iovec iov{const_cast<char*>(frame.data()), frame.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  while (true) {
    const ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(frame.size())) {
      if (mine_ != nullptr) mine_->fetch_add(1, std::memory_order_release);  // the frame is in the socket
      return absl::OkStatus();
    }
    if (n >= 0) return absl::DataLossError("shared-memory lane: a frame was sent in part");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      dead_.store(true, std::memory_order_release);
      return absl::UnavailableError(absl::StrCat("shared-memory lane: the peer is gone (", std::strerror(errno), ")"));
    }
    pollfd p{fd_, POLLOUT, 0};
    const int r = poll(&p, 1, PollMs(deadline));
    if (r == 0) return absl::DeadlineExceededError("shared-memory lane: the peer stopped reading");
    if (dead()) return absl::UnavailableError("shared-memory lane closed");
  }
}

namespace {

// Spins until ready() or `until`. The first kPureSpin only pauses (the answer to a request usually comes within
// microseconds); after that each round yields the core to any thread that has work (sched_yield), so that a
// longer spin takes a core only while it would otherwise be idle. True when ready() became true.
constexpr absl::Duration kPureSpin = absl::Microseconds(20);

template <typename Ready>
bool SpinUntil(Ready ready, absl::Time until) {
  const absl::Time start = absl::Now();
  bool yielding = false;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if (yielding) {
      sched_yield();
    } else {
      __builtin_ia32_pause();
    }
    if (yielding || i % 64 == 63) {
      const absl::Time now = absl::Now();
      if (now >= until) return false;
      yielding = now - start >= kPureSpin;
    }
  }
}

}  // namespace

absl::StatusOr<Frame> Lane::Receive(absl::Time deadline, int* fd, int spin_us) {
  if (fd != nullptr) *fd = -1;
  if (spin_us < 0) spin_us = spin_us_;
  iovec iov{buffer_.data(), buffer_.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  bool spun = false;
  while (true) {
    if (dead()) return absl::UnavailableError("shared-memory lane closed");
    // The answer to a request usually comes within microseconds: watch for it a short while before sleeping,
    // since waking a sleeping thread costs tens of microseconds (an interrupt between cores, more under a
    // hypervisor), several times a step. With doorbells the watching makes no system call.
    if (spin_us > 0 && !spun) {
      spun = true;
      SpinUntil([this] { return Readable() || dead(); },
                std::min(deadline, absl::Now() + absl::Microseconds(spin_us)));
    }
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLIN, 0};
      const int r = poll(&p, 1, PollMs(deadline));
      if (r == 0) return absl::DeadlineExceededError("shared-memory lane: nothing arrived in time");
      continue;
    }
    spun = false;  // the next frame may spin again
    if (n < 0) {
      dead_.store(true, std::memory_order_release);
      return absl::UnavailableError(absl::StrCat("shared-memory lane: ", std::strerror(errno)));
    }
    // Descriptors that came along: at most one is wanted.
    int got = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int d;
        std::memcpy(&d, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (got < 0 && fd != nullptr) {
          got = d;
        } else {
          close(d);
        }
      }
    }
    if (n == 0) {
      if (got >= 0) close(got);
      dead_.store(true, std::memory_order_release);
      return absl::UnavailableError("shared-memory lane: the peer closed it");
    }
    ++received_;
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
      if (got >= 0) close(got);
      return absl::DataLossError("shared-memory lane: a frame larger than the largest allowed");
    }
    absl::StatusOr<Frame> frame = DecodeFrame(absl::string_view(buffer_.data(), static_cast<size_t>(n)));
    if (!frame.ok()) {
      if (got >= 0) close(got);
      return frame.status();
    }
    if (fd != nullptr) *fd = got;
    return frame;
  }
}

absl::StatusOr<int> Lane::WaitAny(Lane* const* lanes, int n, absl::Time deadline, int spin_us) {
  pollfd p[4];
  if (n < 1 || n > 4) return absl::InvalidArgumentError("WaitAny takes 1 to 4 lanes");
  // Spin on the doorbells (no system calls) first.
  if (spin_us > 0) {
    int found = -1;
    SpinUntil(
        [&] {
          for (int k = 0; k < n; ++k) {
            if (lanes[k]->dead() || (lanes[k]->peer_ != nullptr && lanes[k]->Readable())) {
              found = k;
              return true;
            }
          }
          return false;
        },
        std::min(deadline, absl::Now() + absl::Microseconds(spin_us)));
    if (found >= 0) {
      if (lanes[found]->dead()) return absl::UnavailableError("shared-memory lane closed");
      return found;
    }
  }
  while (true) {
    for (int i = 0; i < n; ++i) {
      if (lanes[i]->dead()) return absl::UnavailableError("shared-memory lane closed");
      p[i] = pollfd{lanes[i]->fd_, POLLIN, 0};
    }
    const int r = poll(p, static_cast<nfds_t>(n), PollMs(deadline));
    if (r > 0) {
      for (int i = 0; i < n; ++i) {
        if (p[i].revents != 0) return i;
      }
    }
    if (r == 0) return absl::DeadlineExceededError("shared-memory lanes: nothing arrived in time");
  }
}

absl::StatusOr<std::unique_ptr<LaneListener>> LaneListener::Listen(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("unix socket: ", std::strerror(errno)));
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(name, &addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("listening on '@", name, "': ", std::strerror(e)));
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<LaneListener>(new LaneListener(fd, wake, name));
}

LaneListener::~LaneListener() {
  close(fd_);
  close(wake_);
}

void LaneListener::Shutdown() {
  shut_down_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
}

absl::StatusOr<int> LaneListener::Accept(absl::Time deadline) {
  while (true) {
    if (shut_down_.load(std::memory_order_acquire)) return absl::CancelledError("listener shut down");
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return fd;
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      if (errno == EMFILE || errno == ENFILE) {
        absl::SleepFor(absl::Milliseconds(50));  // out of descriptors for now: try again soon
        continue;
      }
      return absl::UnavailableError(absl::StrCat("accept: ", std::strerror(errno)));
    }
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
    if (poll(p, 2, PollMs(deadline)) == 0) return absl::DeadlineExceededError("no connection");
  }
}

}  // namespace dtrain::ps::shm
