#include "ps/client/worker_client.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

#include "ps/client/worker_client_internal.h"

namespace dtrain::ps {

namespace {

// g + residual rounded to `dtype` into `out`; the rounding error becomes the new residual.
void EncodeWithErrorFeedback(WireDtype dtype, const float* g, float* residual, int64_t n, char* out) {
  constexpr int64_t kBlock = 4096;
  float sum[kBlock], back[kBlock];
  const int bytes = DtypeBytes(dtype);
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; ++i) sum[i] = g[b + i] + residual[b + i];
    EncodeFloats(dtype, sum, m, out + b * bytes);
    DecodeFloats(dtype, out + b * bytes, m, back);
    for (int64_t i = 0; i < m; ++i) residual[b + i] = sum[i] - back[i];
  }
}

}  // namespace

// ---- push -------------------------------------------------------------------------------------------------------

absl::Status WorkerClient::BeginPush(int64_t step, const float* grads) {
  bool previous_active;
  {
    absl::MutexLock lock(&mu_);
    previous_active = push_active_;
  }
  // The previous push must be done before its buffer is overwritten.
  if (previous_active) RETURN_IF_ERROR(WaitPush().status());
  {
    absl::MutexLock lock(&mu_);
    push_step_ = step;
    push_status_ = absl::OkStatus();
    push_response_ = PushResponse{};
    pushes_pending_ = num_tasks();
    others_pending_ = num_tasks() - 1;
    push_active_ = true;
  }
  push_grads_ = grads;
  push_request_id_ = next_request_id_++;
  input_position_ = next_input_position_;  // the previous push is done with it
  std::fill(slice_queued_.begin(), slice_queued_.end(), 0);
  for (auto& p : pushes_) *p = TaskPush{};
  for (auto& parts : sparse_parts_) parts.clear();
  push_finishing_ = false;
  if (options_.wire_dtype != WireDtype::kF32 && residual_.empty()) {
    const int64_t n = slices_.empty() ? 0 : slices_.back().spec.flat_offset + slices_.back().spec.length;
    residual_.assign(n, 0.0f);
    encoded_.assign(n * DtypeBytes(options_.wire_dtype), 0);
  }
  return absl::OkStatus();
}

void WorkerClient::PushRange(int64_t begin, int64_t end) {
  std::vector<std::vector<int>> by_task(num_tasks());
  for (int s : SlicesIn(begin, end)) {
    const SliceSpec& spec = slices_[s].spec;
    if (slice_queued_[s] || spec.flat_offset < begin || spec.flat_offset + spec.length > end) continue;
    slice_queued_[s] = 1;
    by_task[slices_[s].task].push_back(s);
  }
  for (int t = 0; t < num_tasks(); ++t) {
    if (by_task[t].empty()) continue;
    RunOn(push_lanes_[t].get(), t, [this, t, list = std::move(by_task[t])]() mutable { SendSlices(t, std::move(list)); });
  }
}

void WorkerClient::FinishPush() {
  push_finishing_ = true;
  ReleasePullWrites();  // backward is over: a pull sent beside the push may write the new values
  // Gradient clipping: the norm of the whole gradient (every task's trainable slices), known only now that
  // every gradient is final; each task gets it after its slices (OptimizerConfig::clip_norm, ps_types.h).
  push_norm_ = -1.0;
  if (config_.optimizer.clip_norm > 0.0f) {
    double sum = 0.0;
    for (const Slice& slice : slices_) {
      if (!slice.spec.trainable) continue;
      const float* g = push_grads_ + slice.spec.flat_offset;
      for (int64_t i = 0; i < slice.spec.length; ++i) sum += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    }
    push_norm_ = std::sqrt(sum);
  }
  // Whatever was not pushed range by range goes now.
  std::vector<std::vector<int>> by_task(num_tasks());
  for (int s = 0; s < static_cast<int>(slices_.size()); ++s) {
    if (!slice_queued_[s]) {
      slice_queued_[s] = 1;
      by_task[slices_[s].task].push_back(s);
    }
  }
  // Other tasks first; ps 0's lane waits for them before it commits.
  for (int t = num_tasks() - 1; t >= 0; --t) {
    // A commit on a task reached inline (shared memory) is only sent here: the pull that follows goes right
    // behind it and the step sleeps once, for the pull's end (CompleteStartedCommit).
    const bool defer = t == 0 && tasks_[0]->PrefersInlineCalls();
    auto job = [this, t, defer, list = std::move(by_task[t])]() mutable {
      if (!list.empty()) SendSlices(t, std::move(list));
      FinishTaskPush(t, defer);
    };
    if (defer) {
      push_lanes_[0]->RunInline(std::move(job));  // on this thread, whatever the task prefers by now
    } else {
      RunOn(push_lanes_[t].get(), t, std::move(job));
    }
  }
}

void WorkerClient::CompleteStartedCommit() {
  if (!commit_started_) return;
  commit_started_ = false;
  CompleteTaskPush(0, /*norm_sent=*/push_norm_ >= 0.0);
}

void WorkerClient::AbandonPush(absl::Status why) {
  push_finishing_ = true;
  ReleasePullWrites();
  if (why.ok()) why = absl::CancelledError("push abandoned");
  for (int t = num_tasks() - 1; t >= 0; --t) {
    RunOn(push_lanes_[t].get(), t, [this, t, why] { AbandonTaskPush(t, why); });
  }
}

void WorkerClient::AbandonTaskPush(int task, const absl::Status& why) {
  // Destroying an unfinished upload cancels its stream; the task drops what it received of it.
  pushes_[task]->upload.reset();
  absl::MutexLock lock(&mu_);
  if (push_status_.ok()) push_status_ = why;
  --pushes_pending_;
  if (task > 0) --others_pending_;
  cv_.SignalAll();
}

absl::Status WorkerClient::OpenUpload(int task) {
  PushHeader header;
  header.worker_id = worker_id_;
  header.step = push_step_;  // not changed while lanes run a push
  header.request_id = push_request_id_;
  header.commit = task == 0;
  header.apply_early = header.commit && apply_early_.load();
  header.session = session(task);
  if (header.commit) header.input_position = input_position_;
  header.cancel = &inflight_;
  ASSIGN_OR_RETURN(pushes_[task]->upload, tasks_[task]->StartPush(header));
  return absl::OkStatus();
}

absl::Status WorkerClient::WriteSlice(int task, int s) {
  const SliceSpec& spec = slices_[s].spec;
  const float* g = push_grads_ + spec.flat_offset;
  if (options_.wire_dtype == WireDtype::kF32) return WriteSliceData(task, s, WireDtype::kF32, g);
  const int bytes = DtypeBytes(options_.wire_dtype);
  char* out = encoded_.data() + spec.flat_offset * bytes;
  TaskPush& p = *pushes_[task];
  // Encode once per push (a retried upload sends the same bytes again).
  if (std::find(p.sent.begin(), p.sent.end(), s) == p.sent.end()) {
    EncodeWithErrorFeedback(options_.wire_dtype, g, residual_.data() + spec.flat_offset, spec.length, out);
  }
  return WriteSliceData(task, s, options_.wire_dtype, out);
}

absl::Status WorkerClient::WriteSliceData(int task, int s, WireDtype dtype, const void* data) {
  const SliceSpec& spec = slices_[s].spec;
  SliceUpload* upload = pushes_[task]->upload.get();
  const int64_t chunk = tracing() ? upload->ChunkValues(dtype) : 0;
  if (chunk <= 0 || spec.length <= chunk) return upload->Write(spec.key, 0, spec.length, dtype, data);
  // Traced, on a transport that sends long slices in chunks: the same chunks written one by one, each an event.
  const char* bytes = static_cast<const char*>(data);
  const int el = DtypeBytes(dtype);
  for (int64_t done = 0; done < spec.length; done += chunk) {
    const int64_t n = std::min(chunk, spec.length - done);
    const int64_t began = TraceRecorder::NowNs();
    RETURN_IF_ERROR(upload->Write(spec.key, done, n, dtype, bytes + done * el));
    options_.trace->Complete(absl::StrCat("send chunk ", spec.variable), "transport", began, TraceRecorder::NowNs(),
                             push_step_, absl::StrCat("ps ", task, " floats [", done, ", ", done + n, ")"));
  }
  return absl::OkStatus();
}

absl::Status WorkerClient::Reopen(int task) {
  TaskPush& p = *pushes_[task];
  RETURN_IF_ERROR(OpenUpload(task));
  for (int s : p.sent) RETURN_IF_ERROR(WriteSlice(task, s));
  for (const SparsePart* part : p.sparse_sent) RETURN_IF_ERROR(WriteSparsePart(task, *part));
  return absl::OkStatus();
}

absl::Status WorkerClient::WriteSparsePart(int task, const SparsePart& part) {
  const WireDtype dtype = options_.wire_dtype;
  const void* data = dtype == WireDtype::kF32 ? static_cast<const void*>(part.grads.data()) : part.encoded.data();
  return pushes_[task]->upload->WriteSparse(part.table, part.ids.data(), static_cast<int64_t>(part.ids.size()),
                                            part.dim, dtype, data);
}

void WorkerClient::SendSparse(int task, SparsePart* part) {
  TaskPush& p = *pushes_[task];
  if (!p.status.ok()) return;
  p.status = WithRetries("push", task, [&](bool retry) -> absl::Status {
    if (retry || !p.upload) RETURN_IF_ERROR(Reopen(task));
    if (std::find(p.sparse_sent.begin(), p.sparse_sent.end(), part) == p.sparse_sent.end()) {
      RETURN_IF_ERROR(WriteSparsePart(task, *part));
      p.sparse_sent.push_back(part);
    }
    return absl::OkStatus();
  });
}

absl::Status WorkerClient::PushSparse(uint32_t table, const int64_t* ids, int64_t n, const float* grads) {
  if (table >= config_.tables.size()) {
    return absl::InvalidArgumentError(absl::StrCat("PushSparse: no sparse table ", table, " (the config has ",
                                                   config_.tables.size(), ")"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!push_active_ || push_finishing_) {
      return absl::FailedPreconditionError("PushSparse outside a push (call it between BeginPush and FinishPush)");
    }
  }
  if (n < 0 || (n > 0 && (ids == nullptr || grads == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("PushSparse: ", n, " rows without ids or gradients"));
  }
  const int dim = config_.tables[table].dim;
  std::vector<std::unique_ptr<SparsePart>> parts(num_tasks());
  for (auto& part : parts) {
    part = std::make_unique<SparsePart>();
    part->table = table;
    part->dim = dim;
  }
  for (int64_t i = 0; i < n; ++i) {
    SparsePart& part = *parts[ShardOfId(ids[i], num_tasks())];
    part.ids.push_back(ids[i]);
    part.grads.insert(part.grads.end(), grads + i * dim, grads + (i + 1) * dim);
  }
  for (int t = 0; t < num_tasks(); ++t) {
    if (parts[t]->ids.empty()) continue;
    SparsePart* part = parts[t].get();
    if (options_.wire_dtype != WireDtype::kF32) {
      part->encoded.resize(part->grads.size() * DtypeBytes(options_.wire_dtype));
      EncodeFloats(options_.wire_dtype, part->grads.data(), static_cast<int64_t>(part->grads.size()),
                   part->encoded.data());
    }
    sparse_parts_[t].push_back(std::move(parts[t]));
    RunOn(push_lanes_[t].get(), t, [this, t, part] { SendSparse(t, part); });
  }
  return absl::OkStatus();
}

void WorkerClient::SendSlices(int task, std::vector<int> list) {
  TaskPush& p = *pushes_[task];
  if (!p.status.ok()) return;
  p.status = WithRetries("push", task, [&](bool retry) -> absl::Status {
    if (retry || !p.upload) RETURN_IF_ERROR(Reopen(task));
    for (int s : list) {
      if (std::find(p.sent.begin(), p.sent.end(), s) != p.sent.end()) continue;
      const int64_t began = tracing() ? TraceRecorder::NowNs() : 0;
      RETURN_IF_ERROR(WriteSlice(task, s));
      if (began != 0) {
        options_.trace->Complete(absl::StrCat("send ", slices_[s].spec.variable), "transport", began,
                                 TraceRecorder::NowNs(), push_step_, absl::StrCat("ps ", task));
      }
      p.sent.push_back(s);
    }
    return absl::OkStatus();
  });
}

void WorkerClient::FinishTaskPush(int task, bool defer) {
  TaskPush& p = *pushes_[task];
  if (p.status.ok() && task == 0 && num_tasks() > 1) {
    TraceSpan span(options_.trace, "wait other tasks' uploads", "transport", push_step_);
    // A committed push is complete everywhere: wait for the other tasks' uploads.
    absl::MutexLock lock(&mu_);
    p.status = AwaitWithDeadline(
        absl::Condition(
            +[](WorkerClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) { return c->others_pending_ == 0; }, this),
        "waiting for the other ps tasks to take the push");
    if (p.status.ok() && !push_status_.ok()) p.status = push_status_;
  }
  if (defer && p.status.ok() && p.upload != nullptr) {
    absl::Status norm = push_norm_ >= 0.0 ? p.upload->SetGradientNorm(push_norm_) : absl::OkStatus();
    if (norm.ok() && p.upload->StartFinish()) {
      commit_started_ = true;  // completed by the pull behind it, or by WaitPush
      return;
    }
    CompleteTaskPush(task, /*norm_sent=*/norm.ok() && push_norm_ >= 0.0, norm);
    return;
  }
  CompleteTaskPush(task, /*norm_sent=*/false);
}

void WorkerClient::CompleteTaskPush(int task, bool norm_sent, absl::Status first_error) {
  TaskPush& p = *pushes_[task];
  TraceSpan span(options_.trace,
                 !tracing() ? std::string() : task == 0 ? "push commit ps 0" : absl::StrCat("push end ps ", task),
                 "transport", push_step_);
  PushResponse response;
  if (p.status.ok()) {
    p.status = WithRetries("push", task, [&](bool retry) -> absl::Status {
      if (!retry) RETURN_IF_ERROR(first_error);
      if (retry || !p.upload) RETURN_IF_ERROR(Reopen(task));
      // The upload in hand already carries the norm (FinishTaskPush sent it); a new one gets it again.
      if (push_norm_ >= 0.0 && (retry || !norm_sent)) RETURN_IF_ERROR(p.upload->SetGradientNorm(push_norm_));
      absl::StatusOr<PushResponse> r = p.upload->Finish();
      p.upload.reset();
      if (!r.ok()) return r.status();
      response = *r;
      return absl::OkStatus();
    });
  }
  p.upload.reset();
  absl::MutexLock lock(&mu_);
  if (task == 0) push_response_ = response;
  if (!p.status.ok() && push_status_.ok()) push_status_ = p.status;
  --pushes_pending_;
  if (task > 0) --others_pending_;
  cv_.SignalAll();
}

absl::StatusOr<PushResponse> WorkerClient::WaitPush() {
  CompleteStartedCommit();  // no pull followed it
  absl::MutexLock lock(&mu_);
  if (push_active_) {
    RETURN_IF_ERROR(AwaitWithDeadline(
        absl::Condition(
            +[](WorkerClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) { return c->pushes_pending_ == 0; }, this),
        "waiting for the push to complete"));
    push_active_ = false;
    if (push_status_.ok() && options_.push_journal != nullptr) {
      options_.push_journal->Acknowledged(worker_id_, push_step_, push_request_id_, push_response_);
    }
  }
  if (!push_status_.ok()) return Explain(push_status_);
  return push_response_;
}

absl::StatusOr<PushResponse> WorkerClient::Push(int64_t step, const float* grads) {
  RETURN_IF_ERROR(BeginPush(step, grads));
  FinishPush();
  return WaitPush();
}

absl::StatusOr<PushResponse> WorkerClient::Push(int64_t step, const float* grads,
                                                const std::vector<SparseGradients>& sparse) {
  RETURN_IF_ERROR(BeginPush(step, grads));
  for (const SparseGradients& g : sparse) {
    if (absl::Status s = PushSparse(g.table, g.ids, g.n, g.grads); !s.ok()) {
      AbandonPush(s);
      WaitPush().status().IgnoreError();
      return s;
    }
  }
  FinishPush();
  return WaitPush();
}

}  // namespace dtrain::ps
