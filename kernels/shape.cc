#include "kernels/device.h"

#include "absl/strings/str_cat.h"

namespace dtrain::kernels {

int OutputSize(int in, int k, int stride, Padding padding) {
  if (padding == Padding::kSame) return (in + stride - 1) / stride;
  return (in - k + 1 + stride - 1) / stride;
}

int PadBefore(int in, int k, int stride, Padding padding) {
  if (padding == Padding::kValid) return 0;
  const int out = OutputSize(in, k, stride, padding);
  const int total = std::max(0, (out - 1) * stride + k - in);
  return total / 2;
}

std::string DeviceSpec::ToString() const {
  return kind == Kind::kCpu ? std::string("cpu") : absl::StrCat("gpu:", gpu_index);
}

}  // namespace dtrain::kernels
