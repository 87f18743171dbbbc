#include "ps/tcp/tcp_lane.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dtrain::ps::tcp {
namespace {

// Frame headers and payloads are read through this buffer; bulk past what it holds goes straight to its
// destination.
constexpr size_t kReceiveBuffer = 64 << 10;
constexpr int kMaxIov = 64;

int PollMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, INT_MAX));
}

void SetOption(int fd, int level, int name, int value) { setsockopt(fd, level, name, &value, sizeof(value)); }

std::string AddressString(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof(buf));
  } else if (a.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) {  // an IPv4 peer on a dual-stack socket
      inet_ntop(AF_INET, &a6.sin6_addr.s6_addr[12], buf, sizeof(buf));
    } else {
      inet_ntop(AF_INET6, &a6.sin6_addr, buf, sizeof(buf));
    }
  }
  return buf;
}

}  // namespace

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' has no port"));
  }
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "': bad port"));
  }
  *host = h;
  *port = p;
  return absl::OkStatus();
}

TcpLane::TcpLane(int fd) : fd_(fd), rbuf_(kReceiveBuffer) {
  const int flags = fcntl(fd_, F_GETFL, 0);
  fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  SetOption(fd_, IPPROTO_TCP, TCP_NODELAY, 1);  // a frame goes out whole at once; no Nagle wait for the last bytes
  // A peer whose host went silent (powered off, partitioned) is noticed: keepalive probes after 10 s idle, and
  // data unacknowledged for 30 s ends the connection.
  SetOption(fd_, SOL_SOCKET, SO_KEEPALIVE, 1);
  SetOption(fd_, IPPROTO_TCP, TCP_KEEPIDLE, 10);
  SetOption(fd_, IPPROTO_TCP, TCP_KEEPINTVL, 5);
  SetOption(fd_, IPPROTO_TCP, TCP_KEEPCNT, 4);
  SetOption(fd_, IPPROTO_TCP, TCP_USER_TIMEOUT, 30000);
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &len) == 0) peer_ip_ = AddressString(peer);
}

TcpLane::~TcpLane() { close(fd_); }

absl::StatusOr<std::unique_ptr<TcpLane>> TcpLane::Connect(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int g = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (g != 0) return absl::UnavailableError(absl::StrCat("resolving '", host, "': ", gai_strerror(g)));
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int r = connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      r = poll(&p, 1, PollMs(deadline));
      int err = 0;
      socklen_t len = sizeof(err);
      if (r == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        r = 0;
      } else {
        errno = r == 0 ? ETIMEDOUT : (err != 0 ? err : errno);
        r = -1;
      }
    }
    if (r == 0) {
      freeaddrinfo(found);
      return std::make_unique<TcpLane>(fd);
    }
    why = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("connecting to ", host, ":", port, ": ", why));
}

absl::Status TcpLane::Closed(const char* what) const {
  return absl::UnavailableError(absl::StrCat("TCP lane ", what, ": ", dead() ? "shut down" : "the peer closed it"));
}

absl::Status TcpLane::Wait(bool write, absl::Time deadline) {
  while (true) {
    if (dead()) return Closed(write ? "send" : "receive");
    pollfd p{fd_, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int r = poll(&p, 1, PollMs(deadline));
    if (r > 0) return absl::OkStatus();  // ready, or an error/hang-up that the next call reports
    if (r == 0) {
      return absl::DeadlineExceededError(write ? "TCP lane: the peer took nothing in time"
                                               : "TCP lane: nothing arrived in time");
    }
    if (errno != EINTR) return absl::UnavailableError(absl::StrCat("TCP lane poll: ", std::strerror(errno)));
  }
}

absl::Status TcpLane::Send(TcpFrameType type, absl::string_view payload, const Bulk* bulk, int n_bulk,
                           absl::Time deadline) {
  uint64_t bulk_bytes = 0;
  for (int i = 0; i < n_bulk; ++i) bulk_bytes += bulk[i].bytes;
  const std::string header = EncodeTcpHeader(type, payload, bulk_bytes);
  std::vector<iovec> iov;
  iov.reserve(2 + n_bulk);
  iov.push_back({const_cast<char*>(header.data()), header.size()});
  if (!payload.empty()) iov.push_back({const_cast<char*>(payload.data()), payload.size()});
  for (int i = 0; i < n_bulk; ++i) {
    if (bulk[i].bytes > 0) iov.push_back({const_cast<void*>(bulk[i].data), bulk[i].bytes});
  }
  return SendAll(&iov, deadline);
}

absl::Status TcpLane::SendRaw(const Bulk* parts, int n_parts, absl::Time deadline) {
  std::vector<iovec> iov;
  iov.reserve(n_parts);
  for (int i = 0; i < n_parts; ++i) {
    if (parts[i].bytes > 0) iov.push_back({const_cast<void*>(parts[i].data), parts[i].bytes});
  }
  return SendAll(&iov, deadline);
}

absl::Status TcpLane::SendAll(std::vector<iovec>* iov_in, absl::Time deadline) {
  std::vector<iovec>& iov = *iov_in;
  size_t first = 0;
  while (first < iov.size()) {
    if (dead()) return Closed("send");
    msghdr m{};
    m.msg_iov = iov.data() + first;
    m.msg_iovlen = std::min<size_t>(iov.size() - first, kMaxIov);
    const ssize_t k = sendmsg(fd_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (absl::Status s = Wait(true, deadline); !s.ok()) return s;
        continue;
      }
      return absl::UnavailableError(absl::StrCat("TCP lane send: ", std::strerror(errno)));
    }
    bytes_sent_.fetch_add(k, std::memory_order_relaxed);
    size_t left = static_cast<size_t>(k);
    while (left > 0 && first < iov.size()) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      } else {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TcpLane::Fill(size_t n, absl::Time deadline) {
  if (rend_ - rpos_ >= n) return absl::OkStatus();
  if (rpos_ > 0) {  // keep what is left at the front
    std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
    rend_ -= rpos_;
    rpos_ = 0;
  }
  if (rbuf_.size() < n) rbuf_.resize(n);
  while (rend_ < n) {
    if (dead()) return Closed("receive");
    const ssize_t k = recv(fd_, rbuf_.data() + rend_, rbuf_.size() - rend_, MSG_DONTWAIT);
    if (k > 0) {
      rend_ += static_cast<size_t>(k);
      bytes_received_.fetch_add(k, std::memory_order_relaxed);
      continue;
    }
    if (k == 0) return Closed("receive");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("TCP lane receive: ", std::strerror(errno)));
    }
    if (absl::Status s = Wait(false, deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<TcpLane::Frame> TcpLane::Receive(absl::Time deadline) {
  if (bulk_left_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("TCP lane: ", bulk_left_, " bytes of the last frame's data are unread"));
  }
  if (absl::Status s = Fill(kTcpHeaderBytes, deadline); !s.ok()) return s;
  absl::StatusOr<TcpFrameHeader> h = DecodeTcpHeader(absl::string_view(rbuf_.data() + rpos_, kTcpHeaderBytes));
  if (!h.ok()) return h.status();
  rpos_ += kTcpHeaderBytes;
  if (absl::Status s = Fill(h->payload_bytes, deadline); !s.ok()) return s;
  Frame f;
  f.type = h->type;
  f.payload.assign(rbuf_.data() + rpos_, h->payload_bytes);
  rpos_ += h->payload_bytes;
  if (absl::Status s = CheckTcpPayload(*h, f.payload); !s.ok()) return s;
  f.bulk_bytes = h->bulk_bytes;
  bulk_left_ = h->bulk_bytes;
  return f;
}

absl::Status TcpLane::ReadBulk(void* dst, uint64_t n, absl::Time deadline) {
  if (n > bulk_left_) {
    return absl::InvalidArgumentError(absl::StrCat("TCP lane: ", n, " bytes asked of a frame with ", bulk_left_,
                                                   " bytes of data left"));
  }
  char* out = static_cast<char*>(dst);
  const size_t buffered = std::min<uint64_t>(n, rend_ - rpos_);
  if (buffered > 0) {
    std::memcpy(out, rbuf_.data() + rpos_, buffered);
    rpos_ += buffered;
  }
  uint64_t got = buffered;
  while (got < n) {
    if (dead()) return Closed("receive");
    const ssize_t k = recv(fd_, out + got, static_cast<size_t>(std::min<uint64_t>(n - got, SSIZE_MAX)), MSG_DONTWAIT);
    if (k > 0) {
      got += static_cast<uint64_t>(k);
      bytes_received_.fetch_add(k, std::memory_order_relaxed);
      continue;
    }
    if (k == 0) return Closed("receive");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("TCP lane receive: ", std::strerror(errno)));
    }
    if (absl::Status s = Wait(false, deadline); !s.ok()) return s;
  }
  bulk_left_ -= n;
  return absl::OkStatus();
}

absl::Status TcpLane::SkipBulk(absl::Time deadline) {
  char sink[16 << 10];
  while (bulk_left_ > 0) {
    const uint64_t n = std::min<uint64_t>(bulk_left_, sizeof(sink));
    if (absl::Status s = ReadBulk(sink, n, deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void TcpLane::Shutdown() {
  if (dead_.exchange(true, std::memory_order_acq_rel)) return;
  shutdown(fd_, SHUT_RDWR);  // wakes a poll of either direction
}

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int g = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (g != 0) return absl::UnavailableError(absl::StrCat("resolving '", host, "' to listen: ", gai_strerror(g)));
  std::string why = "no address";
  int fd = -1;
  // An IPv6 wildcard takes IPv4 too (dual stack): prefer it when the host names none.
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    SetOption(fd, SOL_SOCKET, SO_REUSEADDR, 1);
    if (a->ai_family == AF_INET6) SetOption(fd, IPPROTO_IPV6, IPV6_V6ONLY, 0);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("listening on ", host, ":", port, ": ", why));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(bound).sin6_port)
                                                      : ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port);
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<TcpListener>(new TcpListener(fd, wake, bound_port));
}

TcpListener::~TcpListener() {
  close(fd_);
  close(wake_);
}

void TcpListener::Shutdown() {
  shut_down_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
}

absl::StatusOr<int> TcpListener::Accept(absl::Time deadline) {
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

}  // namespace dtrain::ps::tcp
