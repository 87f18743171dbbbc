// Internal to dtrain_ps_client: the parts of WorkerClient its source files share (worker_client.cc,
// worker_client_connect.cc, worker_client_push.cc, worker_client_pull.cc). Not for use outside them.
#ifndef DTRAIN_PS_CLIENT_WORKER_CLIENT_INTERNAL_H_
#define DTRAIN_PS_CLIENT_WORKER_CLIENT_INTERNAL_H_

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <glog/logging.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "ps/client/worker_client.h"

namespace dtrain::ps {

// One task's part of the push in flight. Owned by the task's push lane while the push runs.
struct WorkerClient::TaskPush {
  std::unique_ptr<SliceUpload> upload;
  std::vector<int> sent;  // slices written to this upload (a retried upload writes them again)
  std::vector<SparsePart*> sparse_sent;  // sparse parts written to it (likewise)
  absl::Status status;
};

// Writes one task's pulled slices into the flat parameter buffer; used by the task's pull lane only.
class WorkerClient::Receiver : public PullReceiver {
 public:
  Receiver(WorkerClient* client, int task)
      : client_(client), task_(task), received_(client->slices_.size(), 0), done_(client->slices_.size(), 0) {}

  // Before a new pull (after the client set its sparse_): nothing has arrived.
  void Reset() {
    std::fill(received_.begin(), received_.end(), 0);
    std::fill(done_.begin(), done_.end(), 0);
    header_seen_ = false;
    tentative_ = false;
    const size_t tables = client_->sparse_.size();
    rows_received_.assign(tables, 0);
    rows_done_.assign(tables, 0);
    for (size_t i = 0; i < tables; ++i) rows_done_[i] = client_->sparse_[i].ids[task_].empty();
  }
  // Before a retried attempt: slices and tables that arrived whole stay; partial ones start again.
  // After a tentative attempt nothing stays: its values were taken back.
  void Restart() {
    for (size_t s = 0; s < received_.size(); ++s) {
      if (tentative_) done_[s] = 0;
      if (!done_[s]) received_[s] = 0;
    }
    for (size_t i = 0; i < rows_received_.size(); ++i) {
      if (tentative_) rows_done_[i] = client_->sparse_[i].ids[task_].empty();
      if (!rows_done_[i]) rows_received_[i] = 0;
    }
    tentative_ = false;
  }
  bool complete() const {
    for (int s : client_->task_slices_[task_]) {
      if (!done_[s]) return false;
    }
    for (char d : rows_done_) {
      if (!d) return false;
    }
    return true;
  }

  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
    const int i = table < client_->sparse_index_.size() ? client_->sparse_index_[table] : -1;
    if (i < 0) return absl::DataLossError(absl::StrCat("ps task ", task_, " sent rows of table ", table, " unasked"));
    SparsePull& sp = client_->sparse_[i];
    if (dim != sp.dim) {
      return absl::DataLossError(absl::StrCat("ps task ", task_, " sent rows of ", dim, " values for table ", table,
                                              " of dim ", sp.dim));
    }
    if (rows_done_[i]) return Buffer{};  // arrived whole in an earlier attempt
    RETURN_IF_ERROR(client_->AwaitPullWritable());
    if (first == 0) rows_received_[i] = 0;
    const int64_t want = static_cast<int64_t>(sp.ids[task_].size());
    if (first != rows_received_[i] || n < 0 || n > want - first) {
      return absl::DataLossError(absl::StrCat("ps task ", task_, " sent rows [", first, ", ", first + n,
                                              ") of table ", table, " after ", rows_received_[i], " of ", want));
    }
    float* dst = client_->num_tasks() == 1 ? sp.rows + first * dim : sp.scratch[task_].data() + first * dim;
    return Buffer{dst, WireDtype::kF32};
  }

  absl::Status SparseWritten(uint32_t table, int64_t first, int64_t n) override {
    const int i = client_->sparse_index_[table];
    if (rows_done_[i]) return absl::OkStatus();
    SparsePull& sp = client_->sparse_[i];
    if (client_->num_tasks() > 1) {  // back to the caller's order
      const int dim = sp.dim;
      const float* src = sp.scratch[task_].data();
      const int64_t* position = sp.position[task_].data();
      for (int64_t k = first; k < first + n; ++k) {
        std::copy_n(src + k * dim, dim, sp.rows + position[k] * dim);
      }
    }
    rows_received_[i] += n;
    if (rows_received_[i] == static_cast<int64_t>(sp.ids[task_].size())) {
      rows_done_[i] = 1;
      client_->SparseArrived(i);
    }
    return absl::OkStatus();
  }

  absl::Status OnHeader(const PullHeader& header) override {
    if (task_ == 0 && !header_seen_) client_->OnPullHeader(header);
    header_seen_ = true;
    tentative_ = header.tentative;
    return absl::OkStatus();
  }

  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
    const int s = key < client_->slice_of_key_.size() ? client_->slice_of_key_[key] : -1;
    if (s < 0 || client_->slices_[s].task != task_) {
      return absl::DataLossError(absl::StrCat("ps task ", task_, " sent slice key ", key, ", which it does not hold"));
    }
    const SliceSpec& spec = client_->slices_[s].spec;
    if (done_[s]) return Buffer{};  // arrived whole in an earlier attempt
    RETURN_IF_ERROR(client_->AwaitPullWritable());
    if (offset == 0) received_[s] = 0;
    if (client_->tracing()) {
      chunk_began_ns_[s] = TraceRecorder::NowNs();
      if (offset == 0) began_ns_[s] = chunk_began_ns_[s];
    }
    if (offset != received_[s] || n < 0 || offset + n > spec.length) {
      return absl::DataLossError(absl::StrCat("ps task ", task_, " sent floats [", offset, ", ", offset + n,
                                              ") of '", spec.variable, "' after ", received_[s], " of ",
                                              spec.length));
    }
    return Buffer{client_->pull_params_ + spec.flat_offset + offset, WireDtype::kF32};
  }

  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override {
    const int s = client_->slice_of_key_[key];
    if (done_[s]) return absl::OkStatus();
    received_[s] += n;
    if (n < client_->slices_[s].spec.length && client_->tracing() && chunk_began_ns_[s] != 0) {
      // A slice that arrives in pieces (gRPC's chunks): each piece's copy into the parameters is an event.
      TraceRecorder* trace = client_->options_.trace;
      trace->Complete(absl::StrCat("receive chunk ", client_->slices_[s].spec.variable), "transport",
                      chunk_began_ns_[s], TraceRecorder::NowNs(), trace->step(),
                      absl::StrCat("ps ", task_, " floats [", offset, ", ", offset + n, ")"));
    }
    chunk_began_ns_[s] = 0;
    if (received_[s] == client_->slices_[s].spec.length) {
      done_[s] = 1;
      if (client_->tracing() && began_ns_[s] != 0) {
        TraceRecorder* trace = client_->options_.trace;
        trace->Complete(absl::StrCat("receive ", client_->slices_[s].spec.variable), "transport", began_ns_[s],
                        TraceRecorder::NowNs(), trace->step(), absl::StrCat("ps ", task_));
        began_ns_[s] = 0;
      }
      client_->SliceArrived(s);
    }
    return absl::OkStatus();
  }

 private:
  WorkerClient* client_;
  const int task_;
  std::vector<int64_t> received_;  // floats per slice (global index)
  std::vector<int64_t> began_ns_ = std::vector<int64_t>(client_->slices_.size(), 0);  // tracing: its first floats
  // Tracing: each slice's last Destination call (the piece its Written ends; striped gRPC pulls deliver
  // different slices' pieces interleaved).
  std::vector<int64_t> chunk_began_ns_ = std::vector<int64_t>(client_->slices_.size(), 0);
  std::vector<char> done_;
  std::vector<int64_t> rows_received_;  // per table of the pull (index in client_->sparse_)
  std::vector<char> rows_done_;
  bool header_seen_ = false;
  bool tentative_ = false;  // this attempt's header said so
};

namespace worker_client_internal {

// Uploads are retried when the task is unreachable or too slow to answer; pulls only when it is unreachable
// (a pull that timed out waiting for its step has waited long enough).
inline bool Retryable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded;
}
inline bool RetryablePull(const absl::Status& s) { return s.code() == absl::StatusCode::kUnavailable; }

// "until 12:04:31 (at most 5m, 4m54s left)": the deadline of a wait, for its log lines.
// The pause before the next try: `backoff`, cut so that the last try starts just past the deadline (the limit a
// wait states is the limit it keeps, not a second more).
inline absl::Duration PauseBefore(absl::Time give_up, absl::Duration backoff) {
  return std::min(backoff, std::max(give_up - absl::Now() + absl::Milliseconds(1), absl::ZeroDuration()));
}

inline std::string Until(absl::Time give_up, absl::Duration wait) {
  const absl::Duration left = std::max(absl::ZeroDuration(), give_up - absl::Now());
  return absl::StrCat("until ", absl::FormatTime("%H:%M:%S", give_up, absl::LocalTimeZone()), " (at most ",
                      absl::FormatDuration(wait), ", ", absl::FormatDuration(absl::Trunc(left, absl::Seconds(1))),
                      " left)");
}

}  // namespace worker_client_internal

// Runs `op(retry)` until it succeeds, fails for good, or the retry window closes; used by every call to a task.
template <typename Op>
absl::Status WorkerClient::WithRetries(const char* what, int task, Op op) {
  const bool pull = std::string_view(what) == "pull";
  const absl::Time give_up = absl::Now() + options_.retry_window;
  absl::Duration backoff = options_.initial_backoff;
  for (bool retry = false;; retry = true) {
    const absl::Time started = absl::Now();
    absl::Status s = op(retry);
    if (s.ok()) return s;
    if (cancel_.cancelled() || inflight_.cancelled()) return absl::CancelledError(absl::StrCat(what, " cancelled"));
    // Retried while the next try would still start within the window. Judged by when the failed try started,
    // not by the clock now: a process paused (SIGSTOP, a frozen VM) past the window during a try gets one more
    // try on waking, and one paused during the backoff below makes its try on waking before it gives up.
    if (!(pull ? worker_client_internal::RetryablePull(s) : worker_client_internal::Retryable(s)) || started + backoff > give_up) {
      return absl::Status(s.code(), absl::StrCat(what, " to ps task ", task, ": ", s.message()));
    }
    VLOG(1) << what << " to ps task " << task << " failed (" << s << "), retrying";
    absl::MutexLock lock(&mu_);
    const absl::Time until = absl::Now() + backoff;
    while (!cancel_.cancelled() && !cv_.WaitWithDeadline(&mu_, until)) {
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CLIENT_WORKER_CLIENT_INTERNAL_H_
