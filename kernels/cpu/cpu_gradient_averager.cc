// Host averaging for CPU towers: buffers[0] += buffers[k] for k = 1.., then buffers[0] *= 1/towers, chunk by
// chunk over the towers' threads (the same per-element arithmetic for any thread count), then copies of the
// mean to the other towers with kEveryTower. Synchronous: Join has nothing to order.
#include "kernels/cpu/cpu_gradient_averager.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/optimizer_math.h"

namespace dtrain::kernels::cpu {
namespace {

constexpr int64_t kChunk = int64_t{1} << 16;

class CpuGradientAverager final : public GradientAverager {
 public:
  CpuGradientAverager(int towers, int64_t n, AverageTarget target, int threads)
      : towers_(towers), n_(n), target_(target), threads_(threads) {}

  absl::Status AverageRange(const std::vector<float*>& buffers, int64_t offset, int64_t count) override {
    RETURN_IF_ERROR(CheckArguments(buffers, offset, count));
    if (towers_ == 1 || count == 0) return absl::OkStatus();
    const float inv = 1.0f / static_cast<float>(towers_);
    auto average = [&](int64_t begin, int64_t end) {
      float* mean = buffers[0] + begin;
      for (int k = 1; k < towers_; ++k) AddIntoLoop(buffers[k] + begin, mean, end - begin);
      ScaleInPlaceLoop(inv, mean, end - begin);
      if (target_ == AverageTarget::kEveryTower) {
        for (int k = 1; k < towers_; ++k)
          std::memcpy(buffers[k] + begin, mean, sizeof(float) * (end - begin));
      }
    };
    const int64_t chunks = (count + kChunk - 1) / kChunk;
    if (threads_ <= 1 || chunks < 2) {
      average(offset, offset + count);
      return absl::OkStatus();
    }
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      average(offset + c * kChunk, offset + std::min(count, (c + 1) * kChunk));
    return absl::OkStatus();
  }

  absl::Status Join() override { return absl::OkStatus(); }
  absl::Status WaitForAverages(int tower, Queue q) override {
    if (tower < 0 || tower >= towers_) {
      return absl::InvalidArgumentError(absl::StrCat("GradientAverager::WaitForAverages: no tower ", tower));
    }
    return absl::OkStatus();
  }
  int64_t size() const override { return n_; }
  int num_towers() const override { return towers_; }

 private:
  int towers_;
  int64_t n_;
  AverageTarget target_;
  int threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GradientAverager>> CreateCpuGradientAverager(std::vector<Device*> devices,
                                                                            int64_t n, AverageTarget target) {
  int threads = 0;
  for (Device* d : devices) threads += std::max(1, d->spec().threads);
  return std::unique_ptr<GradientAverager>(
      new CpuGradientAverager(static_cast<int>(devices.size()), n, target, threads));
}

}  // namespace dtrain::kernels::cpu
