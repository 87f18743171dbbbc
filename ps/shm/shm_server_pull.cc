// ShmServer, the pull lane: a pull's values written straight into the worker's memory (ShmPullReceiver) and the
// frames that order and end it. The rest of the server: shm_server.cc; its insides: shm_server_impl.h.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps/shm/shm_server_impl.h"

namespace dtrain::ps::shm {

namespace {

using DestKind = Destination::Kind;

// Delivers a pull into the worker's memory: slices in place (fp32, straight into its parameter buffer) or into
// its staging area (the pull's wire dtype), sparse rows into the staging area; tells the worker what was
// written at every Flush.
class ShmPullReceiver : public PullReceiver {
 public:
  // What is written to the worker's memory counts in its attachment's LaneBytes.
  ShmPullReceiver(Lane* lane, Attachment* a, const PullOrder& order)
      : lane_(lane), a_(a), order_(order), bytes_sent_(&a->bytes->sent) {}

  // Resolves every destination; a transport failure when one lies outside what the worker shared.
  absl::Status Prepare() {
    const int el = DtypeBytes(order_.request.wire_dtype);
    for (const shm::Destination& d : order_.destinations) {
      if (d.length < 0 || d.length > (int64_t{1} << 40)) {
        return TransportError(absl::StrCat("shared memory: slice ", d.key, " of ", d.length, " floats"));
      }
      Target t;
      t.kind = d.kind;
      t.length = d.length;
      if (d.kind == DestKind::kInPlace) {
        ASSIGN_OR_RETURN(t.base, a_->Resolve(d.segment, d.at, d.length * 4, /*align=*/4));
        t.dtype = WireDtype::kF32;
      } else if (d.kind == DestKind::kStaging) {
        ASSIGN_OR_RETURN(t.base, a_->Resolve(d.segment, d.at, d.length * el));
        t.dtype = order_.request.wire_dtype;
      }
      targets_[d.key] = t;
    }
    for (const SparseOrder& s : order_.sparse) {
      if (s.n < 0 || s.n > (int64_t{1} << 32) || s.dim < 1 || s.dim > (1 << 20)) {
        return TransportError(absl::StrCat("shared memory: ", s.n, " rows of ", s.dim, " values"));
      }
      RowsTarget r;
      r.dim = s.dim;
      r.n = s.n;
      ASSIGN_OR_RETURN(r.base, a_->Resolve(s.segment, s.rows_at, s.n * s.dim * el));
      rows_[s.table] = r;
    }
    return absl::OkStatus();
  }

  absl::Status OnHeader(const PullHeader& header) override {
    return lane_->Send(FrameType::kPullHeader, EncodePullHeader(header));
  }
  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
    RETURN_IF_ERROR(Alive());
    auto it = targets_.find(key);
    if (it == targets_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the worker's pull names no destination for slice key ", key,
                                                     ": its placement differs from this ps task's"));
    }
    const Target& t = it->second;
    if (!RangeWithin(offset, n, t.length)) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", key, ": ", n, " floats from ", offset,
                                                     " beyond the worker's ", t.length));
    }
    if (t.kind == DestKind::kSkip) return Buffer{};
    return Buffer{t.base + offset * DtypeBytes(t.dtype), t.dtype};
  }
  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override {
    const Target& t = targets_[key];
    if (t.kind == DestKind::kSkip) return absl::OkStatus();
    bytes_sent_->fetch_add(n * DtypeBytes(t.dtype), std::memory_order_relaxed);
    pieces_.slices.push_back(SlicePiece{key, offset, n, t.dtype});
    return pieces_.slices.size() >= 1024 ? Flush() : absl::OkStatus();
  }
  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
    RETURN_IF_ERROR(Alive());
    auto it = rows_.find(table);
    if (it == rows_.end() || it->second.dim != dim || !RangeWithin(first, n, it->second.n)) {
      return absl::InvalidArgumentError(absl::StrCat(n, " rows from row ", first, " of table ", table, " (dim ",
                                                     dim, ") beyond the worker's pull"));
    }
    const int el = DtypeBytes(order_.request.wire_dtype);
    return Buffer{it->second.base + first * dim * el, order_.request.wire_dtype};
  }
  absl::Status SparseWritten(uint32_t table, int64_t first, int64_t n) override {
    bytes_sent_->fetch_add(n * rows_[table].dim * DtypeBytes(order_.request.wire_dtype), std::memory_order_relaxed);
    pieces_.rows.push_back(RowPiece{table, first, n, order_.request.wire_dtype});
    return pieces_.rows.size() >= 1024 ? Flush() : absl::OkStatus();
  }
  absl::Status Flush() override {
    if (pieces_.slices.empty() && pieces_.rows.empty()) return absl::OkStatus();
    absl::Status s = lane_->Send(FrameType::kPullPieces, EncodePieces(pieces_));
    pieces_ = PiecesWritten();
    return s;
  }

 private:
  struct Target {
    DestKind kind = DestKind::kSkip;
    char* base = nullptr;
    int64_t length = 0;
    WireDtype dtype = WireDtype::kF32;
  };
  struct RowsTarget {
    char* base = nullptr;
    int64_t n = 0;
    int dim = 0;
  };
  // The worker's memory is written only while its attachment lives.
  absl::Status Alive() const {
    if (lane_->dead() || a_->pull_cancel.cancelled()) {
      return absl::CancelledError("the worker's shared-memory attachment ended");
    }
    return absl::OkStatus();
  }

  Lane* lane_;
  Attachment* a_;
  const PullOrder& order_;
  std::atomic<int64_t>* const bytes_sent_;
  std::map<uint32_t, Target> targets_;
  std::map<uint32_t, RowsTarget> rows_;
  PiecesWritten pieces_;
};

}  // namespace

bool ShmServer::Impl::HandlePull(Lane* lane, Attachment* a, const Frame& frame, int fd) {
  if (frame.type == FrameType::kSegment) {
    AddSegment(a, frame, fd);
    return true;
  }
  if (fd >= 0) close(fd);
  if (frame.type != FrameType::kPullRequest) {
    LOG(WARNING) << "ps task " << options_.task_index << ": worker " << a->worker_id << "'s pull lane sent "
                 << FrameTypeName(frame.type) << ": closing it";
    return false;
  }
  absl::StatusOr<PullOrder> order = DecodePullOrder(frame.payload);
  if (!order.ok()) return Malformed(a, order.status()), false;
  PushResult end;
  ShmPullReceiver receiver(lane, a, *order);
  PullRequest request = order->request;
  if (request.worker_id != a->worker_id) {
    end.status = absl::PermissionDeniedError(
        absl::StrCat("a pull for worker ", request.worker_id, " on worker ", a->worker_id, "'s lane"));
  } else if (absl::Status s = receiver.Prepare(); !s.ok()) {
    end.status = s;
    end.transport_failure = true;
  } else {
    for (const SparseOrder& so : order->sparse) {
      if (absl::Status limit = CheckPullRows(options_.max_pull_rows, a->worker_id, options_.task_index, so.table, so.n);
          !limit.ok()) {
        end.status = limit;
        break;
      }
      absl::StatusOr<char*> ids = a->Resolve(so.segment, so.ids_at, so.n * 8, /*align=*/8);
      if (!ids.ok()) {
        end.status = ids.status();
        end.transport_failure = true;
        break;
      }
      const int64_t* p = reinterpret_cast<const int64_t*>(*ids);
      request.sparse.push_back(SparseIds{so.table, std::vector<int64_t>(p, p + so.n)});
    }
  }
  if (end.status.ok()) {
    // Both the attachment's end and the server's shutdown wake a pull that waits.
    Cancellation cancel;
    const int64_t id1 = a->pull_cancel.Register([&cancel] { cancel.Cancel(); });
    const int64_t id2 = options_.shutdown != nullptr ? options_.shutdown->Register([&cancel] { cancel.Cancel(); }) : 0;
    request.cancel = &cancel;
    end.status = ps_->Pull(request, &receiver);
    a->pull_cancel.Deregister(id1);
    if (options_.shutdown != nullptr) options_.shutdown->Deregister(id2);
    if (end.status.ok()) end.status = receiver.Flush();
  }
  return lane->Send(FrameType::kPullEnd, EncodePushResult(end)).ok();
}

}  // namespace dtrain::ps::shm
