// A TCP lane: one TCP connection between a worker and a ps task carrying the frames of ps/tcp/tcp_frame.h. A
// frame's bulk (tensor data) is sent with one sendmsg gathering header, payload and the caller's own buffers (no
// copy in user space), and received straight into the caller's destination (ReadBulk): only the frame headers
// pass through the lane's small receive buffer.
//
// Every wait has a deadline. Shutdown (any thread) ends a blocked Send or Receive at once with Unavailable; a
// lane whose peer has gone (exited, killed, closed its end) answers Unavailable too, and one whose peer's host
// went silent is dropped by TCP keepalive and the user timeout (about 30 s) rather than waiting forever.
//
// Thread-safety: one thread sends and one thread receives at a time (they may be two); Shutdown, dead(),
// peer_ip() and the counters from any thread.
#ifndef DTRAIN_PS_TCP_TCP_LANE_H_
#define DTRAIN_PS_TCP_TCP_LANE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <sys/uio.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ps/tcp/tcp_frame.h"

namespace dtrain::ps::tcp {

class TcpLane {
 public:
  // Connects to `host` (a name, an IPv4 address, or an IPv6 one with or without brackets) at `port` by
  // `deadline`. Unavailable, saying why, when nothing accepts there.
  static absl::StatusOr<std::unique_ptr<TcpLane>> Connect(const std::string& host, int port, absl::Time deadline);
  explicit TcpLane(int fd);  // takes a connected socket and sets the lane's options on it
  ~TcpLane();
  TcpLane(const TcpLane&) = delete;
  TcpLane& operator=(const TcpLane&) = delete;

  // Data that follows a frame's payload: the caller's bytes, sent in place.
  struct Bulk {
    const void* data = nullptr;
    size_t bytes = 0;
  };
  // Sends one frame whose bulk is `bulk[0..n_bulk)` back to back.
  absl::Status Send(TcpFrameType type, absl::string_view payload, const Bulk* bulk = nullptr, int n_bulk = 0,
                    absl::Time deadline = absl::InfiniteFuture());
  // Sends bytes that are frames already (encoded with EncodeTcpHeader by the caller), back to back.
  absl::Status SendRaw(const Bulk* parts, int n_parts, absl::Time deadline = absl::InfiniteFuture());

  struct Frame {
    TcpFrameType type = TcpFrameType::kHello;
    std::string payload;
    uint64_t bulk_bytes = 0;  // to be read (ReadBulk) or skipped (SkipBulk) before the next Receive
  };
  // The next frame's header and payload (checked). FailedPrecondition while the previous frame's bulk is unread,
  // DeadlineExceeded when none came by `deadline`, Unavailable when the peer closed the lane or it was shut
  // down, DataLoss for a malformed header or payload.
  absl::StatusOr<Frame> Receive(absl::Time deadline);
  // The next `n` bytes of the current frame's bulk into `dst`. InvalidArgument for more than is left of it.
  absl::Status ReadBulk(void* dst, uint64_t n, absl::Time deadline);
  // Reads and drops what is left of the current frame's bulk.
  absl::Status SkipBulk(absl::Time deadline);
  uint64_t bulk_left() const { return bulk_left_; }

  // Ends the lane: blocked and later calls return Unavailable. Idempotent.
  void Shutdown();
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  // The peer's IP address ("10.0.0.2", "::1"), or empty when unknown.
  const std::string& peer_ip() const { return peer_ip_; }
  int64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  int64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }

 private:
  // Sends every byte of `iov` (which it changes), gathering them with sendmsg.
  absl::Status SendAll(std::vector<struct iovec>* iov, absl::Time deadline);
  // Waits until the socket is readable (or writable), by `deadline`.
  absl::Status Wait(bool write, absl::Time deadline);
  // Reads at least `n` bytes into the receive buffer.
  absl::Status Fill(size_t n, absl::Time deadline);
  absl::Status Closed(const char* what) const;

  const int fd_;
  std::atomic<bool> dead_{false};
  std::string peer_ip_;
  std::vector<char> rbuf_;  // bytes received ahead: [rpos_, rend_)
  size_t rpos_ = 0, rend_ = 0;
  uint64_t bulk_left_ = 0;
  std::atomic<int64_t> bytes_sent_{0}, bytes_received_{0};
};

// Listens on a TCP port.
class TcpListener {
 public:
  // Binds `host` ("0.0.0.0", "::", an address of this host, a name; empty: every address) at `port` (0: any
  // free one). Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host, int port);
  ~TcpListener();
  // The next connection's socket (for TcpLane), DeadlineExceeded at `deadline`, Cancelled after Shutdown.
  absl::StatusOr<int> Accept(absl::Time deadline);
  void Shutdown();  // any thread: wakes Accept
  int port() const { return port_; }

 private:
  TcpListener(int fd, int wake, int port) : fd_(fd), wake_(wake), port_(port) {}
  const int fd_;
  const int wake_;  // eventfd that Shutdown signals
  const int port_;
  std::atomic<bool> shut_down_{false};
};

// "host:port" -> host (brackets of an IPv6 address removed) and port; InvalidArgument otherwise.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace dtrain::ps::tcp

#endif  // DTRAIN_PS_TCP_TCP_LANE_H_
