// Conv2D on cuDNN (legacy convolution API, still present in cuDNN 9).
//
// Layouts: activations are NHWC cuDNN tensors. cuDNN takes filters as KCRS (NCHW) or KRSC (NHWC, i.e.
// [out_c, kh, kw, in_c]); TensorFlow's HWIO is neither, but viewed as a [kh*kw*in_c, out_c] matrix it is the
// transpose of KRSC viewed as [out_c, kh*kw*in_c]. So Forward transposes w into a private KRSC copy (reused by
// BackwardData, as device.h allows), and BackwardWeights computes dw in KRSC and transposes it back to HWIO.
//
// Padding: TensorFlow's SAME puts the odd extra row/column after the data (e.g. stride 2 on an even input),
// which cuDNN's symmetric padding cannot express. When padding is symmetric, cuDNN pads; otherwise the input is
// zero-padded explicitly into a scratch buffer (pad kernel) and cuDNN runs unpadded. BackwardData then computes
// the gradient of the padded input into that scratch and crops it into dx; BackwardWeights re-pads x (so it never
// depends on what BackwardData left in the scratch).
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
  int FilterRows() const { return p_.k_h * p_.k_w * p_.in_c; }  // HWIO as [FilterRows, out_c]
  // The tensor cuDNN convolves: x itself, or x padded into padded_.
  absl::StatusOr<const float*> ConvInput(const float* x, absl::string_view op);

  CudaDevice* dev_;
  Conv2DParams p_;
  int out_h_ = 0, out_w_ = 0, pad_top_ = 0, pad_left_ = 0, padded_h_ = 0, padded_w_ = 0;
  bool explicit_pad_ = false;
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
  pad_top_ = PadBefore(p_.in_h, p_.k_h, p_.stride_h, p_.padding);
  pad_left_ = PadBefore(p_.in_w, p_.k_w, p_.stride_w, p_.padding);
  int total_h = 0, total_w = 0;
  if (p_.padding == Padding::kSame) {
    total_h = std::max(0, (out_h_ - 1) * p_.stride_h + p_.k_h - p_.in_h);
    total_w = std::max(0, (out_w_ - 1) * p_.stride_w + p_.k_w - p_.in_w);
  }
  explicit_pad_ = (total_h != 2 * pad_top_) || (total_w != 2 * pad_left_);
  padded_h_ = p_.in_h + total_h;
  padded_w_ = p_.in_w + total_w;

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
  RETURN_IF_ERROR(CudnnStatus(
      cudnnSetFilter4dDescriptor(fd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, p_.out_c, p_.in_c, p_.k_h, p_.k_w),
      "Conv2D: KRSC filter descriptor"));

  cudnnConvolutionDescriptor_t cd = nullptr;
  RETURN_IF_ERROR(CudnnStatus(cudnnCreateConvolutionDescriptor(&cd), "Conv2D: cudnnCreateConvolutionDescriptor"));
  conv_desc_.reset(cd);
  const int cudnn_pad_h = explicit_pad_ ? 0 : pad_top_, cudnn_pad_w = explicit_pad_ ? 0 : pad_left_;
  RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolution2dDescriptor(cd, cudnn_pad_h, cudnn_pad_w, p_.stride_h,
                                                              p_.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                                              CUDNN_DATA_FLOAT),
                              "Conv2D: cudnnSetConvolution2dDescriptor"));
  RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH), "Conv2D: math type"));

  // cuDNN must agree with TensorFlow's output size, or the padding logic above is wrong.
  int on = 0, oc = 0, oh = 0, ow = 0;
  RETURN_IF_ERROR(CudnnStatus(cudnnGetConvolution2dForwardOutputDim(cd, x_desc_.get(), fd, &on, &oc, &oh, &ow),
                              "Conv2D: cudnnGetConvolution2dForwardOutputDim"));
  if (on != p_.batch || oc != p_.out_c || oh != out_h_ || ow != out_w_) {
    return absl::InternalError(absl::StrCat("Conv2D: cuDNN output ", on, "x", oh, "x", ow, "x", oc,
                                            " differs from TensorFlow's ", p_.batch, "x", out_h_, "x", out_w_,
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

  const int64_t filter = int64_t{FilterRows()} * p_.out_c;
  ASSIGN_OR_RETURN(w_krsc_, DeviceBuffer::AllocateFloats(filter, "Conv2D KRSC filter"));
  ASSIGN_OR_RETURN(dw_krsc_, DeviceBuffer::AllocateFloats(filter, "Conv2D KRSC filter gradient"));
  const int64_t rows = int64_t{p_.batch} * out_h_ * out_w_;
  ASSIGN_OR_RETURN(ones_, DeviceBuffer::AllocateFloats(rows, "Conv2D bias-gradient ones"));
  return CudaStatus(LaunchFill(1.0f, ones_.floats(), rows, dev_->stream()), "Conv2D: fill ones");
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
  cudaStream_t s = dev_->stream();
  RETURN_IF_ERROR(CudaStatus(LaunchTranspose2D(w, w_krsc_.floats(), FilterRows(), p_.out_c, s),
                             "Conv2D::Forward: HWIO->KRSC"));
  ASSIGN_OR_RETURN(const float* in, ConvInput(x, "Conv2D::Forward"));
  const float one = 1.0f, zero = 0.0f;
  RETURN_IF_ERROR(CudnnStatus(cudnnConvolutionForward(dev_->cudnn(), &one, x_desc_.get(), in, w_desc_.get(),
                                                      w_krsc_.get(), conv_desc_.get(), fwd_algo_, workspace_.get(),
                                                      workspace_.bytes(), &zero, y_desc_.get(), y),
                              "Conv2D::Forward: cudnnConvolutionForward"));
  return CudaStatus(LaunchBiasAdd(y, b, int64_t{p_.batch} * out_h_ * out_w_, p_.out_c, s),
                    "Conv2D::Forward: bias add");
}

absl::Status CudaConv2D::BackwardData(const float* dy, const float* w, float* dx) {
  RETURN_IF_ERROR(dev_->Activate("Conv2D::BackwardData"));
  // w_krsc_ already holds `w` reordered by the last Forward (device.h's contract).
  const float one = 1.0f, zero = 0.0f;
  float* out = explicit_pad_ ? padded_.floats() : dx;
  RETURN_IF_ERROR(CudnnStatus(cudnnConvolutionBackwardData(dev_->cudnn(), &one, w_desc_.get(), w_krsc_.get(),
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
  cudaStream_t s = dev_->stream();
  ASSIGN_OR_RETURN(const float* in, ConvInput(x, "Conv2D::BackwardWeights"));
  const float one = 1.0f, zero = 0.0f;
  RETURN_IF_ERROR(CudnnStatus(cudnnConvolutionBackwardFilter(dev_->cudnn(), &one, x_desc_.get(), in,
                                                             y_desc_.get(), dy, conv_desc_.get(), bwd_filter_algo_,
                                                             workspace_.get(), workspace_.bytes(), &zero,
                                                             w_desc_.get(), dw_krsc_.get()),
                              "Conv2D::BackwardWeights: cudnnConvolutionBackwardFilter"));
  RETURN_IF_ERROR(CudaStatus(LaunchTranspose2D(dw_krsc_.floats(), dw, p_.out_c, FilterRows(), s),
                             "Conv2D::BackwardWeights: KRSC->HWIO"));
  // db = dy^T * ones: dy is row-major [rows, out_c], i.e. column-major [out_c, rows].
  const int rows = p_.batch * out_h_ * out_w_;
  return CublasStatus(cublasSgemv(dev_->cublas(), CUBLAS_OP_N, p_.out_c, rows, &one, dy, p_.out_c,
                                  ones_.floats(), 1, &zero, db, 1),
                      "Conv2D::BackwardWeights: bias gradient (cublasSgemv)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Conv2D>> MakeCudaConv2D(CudaDevice* dev, const Conv2DParams& p) {
  if (p.batch <= 0 || p.in_h <= 0 || p.in_w <= 0 || p.in_c <= 0 || p.out_c <= 0 || p.k_h <= 0 || p.k_w <= 0 ||
      p.stride_h <= 0 || p.stride_w <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MakeConv2D: every size must be positive, got batch=", p.batch, " in=", p.in_h, "x", p.in_w, "x", p.in_c,
        " out_c=", p.out_c, " k=", p.k_h, "x", p.k_w, " stride=", p.stride_h, "x", p.stride_w));
  }
  if (p.out_h() <= 0 || p.out_w() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeConv2D: VALID ", p.k_h, "x", p.k_w, " kernel does not fit a ",
                                                   p.in_h, "x", p.in_w, " input"));
  }
  const int64_t rows = int64_t{p.batch} * std::max(p.in_h, p.out_h()) * std::max(p.in_w, p.out_w());
  if (rows * std::max(p.in_c, p.out_c) > INT_MAX) {
    return absl::InvalidArgumentError("MakeConv2D: tensors over 2^31 elements are not supported");
  }
  auto conv = std::make_unique<CudaConv2D>(dev, p);
  RETURN_IF_ERROR(conv->Init());
  return std::unique_ptr<Conv2D>(std::move(conv));
}

}  // namespace dtrain::kernels::cuda
