#include "ps/tcp/pull_sender.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::ps::tcp {
namespace {

// A piece's payload: 21 bytes for a slice's, 25 for a table's rows (tcp_frame.cc).
size_t HeadBytes(bool rows) { return kTcpHeaderBytes + (rows ? 25 : 21); }

}  // namespace

absl::Status PullSender::OnHeader(const PullHeader& header) {
  RETURN_IF_ERROR(Flush());
  return lane_->Send(TcpFrameType::kPullHeader, shm::EncodePullHeader(header));
}

absl::StatusOr<PullReceiver::Buffer> PullSender::Reserve(bool rows, uint64_t bulk) {
  RETURN_IF_ERROR(alive_());
  if (pending_) return absl::InternalError("PullSender: a piece was reserved twice without Written");
  const size_t need = size_ + HeadBytes(rows) + bulk;
  if (need > capacity_) {
    const size_t capacity = std::max<size_t>(need, std::max<size_t>(2 * capacity_, flush_bytes_ + (1 << 20)));
    std::unique_ptr<char[]> grown(new char[capacity]);  // not zeroed
    if (size_ > 0) std::memcpy(grown.get(), out_.get(), size_);
    out_ = std::move(grown);
    capacity_ = capacity;
  }
  pending_at_ = size_;
  pending_bulk_ = bulk;
  pending_ = true;
  size_ = need;
  return Buffer{out_.get() + pending_at_ + HeadBytes(rows), dtype_};
}

absl::Status PullSender::Complete(bool rows, const Piece& piece) {
  if (!pending_) return absl::InternalError("PullSender: Written without a Destination");
  pending_ = false;
  ASSIGN_OR_RETURN(const uint64_t bulk, PieceBulkBytes(piece, rows));
  if (bulk != pending_bulk_) return absl::InternalError("PullSender: a piece of another size than its Destination");
  const std::string payload = rows ? EncodeRowPiece(piece) : EncodeSlicePiece(piece);
  const std::string header = EncodeTcpHeader(rows ? TcpFrameType::kPullRows : TcpFrameType::kPullData, payload, bulk);
  char* at = out_.get() + pending_at_;
  std::memcpy(at, header.data(), header.size());
  std::memcpy(at + header.size(), payload.data(), payload.size());
  return static_cast<int64_t>(size_) >= flush_bytes_ ? Flush() : absl::OkStatus();
}

absl::StatusOr<PullReceiver::Buffer> PullSender::Destination(uint32_t key, int64_t offset, int64_t n) {
  ASSIGN_OR_RETURN(const uint64_t bulk, PieceBulkBytes(Piece{key, offset, n, dtype_, 0}, false));
  return Reserve(false, bulk);
}

absl::Status PullSender::Written(uint32_t key, int64_t offset, int64_t n) {
  return Complete(false, Piece{key, offset, n, dtype_, 0});
}

absl::StatusOr<PullReceiver::Buffer> PullSender::SparseDestination(uint32_t table, int64_t first, int64_t n,
                                                                   int dim) {
  ASSIGN_OR_RETURN(const uint64_t bulk, PieceBulkBytes(Piece{table, first, n, dtype_, dim}, true));
  sparse_dim_ = dim;
  return Reserve(true, bulk);
}

absl::Status PullSender::SparseWritten(uint32_t table, int64_t first, int64_t n) {
  return Complete(true, Piece{table, first, n, dtype_, sparse_dim_});
}

absl::Status PullSender::Flush() {
  if (size_ == 0 || pending_) return absl::OkStatus();  // a piece being written goes with the next flush
  const TcpLane::Bulk all{out_.get(), size_};
  size_ = 0;
  return lane_->SendRaw(&all, 1);
}

}  // namespace dtrain::ps::tcp
