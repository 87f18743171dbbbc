// A lane: one Unix SOCK_SEQPACKET connection between a worker and a ps task on one host, carrying the frames of
// ps/shm/shm_frame.h (and, beside a Segment frame, a memfd). Sockets are abstract (Linux: no file, gone with the
// listener), so they live in a network namespace: a process in another one cannot reach them, and a worker
// there uses gRPC instead.
//
// Every wait has a deadline. Shutdown (any thread) ends a blocked Send or Receive at once with Unavailable; a
// lane whose peer has gone (exited, killed, shut its end) answers Unavailable too.
//
// Thread-safety: one thread sends and one thread receives at a time (they may be two); Shutdown, dead() and
// PeerClosed() from any thread.
#ifndef DTRAIN_PS_SHM_SHM_LANE_H_
#define DTRAIN_PS_SHM_SHM_LANE_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ps/shm/shm_frame.h"

namespace dtrain::ps::shm {

class Lane {
 public:
  // Connects to the abstract socket `name`. Unavailable, saying why, when nothing listens there from this
  // process's network namespace.
  static absl::StatusOr<std::unique_ptr<Lane>> Connect(const std::string& name);
  explicit Lane(int fd);  // takes the connected socket
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // Sends one frame, with `fd` attached when >= 0 (the descriptor stays the caller's).
  absl::Status Send(FrameType type, absl::string_view payload, int fd = -1,
                    absl::Time deadline = absl::InfiniteFuture());
  // The next frame. With `fd` non-null, a descriptor that came with it goes there (the caller owns it; -1 when
  // none came); without, a descriptor that came is closed. DeadlineExceeded when none came by `deadline`,
  // Unavailable when the peer closed the lane or it was shut down, DataLoss for a malformed frame. `spin_us`:
  // how long to look before sleeping, this call only (-1: the lane's, set_spin). Past the first 20 µs a spin
  // yields its core to any thread that has work.
  absl::StatusOr<Frame> Receive(absl::Time deadline, int* fd = nullptr, int spin_us = -1);
  // Ends the lane: blocked and later calls return Unavailable.
  void Shutdown();
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  // Whether the peer has closed its end (does not consume anything).
  bool PeerClosed() const;
  // The connected peer's process and effective user (SO_PEERCRED).
  absl::Status PeerCredentials(pid_t* pid, uid_t* uid) const;
  // Receive looks for a frame this long before it sleeps (0: sleeps at once). For lanes whose answers come
  // within microseconds (a push's result, a pull's pieces).
  void set_spin(int microseconds) { spin_us_ = microseconds; }
  // Doorbells in memory both ends map (a LaneDoorbells of the worker's control segment): Send counts each frame
  // in `mine` once it is in the socket, and Receive (and WaitAny) watch `peer` while they spin, so that a
  // spinning wait makes no system call. Without them a spin polls the socket.
  // Both ends call it at the same point of their exchange (after the Hello and its Welcome, before any other
  // frame): each counts only the frames after it, so the frames received before it (the Hello, the Welcome) do
  // not count, or a lone frame would not show on the doorbell and every spin would run its full length.
  void set_doorbells(std::atomic<uint64_t>* mine, std::atomic<uint64_t>* peer) {
    mine_ = mine;
    peer_ = peer;
    received_ = 0;
  }
  // Waits until one of `lanes` has a frame to read (or has closed): the index of the first such, looking
  // `spin_us` before sleeping. DeadlineExceeded at `deadline`, Unavailable when one was shut down.
  static absl::StatusOr<int> WaitAny(Lane* const* lanes, int n, absl::Time deadline, int spin_us);

 private:
  // Whether a frame is there to read, looking at the doorbell when there is one (a poll otherwise).
  bool Readable() const;

  const int fd_;
  std::atomic<bool> dead_{false};
  int spin_us_ = 0;
  std::atomic<uint64_t>* mine_ = nullptr;  // frames sent (doorbell), or null
  std::atomic<uint64_t>* peer_ = nullptr;  // frames the peer sent (doorbell), or null
  uint64_t received_ = 0;                  // frames received
  std::string buffer_;  // one frame
};

// The doorbells of one lane, in a segment both ends map (64-byte lines: no false sharing between the ends).
struct LaneDoorbells {
  alignas(64) std::atomic<uint64_t> worker_sent{0};
  alignas(64) std::atomic<uint64_t> ps_sent{0};
};
static_assert(sizeof(LaneDoorbells) == 128, "two cache lines");
// The worker's doorbell segment, sent with the Hello of each lane: the push lane's LaneDoorbells at byte 0, the
// pull lane's at byte 128.
inline constexpr int64_t kDoorbellSegmentBytes = 4096;

// Listens on an abstract socket.
class LaneListener {
 public:
  // Unavailable when the name is taken.
  static absl::StatusOr<std::unique_ptr<LaneListener>> Listen(const std::string& name);
  ~LaneListener();
  // The next connection's socket (for Lane), DeadlineExceeded at `deadline`, Cancelled after Shutdown.
  absl::StatusOr<int> Accept(absl::Time deadline);
  void Shutdown();  // any thread: wakes Accept
  const std::string& name() const { return name_; }

 private:
  LaneListener(int fd, int wake, std::string name) : fd_(fd), wake_(wake), name_(std::move(name)) {}
  const int fd_;
  const int wake_;  // eventfd that Shutdown signals
  const std::string name_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace dtrain::ps::shm

#endif  // DTRAIN_PS_SHM_SHM_LANE_H_
