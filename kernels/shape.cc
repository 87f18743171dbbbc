#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"

namespace dtrain::kernels {

absl::Status CheckInteractionParams(const char* op, const InteractionParams& p) {
  if (p.batch < 0 || p.features < 1 || p.dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": need batch >= 0, features >= 1 and dim >= 1, got ",
                                                   p.batch, ", ", p.features, ", ", p.dim));
  }
  return absl::OkStatus();
}

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

namespace {

// TensorFlow's SAME/VALID padding of one dimension for a (dilated) window k.
Pads TfPads(int in, int k, int stride, Padding padding) {
  if (padding == Padding::kValid) return {0, 0};
  const int out = OutputSize(in, k, stride, padding);
  const int total = std::max(0, (out - 1) * stride + k - in);
  return {total / 2, total - total / 2};
}

// floor((in + pads - k) / stride) + 1, or with ceil_mode the rounded-up count minus a last window that would
// start in the right padding (PyTorch's rule, which ONNX follows).
int WindowCount(int in, Pads pads, int k, int stride, bool ceil_mode) {
  const int span = in + pads.before + pads.after - k;
  if (span < 0) return 0;
  if (!ceil_mode) return span / stride + 1;
  int out = (span + stride - 1) / stride + 1;
  if ((out - 1) * stride >= in + pads.before) --out;
  return out;
}

}  // namespace

Pads Conv2DParams::pads_h() const {
  return explicit_padding ? Pads{pad_top, pad_bottom} : TfPads(in_h, dilated_k_h(), stride_h, padding);
}
Pads Conv2DParams::pads_w() const {
  return explicit_padding ? Pads{pad_left, pad_right} : TfPads(in_w, dilated_k_w(), stride_w, padding);
}
int Conv2DParams::out_h() const {
  if (stride_h < 1) return 0;
  return WindowCount(in_h, pads_h(), dilated_k_h(), stride_h, false);
}
int Conv2DParams::out_w() const {
  if (stride_w < 1) return 0;
  return WindowCount(in_w, pads_w(), dilated_k_w(), stride_w, false);
}

Pads PoolParams::pads_h() const {
  return explicit_padding ? Pads{pad_top, pad_bottom} : TfPads(in_h, kh(), sh(), padding);
}
Pads PoolParams::pads_w() const {
  return explicit_padding ? Pads{pad_left, pad_right} : TfPads(in_w, kw(), sw(), padding);
}
int PoolParams::out_h() const {
  if (sh() < 1) return 0;
  return WindowCount(in_h, pads_h(), kh(), sh(), explicit_padding && ceil_mode);
}
int PoolParams::out_w() const {
  if (sw() < 1) return 0;
  return WindowCount(in_w, pads_w(), kw(), sw(), explicit_padding && ceil_mode);
}
int PoolParams::effective_pad_bottom() const {
  const Pads p = pads_h();
  return std::max(p.after, (out_h() - 1) * sh() + kh() - in_h - p.before);
}
int PoolParams::effective_pad_right() const {
  const Pads p = pads_w();
  return std::max(p.after, (out_w() - 1) * sw() + kw() - in_w - p.before);
}

int64_t BroadcastParams::out_size() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}
int64_t BroadcastParams::a_size() const {
  int64_t last = 0;
  for (int i = 0; i < rank; ++i) last += (dims[i] - 1) * a_strides[i];
  return last + 1;
}
int64_t BroadcastParams::b_size() const {
  int64_t last = 0;
  for (int i = 0; i < rank; ++i) last += (dims[i] - 1) * b_strides[i];
  return last + 1;
}

std::string DeviceSpec::ToString() const {
  return kind == Kind::kCpu ? std::string("cpu") : absl::StrCat("gpu:", gpu_index);
}

absl::StatusOr<ComputeDtype> ParseComputeDtype(const std::string& name) {
  if (name == "fp32") return ComputeDtype::kFp32;
  if (name == "bf16") return ComputeDtype::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("--compute_dtype=", name, ": expected fp32 or bf16"));
}

const char* ComputeDtypeName(ComputeDtype dtype) { return dtype == ComputeDtype::kBf16 ? "bf16" : "fp32"; }

}  // namespace dtrain::kernels
