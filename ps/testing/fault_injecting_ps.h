// A PsInterface decorator for tests: delivers every push twice (as a client retry after a lost reply would),
// slices and sparse rows alike.
// Fakes over mocks (STYLE.md).
//
// Thread-safety: as thread-safe as the wrapped PsInterface; the counters are atomic.
#ifndef DTRAIN_PS_TESTING_FAULT_INJECTING_PS_H_
#define DTRAIN_PS_TESTING_FAULT_INJECTING_PS_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "ps/api/ps_interface.h"

namespace dtrain::ps {

class FaultInjectingPs : public ForwardingPs {
 public:
  struct Faults {
    // Deliver every push twice: after the first upload finishes, the same pieces go again under the same
    // header (request id), as a retry after a lost reply; the first reply is returned.
    bool duplicate_pushes = false;
  };
  FaultInjectingPs(PsInterface* target, Faults faults) : ForwardingPs(target), faults_(faults) {}

  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& header) override {
    ++pushes_;
    absl::StatusOr<std::unique_ptr<SliceUpload>> upload = target()->StartPush(header);
    if (!upload.ok() || !faults_.duplicate_pushes) return upload;
    return std::unique_ptr<SliceUpload>(new TwiceUpload(target(), header, *std::move(upload)));
  }

  int64_t pushes() const { return pushes_; }

 private:
  // Forwards pieces and keeps a copy; Finish replays them in a second upload with the same header.
  class TwiceUpload : public SliceUpload {
   public:
    TwiceUpload(PsInterface* target, PushHeader header, std::unique_ptr<SliceUpload> first)
        : target_(target), header_(header), first_(std::move(first)) {}
    absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
      const char* bytes = static_cast<const char*>(data);
      pieces_.push_back(Piece{key, offset, n, dtype, std::vector<char>(bytes, bytes + n * DtypeBytes(dtype))});
      return first_->Write(key, offset, n, dtype, data);
    }
    int64_t ChunkValues(WireDtype dtype) const override { return first_->ChunkValues(dtype); }
    absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                             const void* rows) override {
      const char* bytes = static_cast<const char*>(rows);
      Piece p{table, -1, n, dtype, std::vector<char>(bytes, bytes + n * dim * DtypeBytes(dtype))};
      p.ids.assign(ids, ids + n);
      p.dim = dim;
      pieces_.push_back(std::move(p));
      return first_->WriteSparse(table, ids, n, dim, dtype, rows);
    }
    absl::Status SetGradientNorm(double norm) override {
      norm_ = norm;
      return first_->SetGradientNorm(norm);
    }
    absl::StatusOr<PushResponse> Finish() override {
      absl::StatusOr<PushResponse> first = first_->Finish();
      if (!first.ok()) return first;
      absl::StatusOr<std::unique_ptr<SliceUpload>> again = target_->StartPush(header_);
      if (!again.ok()) return again.status();
      for (const Piece& p : pieces_) {
        absl::Status s = p.offset < 0 ? (*again)->WriteSparse(p.key, p.ids.data(), p.n, p.dim, p.dtype, p.bytes.data())
                                      : (*again)->Write(p.key, p.offset, p.n, p.dtype, p.bytes.data());
        if (!s.ok()) return s;
      }
      if (norm_) {
        if (absl::Status s = (*again)->SetGradientNorm(*norm_); !s.ok()) return s;
      }
      absl::StatusOr<PushResponse> second = (*again)->Finish();
      if (!second.ok()) return second.status();
      return first;
    }

   private:
    struct Piece {
      uint32_t key;       // or the table, for sparse rows
      int64_t offset, n;  // offset -1: sparse rows (n ids)
      WireDtype dtype;
      std::vector<char> bytes;
      std::vector<int64_t> ids = {};
      int dim = 0;
    };
    PsInterface* target_;
    PushHeader header_;
    std::unique_ptr<SliceUpload> first_;
    std::vector<Piece> pieces_;
    std::optional<double> norm_;
  };

  Faults faults_;
  std::atomic<int64_t> pushes_{0};
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_TESTING_FAULT_INJECTING_PS_H_
