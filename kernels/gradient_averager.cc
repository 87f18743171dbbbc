// GradientAverager's shared, backend-independent part; the factory is in create_device.cc.
#include "kernels/gradient_averager.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::kernels {

absl::Status GradientAverager::AverageInPlace(const std::vector<float*>& buffers) {
  RETURN_IF_ERROR(AverageRange(buffers, 0, size()));
  return Join();
}

absl::Status GradientAverager::CheckArguments(const std::vector<float*>& buffers, int64_t offset,
                                              int64_t count) const {
  if (static_cast<int>(buffers.size()) != num_towers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GradientAverager: ", buffers.size(), " buffers for ", num_towers(), " towers"));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("GradientAverager: buffer ", i, " is null"));
  }
  if (offset < 0 || count < 0 || offset > size() - count) {
    return absl::InvalidArgumentError(absl::StrCat("GradientAverager: range [", offset, ", ", offset, " + ",
                                                   count, ") is outside [0, ", size(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::kernels
