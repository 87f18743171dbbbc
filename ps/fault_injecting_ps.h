// A PsInterface decorator for tests: delivers every push twice (as a client retry after a lost reply would).
// Fakes over mocks (STYLE.md).
//
// Thread-safety: as thread-safe as the wrapped PsInterface; the counters are atomic.
#ifndef DTRAIN_PS_FAULT_INJECTING_PS_H_
#define DTRAIN_PS_FAULT_INJECTING_PS_H_

#include <atomic>
#include <cstdint>

#include "ps/parameter_server.h"

namespace dtrain::ps {

class FaultInjectingPs : public PsInterface {
 public:
  struct Faults {
    bool duplicate_pushes = false;  // deliver every push twice (same request_id); return the second reply
  };
  FaultInjectingPs(PsInterface* target, Faults faults) : target_(target), faults_(faults) {}

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& r) override { return target_->Register(r); }
  absl::Status Initialize(const InitializeRequest& r) override { return target_->Initialize(r); }
  absl::StatusOr<PushResponse> Push(const PushRequest& r) override {
    ++pushes_;
    absl::StatusOr<PushResponse> first = target_->Push(r);
    if (faults_.duplicate_pushes && first.ok()) return target_->Push(r);
    return first;
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& r) override { return target_->Pull(r); }
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
