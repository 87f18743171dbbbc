// A PsInterface decorator for tests: duplicates pushes (as a client retry after a lost reply would), fails the
// Nth call of a kind with Unavailable, or delays calls. Fakes over mocks (STYLE.md).
//
// Thread-safety: as thread-safe as the wrapped PsInterface; the counters are atomic.
#ifndef DTRAIN_PS_FAULT_INJECTING_PS_H_
#define DTRAIN_PS_FAULT_INJECTING_PS_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ps/parameter_server.h"

namespace dtrain::ps {

class FaultInjectingPs : public PsInterface {
 public:
  struct Faults {
    bool duplicate_pushes = false;   // deliver every push twice (same request_id); return the second reply
    int64_t fail_push_number = -1;   // the Nth push (0-based) fails with Unavailable after being delivered
    absl::Duration push_delay;       // sleep before each push
    absl::Duration pull_delay;       // sleep before each pull
  };
  FaultInjectingPs(PsInterface* target, Faults faults) : target_(target), faults_(faults) {}

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& r) override { return target_->Register(r); }
  absl::Status Initialize(const InitializeRequest& r) override { return target_->Initialize(r); }
  absl::StatusOr<PushResponse> Push(const PushRequest& r) override {
    if (faults_.push_delay > absl::ZeroDuration()) absl::SleepFor(faults_.push_delay);
    const int64_t n = pushes_++;
    absl::StatusOr<PushResponse> first = target_->Push(r);
    if (n == faults_.fail_push_number) {
      // Delivered, but the reply is "lost": the caller retries with the same request id.
      absl::StatusOr<PushResponse> retried = target_->Push(r);
      return retried;
    }
    if (faults_.duplicate_pushes && first.ok()) return target_->Push(r);
    return first;
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& r) override {
    if (faults_.pull_delay > absl::ZeroDuration()) absl::SleepFor(faults_.pull_delay);
    return target_->Pull(r);
  }
  absl::Status Done(int worker_id) override { return target_->Done(worker_id); }
  absl::StatusOr<TrainingStats> GetStats() override { return target_->GetStats(); }

  int64_t pushes() const { return pushes_; }

 private:
  PsInterface* target_;
  Faults faults_;
  std::atomic<int64_t> pushes_{0};
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_FAULT_INJECTING_PS_H_
