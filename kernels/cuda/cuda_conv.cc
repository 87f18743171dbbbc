// Conv2D on cuDNN (legacy convolution API, still present in cuDNN 9): strides, dilations and groups (depthwise
// included) through the convolution descriptor (cudnnSetConvolution2dDescriptor, cudnnSetConvolutionGroupCount).
//
// Layouts: activations are NHWC cuDNN tensors. With NHWC activations cuDNN takes the filter as KRSC
// ([out_c, kh, kw, in_c / groups], a CUDNN_TENSOR_NHWC filter descriptor). Neither of the interface's layouts is
// that, but both are a transpose away: TensorFlow's HWIO viewed as a [kh*kw*in_c/groups, out_c] matrix is the
// transpose of KRSC viewed as [out_c, kh*kw*in_c/groups], and ONNX's OIHW is, per output channel, the transpose
// of [kh*kw, in_c/groups] (a batched transpose). So Forward reorders w into a private KRSC copy (reused by
// BackwardData, as device.h allows), and BackwardWeights computes dw in KRSC and reorders it back. When the
// reorder is the identity (HWIO with one output channel; OIHW with one input channel per group, e.g. depthwise,
// or a 1x1 kernel) w and dw are used as they are.
//
// Padding: explicit (ONNX) pads may be asymmetric, and so is TensorFlow's SAME when the total is odd (the extra
// row/column goes after the data); cuDNN's padding is symmetric. When cuDNN, padding `before` on both sides,
// yields exactly the output size the op must have, the windows it computes are the op's (padding is zeros either
// way) and cuDNN pads. Otherwise the input is zero-padded explicitly into a scratch buffer (pad kernel) and cuDNN
// runs unpadded: BackwardData then computes the gradient of the padded input into that scratch and crops it into
// dx; BackwardWeights re-pads x (so it never depends on what BackwardData left in the scratch).
//
// Algorithms: chosen once per op with cudnnFind* (benchmarks the candidates; falls back to the _v7 heuristics if
// Find fails), in full fp32 (CUDNN_FMA_MATH: no TF32 tensor cores, so results match the CPU backend), with a
// single workspace sized for the largest of the three. The bias gradient is a cuBLAS GEMV against a ones vector.
//
// Graph capture: Init (MakeConv2D) does all that allocates, synchronizes or chooses (cudnnFind*, the
// workspace, the filter copies, the ones vector); Forward/BackwardData/BackwardWeights only enqueue kernels,
// cuDNN and cuBLAS calls with those buffers on the device's stream, so a CUDA graph can capture them.
#include <algorithm>
#include <climits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kernel_shapes.h"

namespace dtrain::kernels::cuda {
namespace {

// Workspace above this is not worth it for the small convolutions this project trains.
constexpr size_t kMaxWorkspaceBytes = size_t{512} << 20;

struct TensorDescDeleter {
  void operator()(cudnnTensorStruct* d) const { cudnnDestroyTensorDescriptor(d); }
};
struct FilterDescDeleter {
  void operator()(cudnnFilterStruct* d) const { cudnnDestroyFilterDescriptor(d); }
};
struct ConvDescDeleter {
  void operator()(cudnnConvolutionStruct* d) const { cudnnDestroyConvolutionDescriptor(d); }
};
using TensorDesc = std::unique_ptr<cudnnTensorStruct, TensorDescDeleter>;
using FilterDesc = std::unique_ptr<cudnnFilterStruct, FilterDescDeleter>;
using ConvDesc = std::unique_ptr<cudnnConvolutionStruct, ConvDescDeleter>;

absl::StatusOr<TensorDesc> MakeNhwcTensor(int n, int h, int w, int c) {
  cudnnTensorDescriptor_t d = nullptr;
  RETURN_IF_ERROR(CudnnStatus(cudnnCreateTensorDescriptor(&d), "Conv2D: cudnnCreateTensorDescriptor"));
  TensorDesc desc(d);
  RETURN_IF_ERROR(CudnnStatus(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, n, c, h, w),
                              absl::StrCat("Conv2D: NHWC tensor ", n, "x", h, "x", w, "x", c)));
  return desc;
}

// The first candidate that ran (or is supported), fits the workspace cap and does not use tensor-core math.
template <typename Perf>
absl::StatusOr<Perf> Choose(const std::vector<Perf>& perf, int returned, absl::string_view what) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspaceBytes) continue;
    if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    return p;
  }
  return absl::InternalError(absl::StrCat("Conv2D: cuDNN offers no usable fp32 ", what, " algorithm among ",
                                          returned, " candidates for this shape"));
}

class CudaConv2D final : public Conv2D {
 public:
  CudaConv2D(CudaDevice* dev, const Conv2DParams& p) : dev_(dev), p_(p) {}

  absl::Status Init();
  absl::Status Forward(const float* x, const float* w, const float* b, float* y) override;
  absl::Status BackwardData(const float* dy, const float* w, float* dx) override;
  absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) override;

 private:
  int GroupChannels() const { return p_.in_c / p_.groups; }
  int FilterRows() const { return p_.k_h * p_.k_w * GroupChannels(); }  // HWIO as [FilterRows, out_c]
  // The tensor cuDNN convolves: x itself, or x padded into padded_.
  absl::StatusOr<const float*> ConvInput(const float* x, absl::string_view op);
  // w (the interface's layout) -> KRSC, and back.
  cudaError_t ToKrsc(const float* w, float* krsc) const;
  cudaError_t FromKrsc(const float* krsc, float* w) const;

  CudaDevice* dev_;
  Conv2DParams p_;
  int out_h_ = 0, out_w_ = 0, pad_top_ = 0, pad_left_ = 0, padded_h_ = 0, padded_w_ = 0;
  bool explicit_pad_ = false;
  bool reorder_ = true;  // false: the interface's filter layout already is KRSC in memory
  TensorDesc x_desc_, y_desc_;  // x_desc_ describes the padded input when explicit_pad_
  FilterDesc w_desc_;
  ConvDesc conv_desc_;
  cudnnConvolutionFwdAlgo_t fwd_algo_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo_{};
  DeviceBuffer workspace_, w_krsc_, dw_krsc_, padded_, ones_;
};

absl::Status CudaConv2D::Init() {
  out_h_ = p_.out_h();
  out_w_ = p_.out_w();
  const Pads ph = p_.pads_h(), pw = p_.pads_w();
  pad_top_ = ph.before;
  pad_left_ = pw.before;
  explicit_pad_ = NeedsExplicitPadding(p_);
  padded_h_ = p_.in_h + ph.before + ph.after;
  padded_w_ = p_.in_w + pw.before + pw.after;
  reorder_ = p_.weight_layout == WeightLayout::kHWIO ? !(p_.out_c == 1 || FilterRows() == 1)
                                                     : !(GroupChannels() == 1 || p_.k_h * p_.k_w == 1);

  if (explicit_pad_) {
    ASSIGN_OR_RETURN(x_desc_, MakeNhwcTensor(p_.batch, padded_h_, padded_w_, p_.in_c));
    ASSIGN_OR_RETURN(padded_, DeviceBuffer::AllocateFloats(int64_t{p_.batch} * padded_h_ * padded_w_ * p_.in_c,
                                                           "Conv2D padded input"));
  } else {
    ASSIGN_OR_RETURN(x_desc_, MakeNhwcTensor(p_.batch, p_.in_h, p_.in_w, p_.in_c));
  }
  ASSIGN_OR_RETURN(y_desc_, MakeNhwcTensor(p_.batch, out_h_, out_w_, p_.out_c));

  cudnnFilterDescriptor_t fd = nullptr;
  RETURN_IF_ERROR(CudnnStatus(cudnnCreateFilterDescriptor(&fd), "Conv2D: cudnnCreateFilterDescriptor"));
  w_desc_.reset(fd);
  RETURN_IF_ERROR(CudnnStatus(cudnnSetFilter4dDescriptor(fd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, p_.out_c,
                                                         GroupChannels(), p_.k_h, p_.k_w),
                              "Conv2D: KRSC filter descriptor"));

  cudnnConvolutionDescriptor_t cd = nullptr;
  RETURN_IF_ERROR(CudnnStatus(cudnnCreateConvolutionDescriptor(&cd), "Conv2D: cudnnCreateConvolutionDescriptor"));
  conv_desc_.reset(cd);
  const int cudnn_pad_h = explicit_pad_ ? 0 : pad_top_, cudnn_pad_w = explicit_pad_ ? 0 : pad_left_;
  RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolution2dDescriptor(cd, cudnn_pad_h, cudnn_pad_w, p_.stride_h,
                                                              p_.stride_w, p_.dilation_h, p_.dilation_w,
                                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                              "Conv2D: cudnnSetConvolution2dDescriptor"));
  RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolutionGroupCount(cd, p_.groups), "Conv2D: cudnnSetConvolutionGroupCount"));
  RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH), "Conv2D: math type"));

  // cuDNN must agree with the interface's output size, or the padding logic above is wrong.
  int on = 0, oc = 0, oh = 0, ow = 0;
  RETURN_IF_ERROR(CudnnStatus(cudnnGetConvolution2dForwardOutputDim(cd, x_desc_.get(), fd, &on, &oc, &oh, &ow),
                              "Conv2D: cudnnGetConvolution2dForwardOutputDim"));
  if (on != p_.batch || oc != p_.out_c || oh != out_h_ || ow != out_w_) {
    return absl::InternalError(absl::StrCat("Conv2D: cuDNN output ", on, "x", oh, "x", ow, "x", oc,
                                            " differs from the expected ", p_.batch, "x", out_h_, "x", out_w_,
                                            "x", p_.out_c));
  }

  cudnnHandle_t h = dev_->cudnn();
  {
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    int n = 0;
    if (cudnnFindConvolutionForwardAlgorithm(h, x_desc_.get(), fd, cd, y_desc_.get(), perf.size(), &n,
                                             perf.data()) != CUDNN_STATUS_SUCCESS) {
      RETURN_IF_ERROR(CudnnStatus(cudnnGetConvolutionForwardAlgorithm_v7(h, x_desc_.get(), fd, cd, y_desc_.get(),
                                                                         perf.size(), &n, perf.data()),
                                  "Conv2D: forward algorithm heuristics"));
    }
    ASSIGN_OR_RETURN(auto best, Choose(perf, n, "forward"));
    fwd_algo_ = best.algo;
  }
  {
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    int n = 0;
    if (cudnnFindConvolutionBackwardDataAlgorithm(h, fd, y_desc_.get(), cd, x_desc_.get(), perf.size(), &n,
                                                  perf.data()) != CUDNN_STATUS_SUCCESS) {
      RETURN_IF_ERROR(CudnnStatus(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, fd, y_desc_.get(), cd,
                                                                              x_desc_.get(), perf.size(), &n,
                                                                              perf.data()),
                                  "Conv2D: backward-data algorithm heuristics"));
    }
    ASSIGN_OR_RETURN(auto best, Choose(perf, n, "backward-data"));
    bwd_data_algo_ = best.algo;
  }
  {
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    int n = 0;
    if (cudnnFindConvolutionBackwardFilterAlgorithm(h, x_desc_.get(), y_desc_.get(), cd, fd, perf.size(), &n,
                                                    perf.data()) != CUDNN_STATUS_SUCCESS) {
      RETURN_IF_ERROR(CudnnStatus(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_desc_.get(), y_desc_.get(),
                                                                                cd, fd, perf.size(), &n,
                                                                                perf.data()),
                                  "Conv2D: backward-filter algorithm heuristics"));
    }
    ASSIGN_OR_RETURN(auto best, Choose(perf, n, "backward-filter"));
    bwd_filter_algo_ = best.algo;
  }

  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  RETURN_IF_ERROR(CudnnStatus(
      cudnnGetConvolutionForwardWorkspaceSize(h, x_desc_.get(), fd, cd, y_desc_.get(), fwd_algo_, &fwd_ws),
      "Conv2D: forward workspace size"));
  RETURN_IF_ERROR(CudnnStatus(cudnnGetConvolutionBackwardDataWorkspaceSize(h, fd, y_desc_.get(), cd, x_desc_.get(),
                                                                           bwd_data_algo_, &data_ws),
                              "Conv2D: backward-data workspace size"));
  RETURN_IF_ERROR(CudnnStatus(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                                  h, x_desc_.get(), y_desc_.get(), cd, fd, bwd_filter_algo_, &filter_ws),
                              "Conv2D: backward-filter workspace size"));
  ASSIGN_OR_RETURN(workspace_, DeviceBuffer::Allocate(std::max({fwd_ws, data_ws, filter_ws}), "Conv2D workspace"));

  if (reorder_) {
    ASSIGN_OR_RETURN(w_krsc_, DeviceBuffer::AllocateFloats(p_.weights_size(), "Conv2D KRSC filter"));
    ASSIGN_OR_RETURN(dw_krsc_, DeviceBuffer::AllocateFloats(p_.weights_size(), "Conv2D KRSC filter gradient"));
  }
  if (!p_.has_bias) return absl::OkStatus();
  const int64_t rows = int64_t{p_.batch} * out_h_ * out_w_;
  ASSIGN_OR_RETURN(ones_, DeviceBuffer::AllocateFloats(rows, "Conv2D bias-gradient ones"));
  return CudaStatus(LaunchFill(1.0f, ones_.floats(), rows, dev_->stream()), "Conv2D: fill ones");
}

cudaError_t CudaConv2D::ToKrsc(const float* w, float* krsc) const {
  if (p_.weight_layout == WeightLayout::kHWIO) {
    return LaunchTranspose2D(w, krsc, FilterRows(), p_.out_c, dev_->stream());
  }
  // OIHW: per output channel, [in_c/groups, kh*kw] -> [kh*kw, in_c/groups].
  return LaunchBatchedTranspose(w, krsc, p_.out_c, GroupChannels(), p_.k_h * p_.k_w, dev_->stream());
}

cudaError_t CudaConv2D::FromKrsc(const float* krsc, float* w) const {
  if (p_.weight_layout == WeightLayout::kHWIO) {
    return LaunchTranspose2D(krsc, w, p_.out_c, FilterRows(), dev_->stream());
  }
  return LaunchBatchedTranspose(krsc, w, p_.out_c, p_.k_h * p_.k_w, GroupChannels(), dev_->stream());
}

absl::StatusOr<const float*> CudaConv2D::ConvInput(const float* x, absl::string_view op) {
  if (!explicit_pad_) return x;
  RETURN_IF_ERROR(CudaStatus(LaunchPadNhwc(x, padded_.floats(), p_.batch, p_.in_h, p_.in_w, p_.in_c, pad_top_,
                                           pad_left_, padded_h_, padded_w_, dev_->stream()),
                             absl::StrCat(op, ": pad input")));
  return static_cast<const float*>(padded_.floats());
}

absl::Status CudaConv2D::Forward(const float* x, const float* w, const float* b, float* y) {
  RETURN_IF_ERROR(dev_->Activate("Conv2D::Forward"));
  if (p_.has_bias && b == nullptr) {
    return absl::InvalidArgumentError("Conv2D::Forward: b is null but the op was made with has_bias");
  }
  const float* filter = w;
  if (reorder_) {
    RETURN_IF_ERROR(CudaStatus(ToKrsc(w, w_krsc_.floats()), "Conv2D::Forward: filter -> KRSC"));
    filter = w_krsc_.floats();
  }
  ASSIGN_OR_RETURN(const float* in, ConvInput(x, "Conv2D::Forward"));
  const float one = 1.0f, zero = 0.0f;
  RETURN_IF_ERROR(CudnnStatus(cudnnConvolutionForward(dev_->cudnn(), &one, x_desc_.get(), in, w_desc_.get(),
                                                      filter, conv_desc_.get(), fwd_algo_, workspace_.get(),
                                                      workspace_.bytes(), &zero, y_desc_.get(), y),
                              "Conv2D::Forward: cudnnConvolutionForward"));
  if (!p_.has_bias) return absl::OkStatus();
  return CudaStatus(LaunchBiasAdd(y, b, int64_t{p_.batch} * out_h_ * out_w_, p_.out_c, dev_->stream()),
                    "Conv2D::Forward: bias add");
}

absl::Status CudaConv2D::BackwardData(const float* dy, const float* w, float* dx) {
  RETURN_IF_ERROR(dev_->Activate("Conv2D::BackwardData"));
  // With a reorder, w_krsc_ already holds `w` reordered by the last Forward (device.h's contract).
  const float* filter = reorder_ ? w_krsc_.floats() : w;
  const float one = 1.0f, zero = 0.0f;
  float* out = explicit_pad_ ? padded_.floats() : dx;
  RETURN_IF_ERROR(CudnnStatus(cudnnConvolutionBackwardData(dev_->cudnn(), &one, w_desc_.get(), filter,
                                                           y_desc_.get(), dy, conv_desc_.get(), bwd_data_algo_,
                                                           workspace_.get(), workspace_.bytes(), &zero,
                                                           x_desc_.get(), out),
                              "Conv2D::BackwardData: cudnnConvolutionBackwardData"));
  if (!explicit_pad_) return absl::OkStatus();
  return CudaStatus(LaunchCropNhwc(padded_.floats(), dx, p_.batch, p_.in_h, p_.in_w, p_.in_c, pad_top_, pad_left_,
                                   padded_h_, padded_w_, dev_->stream()),
                    "Conv2D::BackwardData: crop");
}

absl::Status CudaConv2D::BackwardWeights(const float* x, const float* dy, float* dw, float* db) {
  RETURN_IF_ERROR(dev_->Activate("Conv2D::BackwardWeights"));
  ASSIGN_OR_RETURN(const float* in, ConvInput(x, "Conv2D::BackwardWeights"));
  const float one = 1.0f, zero = 0.0f;
  float* filter_grad = reorder_ ? dw_krsc_.floats() : dw;
  RETURN_IF_ERROR(CudnnStatus(cudnnConvolutionBackwardFilter(dev_->cudnn(), &one, x_desc_.get(), in,
                                                             y_desc_.get(), dy, conv_desc_.get(), bwd_filter_algo_,
                                                             workspace_.get(), workspace_.bytes(), &zero,
                                                             w_desc_.get(), filter_grad),
                              "Conv2D::BackwardWeights: cudnnConvolutionBackwardFilter"));
  if (reorder_) {
    RETURN_IF_ERROR(CudaStatus(FromKrsc(dw_krsc_.floats(), dw), "Conv2D::BackwardWeights: KRSC -> filter"));
  }
  if (!p_.has_bias || db == nullptr) return absl::OkStatus();
  // db = dy^T * ones: dy is row-major [rows, out_c], i.e. column-major [out_c, rows].
  const int rows = p_.batch * out_h_ * out_w_;
  return CublasStatus(cublasSgemv(dev_->cublas(), CUBLAS_OP_N, p_.out_c, rows, &one, dy, p_.out_c,
                                  ones_.floats(), 1, &zero, db, 1),
                      "Conv2D::BackwardWeights: bias gradient (cublasSgemv)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Conv2D>> MakeCudaConv2D(CudaDevice* dev, const Conv2DParams& p) {
  if (p.batch <= 0 || p.in_h <= 0 || p.in_w <= 0 || p.in_c <= 0 || p.out_c <= 0 || p.k_h <= 0 || p.k_w <= 0 ||
      p.stride_h <= 0 || p.stride_w <= 0 || p.dilation_h <= 0 || p.dilation_w <= 0 || p.groups <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MakeConv2D: every size must be positive, got batch=", p.batch, " in=", p.in_h, "x", p.in_w, "x", p.in_c,
        " out_c=", p.out_c, " k=", p.k_h, "x", p.k_w, " stride=", p.stride_h, "x", p.stride_w,
        " dilation=", p.dilation_h, "x", p.dilation_w, " groups=", p.groups));
  }
  if (p.in_c % p.groups != 0 || p.out_c % p.groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeConv2D: in_c=", p.in_c, " and out_c=", p.out_c,
                                                   " must be multiples of groups=", p.groups));
  }
  if (p.explicit_padding && (p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("MakeConv2D: negative padding top=", p.pad_top, " bottom=",
                                                   p.pad_bottom, " left=", p.pad_left, " right=", p.pad_right));
  }
  if (p.out_h() <= 0 || p.out_w() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeConv2D: the ", p.dilated_k_h(), "x", p.dilated_k_w(),
                                                   " (dilated) kernel does not fit the padded ", p.in_h, "x",
                                                   p.in_w, " input"));
  }
  const int64_t padded_h = int64_t{p.in_h} + p.pads_h().before + p.pads_h().after;
  const int64_t padded_w = int64_t{p.in_w} + p.pads_w().before + p.pads_w().after;
  const int64_t rows =
      int64_t{p.batch} * std::max<int64_t>(padded_h, p.out_h()) * std::max<int64_t>(padded_w, p.out_w());
  if (rows * std::max(p.in_c, p.out_c) > INT_MAX || p.weights_size() > INT_MAX) {
    return absl::InvalidArgumentError("MakeConv2D: tensors over 2^31 elements are not supported");
  }
  auto conv = std::make_unique<CudaConv2D>(dev, p);
  RETURN_IF_ERROR(conv->Init());
  return std::unique_ptr<Conv2D>(std::move(conv));
}

}  // namespace dtrain::kernels::cuda
