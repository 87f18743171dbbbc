// The ps task's PullReceiver for a pull over a TCP lane: the ParameterServer copies each piece (a slice's floats,
// a table's rows) once, into the lane's send buffer, already framed (kPullData, kPullRows); the buffer goes out
// in one send when it holds about `flush_bytes`, when the ps has finished a slice or has nothing more ready
// (Flush), and before the header. Small pieces (biases) so travel together, and a large slice streams in
// frames the receiver writes straight into the worker's parameters.
//
// Thread-safety: one thread (the pull lane's).
#ifndef DTRAIN_PS_TCP_PULL_SENDER_H_
#define DTRAIN_PS_TCP_PULL_SENDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ps/api/slice_io.h"
#include "ps/tcp/tcp_lane.h"

namespace dtrain::ps::tcp {

class PullSender : public PullReceiver {
 public:
  // `alive` says whether the worker's attachment still stands (a pull of a gone worker stops writing).
  PullSender(TcpLane* lane, WireDtype dtype, std::function<absl::Status()> alive, int64_t flush_bytes = 1 << 20)
      : lane_(lane), dtype_(dtype), alive_(std::move(alive)), flush_bytes_(flush_bytes) {}

  absl::Status OnHeader(const PullHeader& header) override;
  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override;
  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override;
  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override;
  absl::Status SparseWritten(uint32_t table, int64_t first, int64_t n) override;
  absl::Status Flush() override;
  // Forgets what has not been sent (a pull that failed).
  void Drop() {
    size_ = 0;
    pending_ = false;
  }

 private:
  // Reserves a frame of `bulk` bytes in the buffer (its header and payload are written at Written) and returns
  // where its bulk goes.
  absl::StatusOr<Buffer> Reserve(bool rows, uint64_t bulk);
  absl::Status Complete(bool rows, const Piece& piece);

  TcpLane* lane_;
  const WireDtype dtype_;
  std::function<absl::Status()> alive_;
  const int64_t flush_bytes_;
  // Framed pieces not yet sent: [0, size_) of a buffer of capacity_ bytes, grown without zeroing (the ps writes
  // every byte of a piece).
  std::unique_ptr<char[]> out_;
  size_t size_ = 0, capacity_ = 0;
  size_t pending_at_ = 0;   // where the reserved frame begins
  uint64_t pending_bulk_ = 0;
  bool pending_ = false;    // a frame is reserved, not yet completed
  int sparse_dim_ = 0;      // of the reserved row piece
};

}  // namespace dtrain::ps::tcp

#endif  // DTRAIN_PS_TCP_PULL_SENDER_H_
