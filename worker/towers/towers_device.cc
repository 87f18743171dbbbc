// Towers whose models own their device buffers (GPU towers): steps enqueued on the devices, inputs staged
// through pinned memory, per-layer averaging while backward runs, and the cluster step's per-layer parameter
// uploads and gradient downloads on the copy queues (towers.h has the overview).
#include <future>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/denormals.h"
#include "common/status_macros.h"
#include "worker/towers/towers.h"

namespace dtrain::worker {
namespace {

using kernels::Queue;

// The towers' threads meet once per layer: every tower enqueues a layer's gradients, then waits until all
// have, and the last to arrive runs the layer's average (so the events it records on the other towers'
// compute queues mark exactly that layer's work, not the rest of their backward pass). A tower that fails
// breaks the meeting: everyone waiting, and everyone arriving later, returns the error instead of waiting
// forever.
class LayerMeeting {
 public:
  explicit LayerMeeting(int parties) : parties_(parties) {}

  // Returns the status of `last` as run by the last party to arrive at `key` (or the breaking error).
  absl::Status Arrive(int64_t key, const std::function<absl::Status()>& last) {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    if (++arrived_[key] == parties_) {
      absl::Status s = last();
      done_.emplace(key, s);
      if (!s.ok()) broken_ = s;
      cv_.SignalAll();
      return s;
    }
    while (done_.count(key) == 0 && broken_.ok()) cv_.Wait(&mu_);
    auto it = done_.find(key);
    return it != done_.end() ? it->second : broken_;
  }

  void Break(const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = why;
    cv_.SignalAll();
  }

 private:
  const int parties_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<int64_t, int> arrived_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, absl::Status> done_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

kernels::Event* Towers::PooledEvent(std::vector<std::unique_ptr<kernels::Event>>* pool, size_t index,
                                    kernels::Device* dev, absl::Status* status) {
  while (pool->size() <= index) {
    absl::StatusOr<std::unique_ptr<kernels::Event>> e = dev->MakeEvent();
    if (!e.ok()) {
      *status = e.status();
      return nullptr;
    }
    pool->push_back(*std::move(e));
  }
  return (*pool)[index].get();
}

absl::Status Towers::StageInputs(const std::vector<models::HostBatch>& batches) {
  if (host_resident_)
    return absl::FailedPreconditionError("StageInputs: the towers compute in place on the host");
  if (static_cast<int>(batches.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat(batches.size(), " batches for ", size(), " towers"));
  }
  for (int t = 0; t < size(); ++t) {
    // Labels are checked on the host, so a bad one is InvalidArgument at once on every backend.
    RETURN_IF_ERROR(models_[t]->CheckTrainingBatch(batches[t]));
    RETURN_IF_ERROR(stagers_[t]->Stage(batches[t], models_[t]->device_images(), models_[t]->device_labels()));
  }
  return absl::OkStatus();
}

absl::Status Towers::EnqueueGradients(const EnqueueHooks* hooks) {
  if (host_resident_) {
    return absl::FailedPreconditionError("EnqueueGradients: the towers compute in place on the host");
  }
  auto model_hooks = [hooks](int t, models::EnqueueHooks* mh) {
    if (hooks == nullptr) return;
    if (hooks->before_forward) {
      mh->before_forward = [hooks, t](int64_t begin, int64_t end) {
        return hooks->before_forward(t, begin, end);
      };
    }
    if (hooks->loss_enqueued) mh->loss_enqueued = [hooks, t] { return hooks->loss_enqueued(t); };
  };
  if (size() == 1) {
    models::EnqueueHooks mh;
    model_hooks(0, &mh);
    if (hooks != nullptr && hooks->range_averaged) mh.gradients_enqueued = hooks->range_averaged;
    return models_[0]->EnqueueGradients(*counters_[0], 64, 0, &mh);
  }

  LayerMeeting meeting(size());
  std::vector<float*> buffers;
  for (auto& m : models_) buffers.push_back(m->device_gradients());
  auto average = [&](int64_t begin, int64_t end) -> absl::Status {
    return meeting.Arrive(begin, [&]() -> absl::Status {
      RETURN_IF_ERROR(averager_->AverageRange(buffers, begin, end - begin));
      if (hooks != nullptr && hooks->range_averaged) return hooks->range_averaged(begin, end);
      return absl::OkStatus();
    });
  };
  auto run_tower = [&](int t) -> absl::Status {
    models::EnqueueHooks mh;
    model_hooks(t, &mh);
    mh.gradients_enqueued = average;
    // Each tower draws its own dropout masks: the counter is offset by the tower index.
    absl::Status s = models_[t]->EnqueueGradients(*counters_[t], 64, static_cast<uint64_t>(t), &mh);
    if (!s.ok()) meeting.Break(s);
    return s;
  };
  std::vector<std::future<absl::Status>> futures;
  for (int t = 1; t < size(); ++t) {
    futures.push_back(std::async(std::launch::async, [&run_tower, t] {
      SetFlushDenormals();
      return run_tower(t);
    }));
  }
  absl::Status status = run_tower(0);
  for (auto& f : futures) {
    absl::Status s = f.get();
    if (status.ok()) status = s;
  }
  return status;
}

absl::StatusOr<float> Towers::ComputeOnDevices(const std::vector<models::HostBatch>& batches, int64_t step,
                                               const models::StepHooks* hooks) {
  for (int t = 0; t < size(); ++t) RETURN_IF_ERROR(counters_[t]->Set(step));
  RETURN_IF_ERROR(StageInputs(batches));

  // Tower 0's gradient downloads, in the order they were enqueued (last layer first).
  struct Download {
    int64_t begin, end;
    kernels::Event* landed;
  };
  std::vector<Download> downloads;
  std::vector<size_t> layer(size(), 0);  // per tower: layers whose parameters were uploaded so far
  EnqueueHooks eh;
  eh.before_forward = [&](int t, int64_t begin, int64_t end) -> absl::Status {
    // The pull brings the layer's parameters into host_params(); upload them on the copy queue and make the
    // compute queue wait for them (not the host: the layers before keep computing).
    if (hooks != nullptr && hooks->before_forward) RETURN_IF_ERROR(hooks->before_forward(begin, end));
    kernels::Device* dev = devices_[t].get();
    absl::Status status;
    kernels::Event* up = PooledEvent(&uploaded_[t], layer[t]++, dev, &status);
    if (up == nullptr) return status;
    RETURN_IF_ERROR(dev->CopyToDeviceAsync(host_params_ + begin, models_[t]->device_parameters() + begin,
                                           end - begin, Queue::kCopy));
    RETURN_IF_ERROR(dev->RecordEvent(up, Queue::kCopy));
    return dev->WaitEvent(up, Queue::kCompute);
  };
  eh.loss_enqueued = [&](int t) { return loss_readers_[t]->Start(models_[t]->device_loss()); };
  eh.range_averaged = [&](int64_t begin, int64_t end) -> absl::Status {
    // Copy tower 0's (averaged) gradients of the range to the host on the copy queue, behind their producer.
    kernels::Device* dev = devices_[0].get();
    absl::Status status;
    kernels::Event* landed = PooledEvent(&downloaded_, downloads.size(), dev, &status);
    if (landed == nullptr) return status;
    if (averager_ != nullptr) {
      RETURN_IF_ERROR(averager_->WaitForAverages(0, Queue::kCopy));
    } else {
      kernels::Event* produced = PooledEvent(&produced_, downloads.size(), dev, &status);
      if (produced == nullptr) return status;
      RETURN_IF_ERROR(dev->RecordEvent(produced, Queue::kCompute));
      RETURN_IF_ERROR(dev->WaitEvent(produced, Queue::kCopy));
    }
    RETURN_IF_ERROR(dev->CopyToHostAsync(models_[0]->device_gradients() + begin, host_grads_ + begin,
                                         end - begin, Queue::kCopy));
    RETURN_IF_ERROR(dev->RecordEvent(landed, Queue::kCopy));
    downloads.push_back({begin, end, landed});
    return absl::OkStatus();
  };
  absl::Status enqueued = EnqueueGradients(&eh);
  if (enqueued.ok() && averager_ != nullptr) enqueued = averager_->Join();
  // The next step's uploads (copy queue) overwrite parameters this step's compute reads until its end.
  for (int t = 0; t < size() && enqueued.ok(); ++t) {
    enqueued = devices_[t]->RecordEvent(step_done_[t].get(), Queue::kCompute);
    if (enqueued.ok()) enqueued = devices_[t]->WaitEvent(step_done_[t].get(), Queue::kCopy);
  }
  if (!enqueued.ok()) {
    for (auto& d : devices_) (void)d->Synchronize();  // nothing of the step may still touch the host buffers
    return enqueued;
  }

  // The host waits for the loss (needed before any gradient leaves), then for each range's download, in the
  // order they were enqueued; the devices keep computing meanwhile.
  double sum = 0;
  float loss = 0;
  for (int t = 0; t < size(); ++t) {
    ASSIGN_OR_RETURN(const float* l, loss_readers_[t]->Wait());
    if (t == 0) loss = *l;
    sum += *l;
  }
  if (size() > 1) loss = static_cast<float>(sum / size());
  if (hooks != nullptr && hooks->after_forward) RETURN_IF_ERROR(hooks->after_forward(loss));
  for (const Download& d : downloads) {
    RETURN_IF_ERROR(devices_[0]->SynchronizeEvent(d.landed));
    if (hooks != nullptr && hooks->gradients_ready) RETURN_IF_ERROR(hooks->gradients_ready(d.begin, d.end));
  }
  return loss;
}

}  // namespace dtrain::worker
